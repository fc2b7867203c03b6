"""The experiment layer: the experiment file (:mod:`fabriclab.model.experiment`), running it
(:mod:`fabriclab.run`), its results document (:mod:`fabriclab.model.results`) and the ``fabriclab``
command (:mod:`fabriclab.cli`). It sits above :mod:`testbed` and :mod:`traffic`; neither imports it.
"""
