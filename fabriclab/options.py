"""What a command asks of the experiment layer, typed: :class:`RunRequest` (``fabriclab run``)
and :class:`TelemetryOptions` (``--telemetry`` and friends). Built once from the command line
by :mod:`fabriclab.cli`; everything below reads these fields, never the argument parser's
namespace. Imports nothing heavy: the CLI builds these before it knows which command runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry.model.promconfig import DEFAULT_SCRAPE_INTERVAL_S, LOOPBACK, MIN_SCRAPE_INTERVAL_S
from testbed.errors import ConfigError
from testbed.paths import DEFAULT_STATE_DIR


@dataclass(frozen=True)
class TelemetryOptions:
    """The run's telemetry. The exporters always run, on ``exporter_host:exporter_port`` (port
    0: one from the OS); ``prometheus`` (``--telemetry``) adds a Prometheus per run scraping
    them every ``interval_s``; ``keep`` (``--keep``) is called with the run's telemetry after
    the workload, before the teardown, and returns when the user is done looking."""

    prometheus: bool = False
    interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    keep: Callable[[Any], None] | None = None
    variant: str | None = None
    exporter_host: str = LOOPBACK
    exporter_port: int = 0

    def __post_init__(self) -> None:
        if not self.interval_s >= MIN_SCRAPE_INTERVAL_S:
            raise ConfigError("--scrape-interval", f"must be {MIN_SCRAPE_INTERVAL_S} s or more "
                                                   "(an exporter reads the fabric at most "
                                                   f"that often), got {self.interval_s}")
        if self.keep is not None and not self.prometheus:
            raise ConfigError("--keep", "needs --telemetry")
        if not 0 <= self.exporter_port <= 65535:
            raise ConfigError("--exporter", f"port must be 0..65535, got {self.exporter_port}")


def parse_exporter(text: str) -> tuple[str, int]:
    """``HOST:PORT`` of ``--exporter``.

    Raises:
        ConfigError: not HOST:PORT with a port in 0..65535.
    """
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError("--exporter", f"give HOST:PORT (port 0..65535), got {text!r}")
    return host, int(port)


@dataclass(frozen=True)
class RunRequest:
    """``fabriclab run FILE --out DIR``: what to run, where its results go, and how.

    Args:
        file: the experiment file.
        out: its run directory (a sweep's or variants' parent directory); None:
            ``runs/<the experiment's name>``.
        state_dir: run records and caches.
        backend: ``host``, ``vm`` or ``auto``; None: the experiment's ``emulator.backend``.
        cluster: the Ray head (``host:port``) to partition the fabric over; None: the
            experiment's ``cluster`` section, if any.
        resume: keep what an interrupted run in ``out`` completed, run the rest.
        force: overwrite the run ``out`` holds.
        parallel: a sweep's cells at once, one per machine of the cluster.
        telemetry: the runs' telemetry.
        json: the caller wants the results document (a guest run writes it too).
        verbose: a guest's console line by line.
        vm_accel: the guest's CPU: ``tcg`` (emulated) or ``kvm``.
        seed: the run seed (None: the file's ``seed``, else 1).
    """

    file: Path
    out: Path | None
    state_dir: Path = DEFAULT_STATE_DIR
    backend: str | None = None
    cluster: str | None = None
    resume: bool = False
    force: bool = False
    parallel: bool = False
    telemetry: TelemetryOptions = field(default_factory=TelemetryOptions)
    json: bool = False
    verbose: bool = False
    vm_accel: str = "tcg"
    seed: int | None = None
