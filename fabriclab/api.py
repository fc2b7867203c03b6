"""fabriclab from Python: what the command does, for scripts, notebooks and tests.

    import fabriclab

    exp = fabriclab.load("experiments/quickstart.yaml")     # checked as `validate` does
    with fabriclab.up(exp) as fabric:                        # as `fabriclab up`
        done = fabric.exec("h1_1_1", ["fping", "-c1", fabric.ip("h1_2_1")])
        assert done.returncode == 0
        print(fabric.check().ok, "pairs reachable")
        fabric.fail("agg1_1", "core1")                       # as `fabriclab fail`
    results = fabriclab.run(exp, out="runs/quickstart")      # as `fabriclab run`
    for c in results.collectives:
        print(c.label, c.time_us, c.busbw_GBps)

Every call raises :class:`testbed.errors.ConfigError` for a bad experiment (naming the field)
and :class:`testbed.errors.TestbedError` for what the machine refused, as the command does;
a fabric is torn down when its ``with`` block ends, however it ends.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fabriclab.model import experiment as xp
from fabriclab.model.document import CollectiveRow, RunDocument
from fabriclab.modes import run_file
from fabriclab.options import RunRequest, TelemetryOptions
from fabriclab.rundirs import load_document
from fabriclab.runner import RunView
from fabriclab.shared import make_fabric
from testbed.errors import ConfigError, TestbedError
from testbed.paths import DEFAULT_STATE_DIR
from testbed.plan.failplan import live_links
from testbed.plan.reachability import Reachability
from testbed.poll import wait_for

__all__ = ["Collective", "Fabric", "Results", "load", "run", "up"]


def load(path: str | Path, cluster: str | None = None) -> xp.Experiment:
    """An experiment file, checked (``fabriclab validate``).

    Args:
        path: the YAML file.
        cluster: a Ray head (``host:port``) to partition the fabric over, as ``--cluster``.
    """
    return xp.load(path, cluster=cluster)


def _experiment(experiment: xp.Experiment | str | Path) -> xp.Experiment:
    return experiment if isinstance(experiment, xp.Experiment) else load(experiment)


class Fabric:
    """A fabric that is up (:func:`up`): its hosts, commands in them, probes, failures.
    A context manager; :meth:`down` tears it down (also on leaving the ``with`` block).

    Attributes:
        experiment: what it was built from.
        running: the testbed's fabric (the :class:`testbed.contract.RunningFabric`
            contract) for what this class does not wrap.
    """

    def __init__(self, experiment: xp.Experiment, state_dir: Path) -> None:
        self.experiment = experiment
        self.running = make_fabric(experiment, state_dir, failable=True)

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def down(self) -> None:
        """Tear it down (nothing left; safe to call again)."""
        self.running.down()

    @property
    def hosts(self) -> list[str]:
        """Every host's name, in the topology's order."""
        return [h.name for h in self.running.topo.hosts]

    @property
    def switches(self) -> list[str]:
        return [s.name for s in self.running.topo.switches]

    def ip(self, host: str) -> str:
        """A host's address."""
        node = self.running.topo.nodes.get(host)
        if node is None or node.is_switch:
            raise ConfigError("host", f"no host {host!r} in this fabric")
        return node.ip

    def exec(self, host: str, command: list[str] | str, timeout_s: float = 60.0,
             check: bool = False) -> subprocess.CompletedProcess:
        """Run a command in a host's network namespace and wait for it.

        Args:
            host: the host's name.
            command: its argv (a string: run by ``sh -c``).
            timeout_s: how long it may take (TestbedError past it).
            check: raise TestbedError when it exits non-zero.

        Returns:
            Its exit code, stdout and stderr (text).
        """
        self.ip(host)
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        code, out, err = self.running.run_parallel({host: argv}, timeout_s)[host]
        done = subprocess.CompletedProcess(argv, code, out, err)
        if check and code != 0:
            raise TestbedError(f"{host}: {' '.join(argv)} exited with {code}", stderr=err)
        return done

    def check(self, count: int = 2, timeout_s: float = 120.0) -> Reachability:
        """Probe every host pair ``count`` times (``fabriclab up --check``)."""
        return self.running.reachability(count, timeout_s)

    def fail(self, node: str, other: str | None = None) -> None:
        """Take a link (two nodes) or a switch (one) down, as ``fabriclab fail``."""
        self._set(node, other, up=False)

    def restore(self, node: str, other: str | None = None) -> None:
        """Bring a link or a switch back up, as ``fabriclab restore``."""
        self._set(node, other, up=True)

    def _set(self, node: str, other: str | None, up: bool) -> None:
        topo = self.running.topo
        _, pairs = live_links(topo, [node] + ([other] if other else []))
        self.running.set_links(list(pairs), up)
        names = {topo.find_link(a, b).name for a, b in pairs}
        self._await_controller(names, up)

    def _await_controller(self, names: set[str], up: bool, timeout_s: float = 10.0) -> None:
        """Return once fabriclab's controller has these links in the new state in its routes
        (its status lists the links down after it sent the changes), so that what runs next
        sees the fabric rerouted. A user's controller says nothing of it: not awaited."""
        if "links_down" not in self.running.controller_status():
            return

        def seen() -> bool:
            down = set(self.running.controller_status().get("links_down", []))
            return not (names & down) if up else names <= down
        wait_for(seen, timeout_s, f"the controller to see {', '.join(sorted(names))} "
                 f"{'up' if up else 'down'}")


def up(experiment: xp.Experiment | str | Path,
       state_dir: str | Path = DEFAULT_STATE_DIR) -> Fabric:
    """Build an experiment's fabric and return it up (``fabriclab up``): use it in a ``with``
    block, or call :meth:`Fabric.down`. A failed build leaves nothing behind."""
    fabric = Fabric(_experiment(experiment), Path(state_dir))
    fabric.running.__enter__()  # a failed build is torn down before this raises
    return fabric


#: one measured collective (a row of ``results.json``), in NCCL-tests' units
Collective = CollectiveRow


@dataclass
class Results:
    """What a run wrote (``DIR/results.json``), typed; a run with variants or a sweep has one
    :class:`Results` per variant or cell in ``runs``.

    Attributes:
        directory: the run directory.
        experiment: the experiment's name.
        complete: whether every collective was measured.
        error: why it stopped, when it failed.
        collectives: every collective measured.
        document: the whole document, typed (congestion, controller, fidelity, prediction,
            ...: :class:`fabriclab.model.document.RunDocument`).
        runs: a variant's or a sweep cell's name -> its results.
    """

    directory: Path
    experiment: str = ""
    complete: bool = False
    error: str | None = None
    collectives: list[Collective] = field(default_factory=list)
    document: RunDocument | None = None
    runs: dict[str, Results] = field(default_factory=dict)

    @classmethod
    def read(cls, directory: str | Path) -> Results:
        """A run directory's results (a run, its variants or a sweep)."""
        directory = Path(directory)
        if (directory / "results.json").is_file():
            doc = load_document(directory / "results.json")
            return cls(directory, doc.experiment, doc.complete, doc.error,
                       list(doc.collectives), doc)
        runs = {p.parent.name: cls.read(p.parent)
                for p in sorted(directory.glob("*/results.json"))}
        if not runs:
            raise ConfigError("out", f"no results under {directory}")
        first = next(iter(runs.values()))
        return cls(directory, first.experiment, all(r.complete for r in runs.values()),
                   "; ".join(f"{n}: {r.error}" for n, r in runs.items() if r.error) or None,
                   runs=runs)

    def to_dataframe(self, kind: str = "collectives"):
        """A pandas data frame of every run here (a sweep's cells, the variants, or the one
        run): one row per collective (``kind="collectives"``), per transfer (``"flows"``,
        flows.csv's columns) or per failure event and watched port (``"failures"``: the
        event, its throughput around it, each port's times to move off), each run's name and parameters (a sweep's axes by field path,
        ``variant``, ``cell_repetition``) as columns. Needs pandas (``fabriclab[frames]``)."""
        from fabriclab.frames import dataframe

        return dataframe(self.directory, kind)


def run(experiment: xp.Experiment | str | Path, out: str | Path | None = None,
        state_dir: str | Path = DEFAULT_STATE_DIR, force: bool = False, resume: bool = False,
        telemetry: bool = False) -> Results:
    """Build the fabric, run the workload, write the run directory, tear down (``fabriclab
    run``), and return the results typed. A failed run returns what it measured, with
    ``complete`` false and ``error`` set.

    Args:
        experiment: an experiment (:func:`load`) or its file.
        out: the run directory (default ``runs/<name>``).
        force: overwrite what ``out`` holds; resume: finish an interrupted run there.
        telemetry: a Prometheus storing in ``out`` as ``--telemetry``.
    """
    exp = _experiment(experiment)
    if exp.source in ("", xp.MEMORY):
        raise ConfigError("experiment", "run() needs an experiment read from a file "
                                        "(fabriclab.load(path)): the run directory keeps it")
    out_dir = Path(out) if out is not None else Path("runs") / exp.name
    req = RunRequest(Path(exp.source), out_dir, Path(state_dir),
                     cluster=exp.cluster.address if exp.cluster else None, resume=resume,
                     force=force, telemetry=TelemetryOptions(telemetry))
    try:
        run_file(req, RunView())
    except TestbedError:
        if not (out_dir / "results.json").is_file():
            raise  # nothing measured: the build failed
    return Results.read(out_dir)
