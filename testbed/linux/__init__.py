"""The adapters to this machine's Linux: netlink (pyroute2), Open vSwitch, Mininet hosts, eBPF
programs (``progs/*.c``) and their maps, /proc, kernel capabilities, software versions, and the
file helpers. One module per system; each checks every exit code."""
