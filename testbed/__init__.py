"""Builds fabrics: a typed :class:`testbed.model.spec.TestbedSpec` -> hosts, links, switches and a
controller on this machine (or in a full-kernel guest), registered and torn down without a trace.
Pure modules (spec, topology, tcplan, fidelity, reachability) sit beside one adapter per system
(netlink, ovs, mininet_hosts, vm); :mod:`testbed.fabric.fabric` ties them together. Imports no other
fabriclab package.
"""
