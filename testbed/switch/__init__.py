"""The eBPF switch's control side: its OpenFlow 1.5 session with the controller
(:mod:`.session`, sans I/O, on os-ken's own OpenFlow library), which keeps the switch's flow
and group tables for the datapath (:mod:`testbed.linux.ebpfswitch`) to compile into maps."""
