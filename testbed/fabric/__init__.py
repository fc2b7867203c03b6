"""A running fabric on this machine (:class:`testbed.fabric.fabric.Fabric`) and the services
that live exactly as long as it: the run monitor, the ECN marker, the PFC agent, link cuts and
failure injection."""
