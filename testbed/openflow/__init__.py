"""The eBPF switch's side of OpenFlow 1.5, sans I/O (pure): its session with a controller,
the group mods and descriptions, and the replies it sends; the agent that carries it over
sockets is :mod:`testbed.switch.agent`."""
