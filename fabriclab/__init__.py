"""The experiment layer: the experiment file and its results (:mod:`fabriclab.model`, pure),
the ways of running it (:mod:`fabriclab.modes`: a run, variants, sweeps, on a cluster, in the
guest), one run in phases (:mod:`fabriclab.run`), the report, and the ``fabriclab`` command
(:mod:`fabriclab.cli`, a thin shell over the rest). It sits above :mod:`testbed`,
:mod:`traffic` and :mod:`telemetry`; none of them imports it.
"""
