"""``fabriclab telemetry DIR`` (a finished run's Prometheus data served again, Grafana on
request), ``fabriclab top`` (a running fabric, live), and the ``--keep`` hook of ``up`` and
``run``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from fabriclab.cli.output import EXIT_OK
from fabriclab.cli.requests import ServeRequest, TopRequest
from fabriclab.signals import Terminated, wait_until_stopped
from telemetry import dashboards
from telemetry.exporter import TELEMETRY_FILE
from telemetry.model import top as topview
from telemetry.model.promconfig import DEFAULT_SCRAPE_INTERVAL_S, scrape_interval_of
from telemetry.prometheus import Prometheus
from testbed.errors import ConfigError, TestbedError
from testbed.linux.files import write_text_atomic
from testbed.runs.registry import Registry


def keep_until_stopped(console: Console) -> Callable[[object], None]:
    """A ``keep`` hook (:class:`fabriclab.options.TelemetryOptions`): print where to look,
    wait for Ctrl-C (or SIGTERM), return (the teardown follows)."""

    def keep(tele) -> None:
        console.print(f"workload done; fabric and telemetry stay up: Prometheus "
                      f"{tele.prometheus.url}; Ctrl-C tears down")
        wait_until_stopped()
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
    config = source / "prometheus.yml"
    if not config.is_file():
        return DEFAULT_SCRAPE_INTERVAL_S
    try:
        return scrape_interval_of(yaml.safe_load(config.read_text()))
    except (ValueError, yaml.YAMLError) as err:
        raise ConfigError("DIR", f"{config}: {err}") from None


def serve(req: ServeRequest, ui: Console) -> int:
    """Serve a finished run's Prometheus data again until Ctrl-C."""
    source = prometheus_dir(req.dir)
    interval = _scrape_interval(source)
    with Prometheus(source, {}, interval, port=req.port) as prom:
        ui.print(f"Prometheus serving {source / 'data'} at {prom.url} (Ctrl-C stops it)")
        start, end = _data_range(prom)
        _say_graph_links(prom, source, interval, (start, end), ui)
        grafana = None
        if req.grafana:
            from telemetry.grafana import (
                start_grafana,  # the Docker SDK: the grafana extra
            )

            try:
                grafana = start_grafana(prom.port, scrape_interval_s=interval,
                                        password_dir=source)
            except TestbedError as err:  # Prometheus keeps serving without it
                ui.print(f"[yellow]Grafana not started:[/yellow] {escape(str(err))}")
            else:
                ui.print(f"Grafana at {grafana.url} (anonymous: view; admin password, shown "
                         f"once: {grafana.admin_password}, kept 0600 in "
                         f"{source / 'grafana-admin-password'})")
                for title, url in dashboards.grafana_links(grafana.url, start, end).items():
                    ui.print(f"  {title}: {url}", soft_wrap=True)
        try:
            wait_until_stopped()
        finally:
            if grafana is not None:
                grafana.stop()
    return EXIT_OK


def _data_range(prom: Prometheus) -> tuple[float, float]:
    """The time range the served data covers (Unix seconds; the last hour where it says
    none)."""
    head = prom.api("status/tsdb").get("headStats", {})
    start_ms, end_ms = head.get("minTime", 0), head.get("maxTime", 0)
    end = end_ms / 1000 if 0 < end_ms < 1e15 else time.time()
    start = start_ms / 1000 if 0 < start_ms <= end_ms else end - 3600
    return start, end


def _say_graph_links(prom: Prometheus, source: Path, interval_s: float,
                     span: tuple[float, float], ui: Console) -> None:
    """The dashboards' panels as links into this Prometheus's graph page, over the data's time
    range: one per dashboard on the console, every panel's in ``DIR/dashboards.html``."""
    start, end = span
    links = dashboards.graph_links(prom.url, start, end, f"{4 * interval_s:g}s")
    page = source / "dashboards.html"
    write_text_atomic(page, dashboards.links_page(links, f"fabriclab: {source.parent.name}"))
    ui.print(f"the dashboards' panels in Prometheus's graph page: {page}")
    for board, (url, panels) in links.items():
        ui.print(f"  {board} ({len(panels)} panels): {url}", soft_wrap=True)


def top(req: TopRequest, ui: Console) -> int:
    """A refreshing view of a running fabric's busiest links and its collectives."""
    if req.interval_s <= 0:
        raise ConfigError("--interval", f"must be > 0, got {req.interval_s}")
    record = Registry(req.state_dir).running(req.run)
    try:
        target = json.loads((Path(record.run_dir) / TELEMETRY_FILE).read_text())[
            "targets"]["fabric"][0]
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise TestbedError(f"run {record.run_id} has no exporter on record ({err})") from err

    def scrape() -> tuple[float, topview.Samples]:
        try:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as resp:
                return time.monotonic(), topview.parse(resp.read().decode())
        except (urllib.error.URLError, OSError) as err:
            raise TestbedError(f"the fabric's exporter {target} does not answer: {err}") \
                from err

    title = f"fabriclab top: run {record.run_id} ({target}), every {req.interval_s:g} s"
    last_t, last = scrape()
    if req.once:
        time.sleep(req.interval_s)
        now_t, now = scrape()
        ui.print(topview.render(topview.frame(last, now, now_t - last_t, time.time()),
                                req.links, title))
        return EXIT_OK
    try:
        with Live(console=ui, auto_refresh=False) as live:
            while True:
                time.sleep(req.interval_s)
                now_t, now = scrape()
                live.update(topview.render(topview.frame(last, now, now_t - last_t,
                                                         time.time()), req.links, title),
                            refresh=True)
                last_t, last = now_t, now
    except (KeyboardInterrupt, Terminated):
        pass
    return EXIT_OK
