"""The CLI's telemetry pieces: ``--telemetry`` / ``--keep`` / ``--scrape-interval`` of ``up`` and
``run``, and ``fabriclab telemetry DIR`` (a run's stored Prometheus data served again)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from fabriclab.run import TelemetryOptions
from telemetry.promconfig import DEFAULT_SCRAPE_INTERVAL_S
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


def options(args, console: Console, variant: str | None = None) -> TelemetryOptions | None:
    """The run's telemetry from the command line (None without ``--telemetry``)."""
    if args.scrape_interval <= 0:
        raise ConfigError("--scrape-interval", f"must be > 0, got {args.scrape_interval}")
    if args.keep and not args.telemetry:
        raise ConfigError("--keep", "needs --telemetry")
    if not args.telemetry:
        return None
    return TelemetryOptions(args.scrape_interval, keep_until_interrupted(console)
                            if args.keep else None, variant)


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


def cmd_telemetry(args) -> int:
    """Serve a finished run's Prometheus data again until Ctrl-C."""
    from fabriclab.cli import Terminated
    from telemetry.prometheus import Prometheus

    source = prometheus_dir(Path(args.dir))
    with Prometheus(source, {}, port=args.port) as prom:
        args.console.print(f"Prometheus serving {source / 'data'} at {prom.url} "
                           f"(Ctrl-C stops it)")
        grafana = None
        if args.grafana:
            from telemetry.grafana import start_grafana

            try:
                grafana = start_grafana(prom.port)
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
