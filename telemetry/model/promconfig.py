"""Pure Prometheus settings: the scrape configuration of a run and the server's command line."""

from __future__ import annotations

import re

from pathlib import Path

DEFAULT_SCRAPE_INTERVAL_S = 1.0
#: the shortest scrape interval: an exporter reads the fabric at most this often (a scrape
#: sooner is answered from its last reading)
MIN_SCRAPE_INTERVAL_S = 0.5
#: where exporters listen unless told otherwise
LOOPBACK = "127.0.0.1"
#: A run's data stays as long as its directory does.
RETENTION = "10y"


def scrape_config(targets: dict[str, list[str]], interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
                  labels: dict[str, str] | None = None) -> dict:
    """A ``prometheus.yml`` scraping each job's targets every ``interval_s``.

    Args:
        targets: job name (``fabric``, ``controller``) -> ``host:port`` of its exporters.
        interval_s: the scrape interval (also the evaluation interval).
        labels: labels every series of the run carries (``experiment``, ``variant``).

    Raises:
        ValueError: an interval that is not positive.
    """
    if interval_s <= 0:
        raise ValueError(f"scrape interval must be > 0, got {interval_s}")
    interval = _duration(interval_s)
    glob = {"scrape_interval": interval, "evaluation_interval": interval,
            "scrape_timeout": _duration(min(interval_s, 10.0) * 0.9)}
    if labels:
        glob["external_labels"] = dict(labels)
    return {"global": glob,
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(hosts),
                                                      "labels": dict(labels or {})}]}
                for job, hosts in sorted(targets.items()) if hosts]}


def _duration(seconds: float) -> str:
    """Prometheus's duration syntax, in milliseconds (``1000ms``)."""
    return f"{max(1, round(seconds * 1000))}ms"


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def scrape_interval_of(doc: dict | None) -> float:
    """The global scrape interval of a ``prometheus.yml`` (Prometheus's default, 1 m, when it
    names none; this module writes ``<n>ms``), in seconds.

    Raises:
        ValueError: an interval in another syntax.
    """
    text = str(((doc or {}).get("global") or {}).get("scrape_interval", "1m"))
    for unit in ("ms", "s", "m", "h"):  # "ms" before "s" and "m"
        number = text.removesuffix(unit)
        if number != text and number.replace(".", "", 1).isdigit():
            return float(number) * _UNITS[unit]
    raise ValueError(f"scrape_interval: {text!r} is not a duration like 1000ms or 5s")


def server_args(binary: str, config: Path, data_dir: Path, listen: str) -> list[str]:
    """The command line of a Prometheus that stores in ``data_dir`` and serves on ``listen``
    (``127.0.0.1:PORT``), without the lifecycle and admin APIs (nobody may stop it or delete
    its data over HTTP; SIGTERM flushes it at the end of a run)."""
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
            f"--storage.tsdb.retention.time={RETENTION}", f"--web.listen-address={listen}",
            "--log.level=info"]  # (info: the port it chose, on port 0)


#: Where a standing Prometheus (the lab VM's service on 9090) discovers the exporters of every
#: fabric that is up: each run writes ``<run id>.<job>.json`` there while it runs, when the
#: folder exists (the lab's provisioning makes it).
DISCOVERY_DIR = Path("/var/lib/fabriclab/prometheus-sd")
DISCOVERY_JOBS = ("fabric", "controller")


def discovery_groups(hosts: list[str], labels: dict[str, str]) -> list[dict]:
    """The content of one discovery file (Prometheus's ``file_sd`` format): the exporters
    ``hosts`` with the run's ``labels``."""
    return [{"targets": list(hosts), "labels": dict(labels)}]


#: What ``systemd-detect-virt`` names a machine whose CPU is emulated instruction by
#: instruction (QEMU without KVM): there a k=4 fabric's exporter answers a scrape in 0.5-1.4 s
#: (46 ms on this host), past a 1 s interval's timeout.
EMULATED_VIRT = frozenset({"qemu", "bochs"})
EMULATED_SCRAPE_INTERVAL_S = 5.0


def standing_interval(virt: str) -> float:
    """A standing Prometheus's scrape interval on a machine ``systemd-detect-virt`` calls
    ``virt``: 5 s where the CPU is emulated, else 1 s, as runs scrape."""
    return EMULATED_SCRAPE_INTERVAL_S if virt.strip() in EMULATED_VIRT \
        else DEFAULT_SCRAPE_INTERVAL_S


def grafana_interval(interval_s: float) -> str:
    """The datasource's ``timeInterval`` for a scrape interval (Grafana's ``$__rate_interval``
    spans four of them): ``1s``, ``5s``, ``1500ms``."""
    ms = max(1, round(interval_s * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def standing_config(discovery_dir: Path = DISCOVERY_DIR,
                    interval_s: float = DEFAULT_SCRAPE_INTERVAL_S) -> dict:
    """A ``prometheus.yml`` for a long-lived Prometheus that scrapes whichever fabrics are up:
    one job per exporter kind (``fabric``, ``controller``, as in a run's own configuration),
    targets from the files runs write into ``discovery_dir``. A scrape may take the whole
    interval (up to 10 s): a slow machine's exporter is late, not down."""
    if interval_s <= 0:
        raise ValueError(f"scrape interval must be > 0, got {interval_s}")
    interval = _duration(interval_s)
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": _duration(min(interval_s, 10.0))},
            "scrape_configs": [
                {"job_name": job,
                 "file_sd_configs": [{"files": [str(Path(discovery_dir) / f"*.{job}.json")],
                                      "refresh_interval": "5s"}]}
                for job in DISCOVERY_JOBS]}


USAGE = ("usage: python -m telemetry.model.promconfig standing [DISCOVERY_DIR] [--virt NAME]\n"
         "       python -m telemetry.model.promconfig grafana-interval [--virt NAME]")


def main(argv: list[str] | None = None) -> int:
    """``standing [DIR] [--virt NAME]``: print the standing configuration for a machine that
    ``systemd-detect-virt`` calls NAME; ``grafana-interval [--virt NAME]``: print the
    datasource's ``timeInterval`` that goes with it."""
    import sys

    import yaml

    args = list(sys.argv[1:] if argv is None else argv)
    virt = "none"
    if "--virt" in args:
        i = args.index("--virt")
        if i + 1 >= len(args):
            print(USAGE, file=sys.stderr)
            return 2
        virt = args[i + 1]
        del args[i:i + 2]
    interval = standing_interval(virt)
    if args[:1] == ["standing"] and len(args) <= 2:
        directory = Path(args[1]) if len(args) > 1 else DISCOVERY_DIR
        print(yaml.safe_dump(standing_config(directory, interval), sort_keys=False), end="")
        return 0
    if args == ["grafana-interval"]:
        print(grafana_interval(interval))
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())


_LISTENING = re.compile(r'msg="Listening on" address=\S*:(\d+)')


def listening_port(log: str) -> int | None:
    """The port a Prometheus started on port 0 listens on, from its log (``msg="Listening
    on" address=127.0.0.1:40257``); None until it says."""
    found = _LISTENING.search(log)
    return int(found.group(1)) if found and 0 < int(found.group(1)) < 65536 else None
