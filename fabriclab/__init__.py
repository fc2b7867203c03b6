"""The experiment layer: the experiment file and its results (:mod:`fabriclab.model`, pure),
the ways of running it (:mod:`fabriclab.modes`: a run, variants, sweeps, on a cluster, in the
guest), one run in phases (:mod:`fabriclab.runner`), the report, and the ``fabriclab`` command
(:mod:`fabriclab.cli`, a thin shell over the rest). It sits above :mod:`testbed`,
:mod:`traffic` and :mod:`telemetry`; none of them imports it.

Used from Python, :mod:`fabriclab.api` offers the same (``fabriclab.load``, ``fabriclab.up``,
``fabriclab.run``); its names are imported here on first use, so ``import fabriclab`` stays
cheap for the command.
"""

__all__ = ["Collective", "Fabric", "Results", "load", "run", "up"]


def __getattr__(name: str):
    if name in __all__:
        from fabriclab import api

        return getattr(api, name)
    raise AttributeError(f"module 'fabriclab' has no attribute {name!r}")
