"""``fabriclab-rsh HOST COMMAND...``: a remote shell into a host of the fabric, for launchers
that start their daemons on other nodes through one (Open MPI's ``plm_rsh_agent``, MPICH
Hydra's ``HYDRA_LAUNCHER_EXEC``), with no sshd: it enters the named host (its network, mount
and UTS namespaces) and runs the command there with ``sh -c``, as ssh runs a remote
command (its arguments joined by spaces). ssh's options before the host are skipped.

The hosts' processes are in the JSON file ``FABRICLAB_HOSTS_FILE`` names (host -> the PID of
its namespaces' process), which fabriclab writes for a program's ranks and sets in their
environment, with ``OMPI_MCA_plm_rsh_agent``, ``HYDRA_LAUNCHER`` and ``HYDRA_LAUNCHER_EXEC``
pointing here (:mod:`fabriclab.programs`).
"""

from __future__ import annotations

import json
import os
import sys

from testbed.model.topology import hostname

#: ssh options that take a value (skipped with it)
_WITH_VALUE = set("bcDEeFIiJLlmOopQRSWw")
EXIT_FAILED = 255  # what ssh exits with when it cannot connect


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    while args and args[0].startswith("-") and args[0] != "--":
        option = args.pop(0)
        if len(option) == 2 and option[1] in _WITH_VALUE and args:
            args.pop(0)
    if args[:1] == ["--"]:
        args.pop(0)
    if len(args) < 2:
        print("usage: fabriclab-rsh HOST COMMAND...", file=sys.stderr)
        return EXIT_FAILED
    host, command = args[0], " ".join(args[1:])
    where = os.environ.get("FABRICLAB_HOSTS_FILE")
    if not where:
        print("fabriclab-rsh: FABRICLAB_HOSTS_FILE is not set (fabriclab sets it for a "
              "program's ranks)", file=sys.stderr)
        return EXIT_FAILED
    try:
        with open(where, encoding="utf-8") as fh:
            pids = json.load(fh)
    except (OSError, ValueError) as err:
        print(f"fabriclab-rsh: cannot read {where}: {err}", file=sys.stderr)
        return EXIT_FAILED
    host = host.split("@")[-1]  # user@host
    pid = pids.get(host, {hostname(h): p for h, p in pids.items()}.get(host))
    if pid is None:
        print(f"fabriclab-rsh: no host {host!r} in this fabric", file=sys.stderr)
        return EXIT_FAILED
    os.execvp("nsenter", ["nsenter", "-t", str(pid), "-n", "-m", "-u", "--", "sh", "-c",
                          command])
    return EXIT_FAILED  # not reached


if __name__ == "__main__":
    sys.exit(main())
