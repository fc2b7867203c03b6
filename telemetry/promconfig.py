"""Pure Prometheus settings: the scrape configuration of a run and the server's command line."""

from __future__ import annotations

from pathlib import Path

DEFAULT_SCRAPE_INTERVAL_S = 1.0
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


def server_args(binary: str, config: Path, data_dir: Path, listen: str) -> list[str]:
    """The command line of a Prometheus that stores in ``data_dir`` and serves on ``listen``
    (``127.0.0.1:PORT``); with the lifecycle API on, so a run can flush it before stopping."""
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
            f"--storage.tsdb.retention.time={RETENTION}", f"--web.listen-address={listen}",
            "--web.enable-lifecycle", "--log.level=warn"]


#: Where a standing Prometheus (the lab VM's service on 9090) discovers the exporters of every
#: fabric that is up: each run writes ``<run id>.<job>.json`` there while it runs, when the
#: folder exists (the lab's provisioning makes it).
DISCOVERY_DIR = Path("/var/lib/fabriclab/prometheus-sd")
DISCOVERY_JOBS = ("fabric", "controller")


def discovery_groups(hosts: list[str], labels: dict[str, str]) -> list[dict]:
    """The content of one discovery file (Prometheus's ``file_sd`` format): the exporters
    ``hosts`` with the run's ``labels``."""
    return [{"targets": list(hosts), "labels": dict(labels)}]


def standing_config(discovery_dir: Path = DISCOVERY_DIR,
                    interval_s: float = DEFAULT_SCRAPE_INTERVAL_S) -> dict:
    """A ``prometheus.yml`` for a long-lived Prometheus that scrapes whichever fabrics are up:
    one job per exporter kind (``fabric``, ``controller``, as in a run's own configuration),
    targets from the files runs write into ``discovery_dir``."""
    if interval_s <= 0:
        raise ValueError(f"scrape interval must be > 0, got {interval_s}")
    interval = _duration(interval_s)
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": _duration(min(interval_s, 10.0) * 0.9)},
            "scrape_configs": [
                {"job_name": job,
                 "file_sd_configs": [{"files": [str(Path(discovery_dir) / f"*.{job}.json")],
                                      "refresh_interval": "5s"}]}
                for job in DISCOVERY_JOBS]}


def main(argv: list[str] | None = None) -> int:
    """``python -m telemetry.promconfig standing [DIR]``: print the standing configuration."""
    import sys

    import yaml

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "standing" or len(args) > 2:
        print("usage: python -m telemetry.promconfig standing [DISCOVERY_DIR]", file=sys.stderr)
        return 2
    directory = Path(args[1]) if len(args) > 1 else DISCOVERY_DIR
    print(yaml.safe_dump(standing_config(directory), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
