"""The CLI's telemetry pieces: ``--telemetry`` / ``--keep`` / ``--scrape-interval`` of ``up`` and
``run``, and ``fabriclab telemetry DIR`` (a run's stored Prometheus data served again)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from fabriclab.run import TelemetryOptions
from telemetry.exporter import LOOPBACK
from telemetry.model.promconfig import DEFAULT_SCRAPE_INTERVAL_S
from testbed.errors import ConfigError, TestbedError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--telemetry``, ``--scrape-interval``, ``--keep``."""
    p.add_argument("--telemetry", action="store_true",
                   help="run a Prometheus (127.0.0.1) scraping the fabric's, the workload's and "
                        "the controller's exporters, storing in the output directory")
    p.add_argument("--scrape-interval", type=float, default=DEFAULT_SCRAPE_INTERVAL_S,
                   metavar="S", help="seconds between scrapes (default %(default)s)")
    p.add_argument("--keep", action="store_true",
                   help="with --telemetry: after the workload, keep fabric and telemetry up "
                        "until Ctrl-C")
    p.add_argument("--exporter", default=f"{LOOPBACK}:0", metavar="HOST:PORT",
                   help="where the fabric's exporter listens (default %(default)s: loopback, "
                        "a port from the OS)")


def options(args, console: Console, variant: str | None = None) -> TelemetryOptions:
    """The run's telemetry from the command line."""
    if args.scrape_interval <= 0:
        raise ConfigError("--scrape-interval", f"must be > 0, got {args.scrape_interval}")
    if getattr(args, "keep", False) and not args.telemetry:
        raise ConfigError("--keep", "needs --telemetry")
    host, _, port = args.exporter.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError("--exporter", f"give HOST:PORT (port 0..65535), got {args.exporter!r}")
    return TelemetryOptions(args.telemetry, args.scrape_interval,
                            keep_until_interrupted(console) if getattr(args, "keep", False)
                            else None, variant, host, int(port))


def keep_until_interrupted(console: Console):
    """A ``keep`` hook: print where to look, wait for Ctrl-C (or SIGTERM), return."""
    from fabriclab.cli import Terminated

    def keep(tele) -> None:
        console.print(f"workload done; fabric and telemetry stay up: Prometheus "
                      f"{tele.prometheus.url}; Ctrl-C tears down")
        try:
            while True:
                time.sleep(3600)
        except (KeyboardInterrupt, Terminated):
            console.print("tearing down on request")

    return keep


def prometheus_dir(directory: Path) -> Path:
    """A run's Prometheus directory: ``DIR/prometheus``, or ``DIR`` itself; the variants' of a
    run with variants are ``DIR/<variant>/prometheus`` (name one)."""
    for candidate in (directory / "prometheus", directory):
        if (candidate / "data").is_dir():
            return candidate
    variants = sorted(p.parent.name for p in directory.glob("*/prometheus/data"))
    hint = f" (variants: {', '.join(variants)}; give DIR/<variant>)" if variants else ""
    raise ConfigError("DIR", f"no Prometheus data under {directory}{hint}")


def _scrape_interval(source: Path) -> float:
    """How often the run's Prometheus scraped (its ``prometheus.yml``; 1 s without one)."""
    import yaml

    from telemetry.model.promconfig import DEFAULT_SCRAPE_INTERVAL_S, scrape_interval_of

    config = source / "prometheus.yml"
    if not config.is_file():
        return DEFAULT_SCRAPE_INTERVAL_S
    try:
        return scrape_interval_of(yaml.safe_load(config.read_text()))
    except (ValueError, yaml.YAMLError) as err:
        raise ConfigError("DIR", f"{config}: {err}") from None


def cmd_telemetry(args) -> int:
    """Serve a finished run's Prometheus data again until Ctrl-C."""
    from fabriclab.cli import Terminated
    from telemetry.prometheus import Prometheus

    source = prometheus_dir(Path(args.dir))
    interval = _scrape_interval(source)
    with Prometheus(source, {}, interval, port=args.port) as prom:
        args.console.print(f"Prometheus serving {source / 'data'} at {prom.url} "
                           f"(Ctrl-C stops it)")
        grafana = None
        if args.grafana:
            from telemetry.grafana import start_grafana

            try:
                grafana = start_grafana(prom.port, scrape_interval_s=interval)
            except TestbedError as err:  # Prometheus keeps serving without it
                args.console.print(f"[yellow]Grafana not started:[/yellow] {err}")
            else:
                args.console.print(f"Grafana at {grafana.url}")
        try:
            while True:
                time.sleep(3600)
        except (KeyboardInterrupt, Terminated):
            pass
        finally:
            if grafana is not None:
                grafana.stop()
    return 0


def add_command(command) -> None:
    """Register ``fabriclab telemetry DIR``."""
    p = command("telemetry", cmd_telemetry, "serve a finished run's Prometheus data again",
                json_flag=False)
    p.add_argument("dir", help="the run's output directory (or a variant's)")
    p.add_argument("--port", type=int, default=0, help="Prometheus's port (default: a free one)")
    p.add_argument("--grafana", action="store_true",
                   help="also start Grafana (Docker) with the repository's dashboards")


def cmd_top(args) -> int:
    """A refreshing view of a running fabric's busiest links and its collectives."""
    import json
    import urllib.error
    import urllib.request

    from rich.live import Live

    from fabriclab.cli import Terminated
    from telemetry.model import top
    from telemetry.exporter import TELEMETRY_FILE
    from testbed.runs.registry import Registry

    if args.interval <= 0:
        raise ConfigError("--interval", f"must be > 0, got {args.interval}")
    record = Registry(args.state_dir).running(args.run)
    try:
        target = json.loads((Path(record.run_dir) / TELEMETRY_FILE).read_text())[
            "targets"]["fabric"][0]
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise TestbedError(f"run {record.run_id} has no exporter on record ({err})") from err

    def scrape() -> tuple[float, top.Samples]:
        try:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as resp:
                return time.monotonic(), top.parse(resp.read().decode())
        except (urllib.error.URLError, OSError) as err:
            raise TestbedError(f"the fabric's exporter {target} does not answer: {err}") \
                from err

    title = f"fabriclab top: run {record.run_id} ({target}), every {args.interval:g} s"
    last_t, last = scrape()
    if args.once:
        time.sleep(args.interval)
        now_t, now = scrape()
        args.console.print(top.render(top.frame(last, now, now_t - last_t, time.time()),
                                      args.links, title))
        return 0
    try:
        with Live(console=args.console, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                now_t, now = scrape()
                live.update(top.render(top.frame(last, now, now_t - last_t, time.time()),
                                       args.links, title), refresh=True)
                last_t, last = now_t, now
    except (KeyboardInterrupt, Terminated):
        pass
    return 0


def add_top_command(command) -> None:
    """Register ``fabriclab top``."""
    p = command("top", cmd_top, "watch a running fabric: busiest links per tier, queues, "
                                "marks, pauses, drops, and the collectives", json_flag=False)
    p.add_argument("--run", help="the run id, when several fabrics are up")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes (default %(default)s)")
    p.add_argument("--links", type=int, default=4, help="links shown per tier (default 4)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
