"""Builds fabrics: a typed :class:`testbed.model.spec.TestbedSpec` -> hosts, links, switches and a
controller on this machine, over a Ray cluster's machines or in a full-kernel guest, recorded
and torn down without a trace. Pure folders (:mod:`.model`: what a fabric is; :mod:`.plan`:
what to do to it) sit beside the adapters (:mod:`.linux`: one module per system;
:mod:`.fabric`: a running fabric and its services; :mod:`.runs`: run records and cleanup;
:mod:`.cluster`; :mod:`.vm`). Imports no other fabriclab package.
"""
