"""The fabric an experiment runs on: built for it (:func:`make_fabric`: on this machine, or
over a Ray cluster), or shared by consecutive runs that build the same one
(:class:`SharedFabric`: a sweep's cells, variants)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fabriclab.model import sweep
from fabriclab.model.experiment import Experiment
from testbed.cluster.coordinator import ClusterFabric
from testbed.contract import RunningFabric
from testbed.fabric.fabric import Fabric


def make_fabric(exp: Experiment, state_dir: Path,
                log: Callable[[str], None] = lambda _msg: None, failable: bool = False):
    """The fabric ``exp`` asks for: on one machine (:class:`Fabric`), or partitioned over the
    Ray cluster its ``cluster`` section names (:class:`testbed.cluster.coordinator.ClusterFabric`,
    which offers a run the same)."""
    if exp.cluster is None:
        return Fabric(exp, state_dir=state_dir, log=log, failable=failable)
    return ClusterFabric(exp, exp.cluster.address, state_dir, log, exp.cluster.machines)


class SharedFabric:
    """The fabric consecutive runs share (a sweep's cells): a run whose fabric section equals
    the previous run's (:func:`fabriclab.model.sweep.fabric_key`) runs on the same namespaces, links,
    switches and markers with a fresh controller; anything else builds anew. A fabric whose
    state outlives a run is never shared: one with failures (links or switches left down) or
    with PFC (pauses and deadlocks), nor one whose run failed.

    A single run uses one of its own and closes it at its end, as :func:`run_experiment` does
    without one.
    """

    def __init__(self, state_dir: Path, build: Callable[..., RunningFabric] = make_fabric) -> None:
        self.state_dir = state_dir
        self.build = build
        self.fabric: RunningFabric | None = None
        self.key: str | None = None
        self.builds = 0
        self.reuses = 0

    @staticmethod
    def shareable(exp: Experiment) -> bool:
        """Whether a run of ``exp`` leaves its fabric as it found it (queues drain)."""
        return not exp.failures and exp.pfc is None

    def can_share(self, first: Experiment, then: Experiment) -> bool:
        """Whether ``then`` can run on the fabric ``first`` ran on."""
        return (self.shareable(first) and self.shareable(then)
                and sweep.fabric_key(first.raw) == sweep.fabric_key(then.raw))

    def reusable(self, exp: Experiment) -> bool:
        """Whether :meth:`acquire` would hand ``exp`` the fabric that is up."""
        return (self.fabric is not None and self.shareable(exp)
                and sweep.fabric_key(exp.raw) == self.key)

    @contextmanager
    def use(self, exp: Experiment, keep: bool) -> Iterator[RunningFabric]:
        """:meth:`acquire` for a run, :meth:`release` after it: kept up when ``keep`` and the
        run ended without an error."""
        fabric = self.acquire(exp)
        ok = False
        try:
            yield fabric
            ok = True
        finally:
            self.release(keep and ok)

    def acquire(self, exp: Experiment) -> RunningFabric:
        """The fabric for ``exp``: the one up when :meth:`reusable`, else a new one.

        Raises:
            TestbedError, ConfigError: the build or the controller's restart failed (nothing
                is left up).
        """
        if self.reusable(exp):
            try:
                self.fabric.restart_controller(exp)
            except BaseException:
                self.close()
                raise
            self.reuses += 1
            return self.fabric
        self.close()
        fabric = self.build(exp, state_dir=self.state_dir)
        fabric.__enter__()  # tears itself down when the build fails
        self.fabric, self.key = fabric, sweep.fabric_key(exp.raw)
        self.builds += 1
        return fabric

    def release(self, keep: bool) -> None:
        """The run is over: keep the fabric up for the next one, or tear it down."""
        if not keep:
            self.close()

    def close(self) -> None:
        """Tear the fabric down (nothing if none is up)."""
        fabric, self.fabric, self.key = self.fabric, None, None
        if fabric is not None:
            fabric.down()
