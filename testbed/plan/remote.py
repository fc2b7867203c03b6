"""What a cluster machine's actor agrees to run for the coordinator (pure): the processes a
fabric's own plan starts on hosts, and nothing else. Anyone who can reach a Ray cluster can
call its actors, and the actors run as root; so an argv is accepted only when its program is
one of the project's agents (by module, run by the actor's own interpreter) or one of the
tools the plan uses, and no argument is a path (no ``/``) or longer than a plan writes."""

from __future__ import annotations

import re

from testbed.errors import TestbedError

#: the Python modules run on hosts (``python -m MODULE ...``)
MODULES = frozenset({"traffic.agents.agent", "traffic.agents.udpflow", "traffic.agents.probe"})
#: the other programs run on hosts
PROGRAMS = frozenset({"iperf3", "ss", "fping"})
PYTHON = re.compile(r"python(3(\.\d+)?)?")
MAX_ARGS, MAX_ARG = 64, 256


def checked_argv(argv: object, python: str) -> list[str]:
    """``argv`` as the actor runs it (a Python module's interpreter replaced by ``python``).

    Raises:
        TestbedError: naming what is refused.
    """
    if not isinstance(argv, (list, tuple)) or not argv or len(argv) > MAX_ARGS \
            or not all(isinstance(a, str) for a in argv):
        raise TestbedError(f"refused to run {argv!r}: not a list of at most {MAX_ARGS} strings")
    program, args = argv[0], list(argv[1:])
    if PYTHON.fullmatch(program.rsplit("/", 1)[-1]):
        if len(args) < 2 or args[0] != "-m" or args[1] not in MODULES:
            raise TestbedError(f"refused to run {argv[:3]!r}: only the modules "
                               f"{', '.join(sorted(MODULES))} run by Python")
        program = python
    elif program not in PROGRAMS:
        raise TestbedError(f"refused to run {program!r}: not one of "
                           f"{', '.join(sorted(PROGRAMS))} or a fabriclab agent")
    for arg in args:
        if "/" in arg or "\0" in arg or len(arg) > MAX_ARG or arg in (".", ".."):
            raise TestbedError(f"refused to run {program.rsplit('/', 1)[-1]} with the argument "
                               f"{arg[:80]!r}: paths and long arguments are not in a plan")
    return [program, *args]
