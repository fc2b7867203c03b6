"""Where fabriclab keeps a machine's state: run records, caches, the runs' working folders
(``--state-dir``; under /run, so a reboot, which ends every fabric, empties it)."""

from pathlib import Path

DEFAULT_STATE_DIR = Path("/run/fabriclab")
#: in a run directory, the eBPF switches' management sockets (``NAME.mgmt``: OpenFlow tools
#: such as ``ovs-ofctl`` read a switch's tables there, as at an Open vSwitch bridge's)
SWITCH_MGMT_DIR = "switches"
MGMT_SUFFIX = ".mgmt"
#: there too, the switch agent's datagram socket another process tells a lost signal by (an
#: interface name per datagram: ``fabriclab fail`` as it marks the port dead)
SIGNAL_SOCKET = "agent.signal"
