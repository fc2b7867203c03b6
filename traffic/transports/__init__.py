"""Reliable transports over UDP, as sans-I/O state machines (the aioquic shape): a sender and a
receiver per queue pair that take packets and ``now`` and return packets to send and the next
timer, and never touch a socket or a clock. The agent's UDP engine drives them with real
packets; the unit tests drive them with a fake clock and scripted feedback.

* :mod:`.rocev2`: go-back-N (RoCEv2's reliable connection) with DCQCN rate control;
* :mod:`.uet`: Ultra-Ethernet-like: per-packet entropy (REPS), out-of-order placement, SACK and
  selective retransmission, an NSCC-like window.
"""
