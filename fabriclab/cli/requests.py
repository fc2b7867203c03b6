"""What each command asks for, typed: built once from the command line by
:func:`fabriclab.cli.main.to_request`; handlers read these fields only. ``fabriclab run``'s
request is the experiment layer's :class:`fabriclab.options.RunRequest`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fabriclab.options import RunRequest, TelemetryOptions
from testbed.paths import DEFAULT_STATE_DIR

__all__ = ["CleanRequest", "CompareRequest", "FailRequest", "ReportRequest", "RunRequest",
           "SchemaRequest", "ServeRequest", "TopRequest", "UpRequest", "ValidateRequest"]


@dataclass(frozen=True)
class ValidateRequest:
    files: list[Path]
    machines: int = 0  # also show the partition over this many machines like this one
    json: bool = False


@dataclass(frozen=True)
class PredictRequest:
    """``fabriclab predict FILE...``: each file's collectives predicted, nothing built."""

    files: list[Path]
    draws: int = 16  # ECMP hash draws simulated
    json: bool = False
    share_cv: float | None = None  # TCP's uneven link shares (None: the model's default)


@dataclass(frozen=True)
class SchemaRequest:
    results: bool = False  # results.json's schema instead of the experiment file's


@dataclass(frozen=True)
class GraphRequest:
    """``fabriclab graph FILE``: the topology as ``format`` (dot, mermaid, png, svg) into
    ``out`` (None: text to stdout, a picture beside the working directory)."""

    file: Path
    format: str = "png"
    out: Path | None = None


@dataclass(frozen=True)
class ExportRequest:
    """``fabriclab export FILE``: the experiment (each variant) as ``format`` reads it, into
    ``out`` (None: export-NAME)."""

    file: Path
    format: str = "htsim"
    out: Path | None = None
    json: bool = False


@dataclass(frozen=True)
class CompletionRequest:
    """``fabriclab completion bash|zsh``."""

    shell: str


@dataclass(frozen=True)
class UpRequest:
    file: Path
    state_dir: Path = DEFAULT_STATE_DIR
    check: bool = False  # all-pairs reachability, then tear down
    count: int = 2  # probes per pair
    verbose: bool = False
    backend: str | None = None
    cluster: str | None = None
    vm_accel: str = "tcg"
    out: Path | None = None  # where Prometheus stores (with --telemetry)
    telemetry: TelemetryOptions = field(default_factory=TelemetryOptions)
    json: bool = False
    detach: bool = False  # return once the fabric is up; it stays up in the background


@dataclass(frozen=True)
class ListRequest:
    """``fabriclab ls``: the running fabrics."""

    state_dir: Path = DEFAULT_STATE_DIR
    json: bool = False


@dataclass(frozen=True)
class LaunchRequest:
    """``fabriclab launch [--run ID] [--ranks N | --hosts H,...] -- ARGV...``."""

    command: tuple[str, ...]
    run: str | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    ranks: int | None = None
    hosts: tuple[str, ...] = ()
    per_host: int = 1
    timeout_s: float = 600.0
    env: tuple[tuple[str, str], ...] = ()
    out: Path | None = None
    json: bool = False


@dataclass(frozen=True)
class ExecRequest:
    """``fabriclab exec [--run ID] HOST -- CMD...`` (no command: a shell)."""

    host: str
    command: tuple[str, ...] = ()
    run: str | None = None
    state_dir: Path = DEFAULT_STATE_DIR


@dataclass(frozen=True)
class OfctlRequest:
    """``fabriclab ofctl [--run ID] SWITCH CMD [ARGS]``: ovs-ofctl against one switch."""

    switch: str
    args: tuple[str, ...] = ()
    run: str | None = None
    state_dir: Path = DEFAULT_STATE_DIR


@dataclass(frozen=True)
class CaptureRequest:
    """``fabriclab capture [--run ID] LINK|PORT [-w FILE]``: tcpdump on one interface."""

    target: tuple[str, ...]
    write: Path | None = None
    count: int | None = None
    filter: str = ""
    run: str | None = None
    state_dir: Path = DEFAULT_STATE_DIR


@dataclass(frozen=True)
class DownRequest:
    """``fabriclab down [ID|--all]``: tear running fabrics down."""

    run: str | None = None
    all: bool = False
    state_dir: Path = DEFAULT_STATE_DIR
    json: bool = False


@dataclass(frozen=True)
class FailRequest:
    targets: list[str]  # two nodes (a link) or one (a switch)
    up: bool  # restore instead of fail
    run: str | None = None  # the run id, when several fabrics are up
    state_dir: Path = DEFAULT_STATE_DIR
    json: bool = False


@dataclass(frozen=True)
class CleanRequest:
    state_dir: Path = DEFAULT_STATE_DIR
    all: bool = False  # also runs whose process is alive
    json: bool = False


@dataclass(frozen=True)
class ReportRequest:
    dir: Path
    json: bool = False


@dataclass(frozen=True)
class CompareRequest:
    dirs: list[Path]
    json: bool = False
    baseline: str | None = None  # the run the others' changes are against (default: first)


@dataclass(frozen=True)
class ServeRequest:
    """``fabriclab telemetry DIR``: a finished run's Prometheus data served again."""

    dir: Path
    port: int = 0
    grafana: bool = False


@dataclass(frozen=True)
class TopRequest:
    state_dir: Path = DEFAULT_STATE_DIR
    run: str | None = None
    interval_s: float = 1.0
    links: int = 4
    once: bool = False
