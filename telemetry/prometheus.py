"""The Prometheus adapter: a real Prometheus server (Debian's package) for one run, on
127.0.0.1, storing in the run's directory, started and stopped by PID; and its HTTP API.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import yaml

from telemetry.model import promconfig
from telemetry.model.promconfig import DEFAULT_SCRAPE_INTERVAL_S, scrape_config, server_args
from testbed.errors import TestbedError
from testbed.poll import wait_for
from testbed.linux.files import make_dirs, open_append, write_text_atomic

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


def prometheus_binary() -> str:
    """The ``prometheus`` executable, or a clear error naming what to install."""
    path = shutil.which("prometheus")
    if path is None:
        raise TestbedError("telemetry needs Prometheus: 'apt-get install prometheus' "
                           "(scripts/setup.sh installs it)")
    return path


class Prometheus:
    """A Prometheus server scraping ``targets`` into ``directory/data`` (a context manager).

    Args:
        directory: where its configuration, data and log go (the run directory's
            ``prometheus/``).
        targets: job -> exporters' ``host:port``; empty serves the stored data only.
        interval_s: the scrape interval.
        labels: labels on every series of the run (``experiment``, ``variant``).
        port: the port (0: a free one).
        track: called with the server's PID once it runs (the fabric's registry records it,
            so ``fabriclab clean`` can stop it after a crash).
        config: a whole ``prometheus.yml`` instead of one made from ``targets`` (the standing
            configuration of :func:`telemetry.model.promconfig.standing_config`).
    """

    def __init__(self, directory: Path, targets: dict[str, list[str]],
                 interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
                 labels: dict[str, str] | None = None, port: int = 0, track=None,
                 config: dict | None = None) -> None:
        self.directory = Path(directory)
        self.config = config
        self.targets, self.interval_s, self.labels = targets, interval_s, labels or {}
        self.port = port
        self.track = track
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def __enter__(self) -> Prometheus:
        binary = prometheus_binary()
        make_dirs(self.directory)
        config = self.directory / "prometheus.yml"
        doc = self.config or scrape_config(self.targets, self.interval_s, self.labels)
        write_text_atomic(config, yaml.safe_dump(doc, sort_keys=False))
        log = open_append(self.directory / "prometheus.log")  # the child's
        self._log_from = log.tell()  # this start's lines (the log is appended across starts)
        try:  # port 0: Prometheus binds one of the OS's and says which (no window between)
            self.process = subprocess.Popen(
                server_args(binary, config, self.directory / "data", f"{LOOPBACK}:{self.port}"),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()
        if self.track is not None:
            self.track(self.process.pid)
        try:
            wait_for(self._ready, START_TIMEOUT_S, f"Prometheus to answer on {self.url}")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _ready(self) -> bool:
        if not self.port:
            log = (self.directory / "prometheus.log").read_bytes()[self._log_from:]
            self.port = promconfig.listening_port(log.decode(errors="replace")) or 0
        if self.process.poll() is not None:
            tail = (self.directory / "prometheus.log").read_text(errors="replace")[-2000:]
            raise TestbedError(f"Prometheus exited with code {self.process.returncode}",
                               stderr=tail)
        if not self.port:
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGTERM (Prometheus flushes and exits), SIGKILL after a grace period."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    # -- the HTTP API ------------------------------------------------------------------------
    def api(self, path: str, **params) -> dict:
        """GET ``/api/v1/<path>``; the ``data`` of a successful answer."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            doc = json.load(resp)
        if doc.get("status") != "success":
            raise TestbedError(f"Prometheus query {path} {params} failed: {doc}")
        return doc["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query's result vector."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)["result"]

    def scraped_after(self, moment: float, skip: frozenset[str] = frozenset()) -> bool:
        """Whether every target (but those of ``skip``, by scrape URL) was scraped after
        ``moment`` (Unix time); False while Prometheus lists none (it applies its targets a
        few seconds after it starts)."""
        targets = [t for t in self.api("targets")["activeTargets"]
                   if t["scrapeUrl"] not in skip]
        return bool(targets) and all(
            t["health"] == "up" and _timestamp(t["lastScrape"]) > moment for t in targets)

    def ended(self) -> str | None:
        """How the server ended, when it did on its own (None: still up, or stopped by us)."""
        proc = self.process
        if proc is None or proc.poll() is None:
            return None
        code = proc.returncode
        how = (f"killed by {signal.Signals(-code).name}" if code < 0 and -code in
               signal.valid_signals() else f"exited with code {code}")
        return f"Prometheus {how} during the run (its data stops there; see " \
               f"{self.directory / 'prometheus.log'})"

    def wait_scraped(self, timeout_s: float | None = None) -> None:
        """Wait until every target has been scraped once more from now (the last counters
        are in the data before the run stops it); one that is down now (an exporter that
        ended: a restarted controller's predecessor) is not waited for."""
        moment = time.time()
        down = frozenset(t["scrapeUrl"] for t in self.api("targets")["activeTargets"]
                         if t["health"] == "down")
        wait_for(lambda: self.scraped_after(moment, down),
                 timeout_s or max(10.0, 5 * self.interval_s), "a last scrape of every target")


def _timestamp(rfc3339: str) -> float:
    """Prometheus's ``lastScrape`` (``2026-11-30T17:01:02.123456789Z``) as Unix time."""
    match = re.fullmatch(r"(.+T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", rfc3339)
    if match is None:
        raise TestbedError(f"Prometheus answered an unexpected time {rfc3339!r}")
    base, frac, zone = match.groups()
    frac = (frac or "")[:7]  # microseconds at most
    return datetime.fromisoformat(base + frac + ("+00:00" if zone == "Z" else zone)).timestamp()
