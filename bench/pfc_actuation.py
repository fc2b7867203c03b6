#!/usr/bin/env python3
"""Benchmark (not a test): how fast a link end stops sending when its HTB class is throttled
over netlink, the actuator a PFC pause on this kernel might use (no 802.1Qbb here).

On a 2-host leaf (10 Mbit/s), one UDP sender blasts jumbo datagrams through the leaf's port to
the receiver; the bench throttles that port's class (rate -> ``--paused-kbit``), measures the
time from the netlink request until the last packet the receiver sees (the stop), then restores
the rate and measures until the first packet (the resume).

Measured here: the netlink change takes 3.2-3.6 ms (median; p99 4-8), one or two frames still
leave, and the port never resumes within a trial. HTB charges each frame to the class's tokens at
the class's rate *at that moment* and keeps the debt across a change: one 9 KB frame at 8 kbit/s
is 9 s of debt, repaid in time whatever the new rate. A pause built on HTB rate changes is
therefore not a pause. TBF resets its bucket on ``tc qdisc change`` (tried by hand on a veth
pair: stop after 1-2 frames in 1.6-2.7 ms). Its resume looked slow (74-80 ms) only because a
qdisc dequeues on an enqueue or its timer: with the senders blocked behind a pause nothing is
enqueued, and a paused TBF's timer is seconds away. Measured in process (pyroute2, no fork): a
resume took 1.7-2.3 ms with a sender still enqueueing, 60-200 ms with it stopped, 1.8-2.4 ms
with one kick frame sent through the port after the change. That is the PFC agent's actuator
(``testbed/fabric/pfc.py``: a TBF per lossless class, prebuilt raw requests, a kick on resume).

Usage: bench/pfc_actuation.py [--trials 20] [--cut-burst] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fabriclab.model import experiment as xp  # noqa: E402
from testbed.fabric.fabric import Fabric  # noqa: E402
from testbed.plan.tcplan import plan_shaping  # noqa: E402

SENDER = ("import socket, sys\n"
          "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
          "buf = bytes(8900)\n"
          "while True:\n"
          "    try:\n"
          "        s.sendto(buf, (sys.argv[1], 9999))\n"
          "    except OSError:\n"
          "        pass\n")
RECEIVER = ("import socket, sys, time\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "s.bind((sys.argv[1], 9999))\n"
            "s.settimeout(float(sys.argv[2]))\n"
            "out = []\n"
            "try:\n"
            "    while True:\n"
            "        s.recv(65536)\n"
            "        out.append(time.monotonic_ns())\n"
            "except socket.timeout:\n"
            "    pass\n"
            "print(' '.join(map(str, out)))\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--paused-kbit", type=int, default=8)
    parser.add_argument("--cut-burst", action="store_true",
                        help="also cut the class's burst to one frame while paused")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--debug", action="store_true", help="print the arrival times")
    args = parser.parse_args()
    exp = xp.parse({"version": 1, "name": "pfc-actuation",
                    "fabric": {"topology": "leaf_spine", "leaves": 1, "spines": 1,
                               "hosts_per_leaf": 2},
                    "emulator": {"queue_sample_ms": 0}})
    with Fabric(exp) as fabric:
        topo = fabric.topo
        port = topo.attachment("h1_2").ifname  # the leaf's port towards the receiver
        plan = plan_shaping(10, exp.fabric.mtu, exp.fabric.queue_kb)
        duration_s = 1.0 * args.trials + 2
        rx = fabric.spawn("h1_2", [sys.executable, "-c", RECEIVER, topo.nodes["h1_2"].ip,
                                   "1.0"], "receiver")
        tx = fabric.spawn("h1_1", [sys.executable, "-c", SENDER, topo.nodes["h1_2"].ip],
                          "sender")
        time.sleep(1.0)  # the queue fills: the port sends at line rate
        pauses, resumes = [], []
        for _ in range(args.trials):
            burst = 9014 if args.cut_burst else plan.burst_bytes
            t_pause = time.monotonic_ns()
            fabric.netlink.set_class_rate(port, args.paused_kbit, burst, plan.quantum_bytes)
            applied = time.monotonic_ns()
            time.sleep(0.4)
            t_resume = time.monotonic_ns()
            fabric.netlink.set_class_rate(port, plan.rate_kbit, plan.burst_bytes,
                                          plan.quantum_bytes)
            time.sleep(0.4)
            pauses.append((t_pause, applied))
            resumes.append(t_resume)
        fabric.stop(tx)
        out, _ = rx.communicate(timeout=duration_s + 30)
        fabric.stop(rx)
    arrivals = [int(x) for x in out.split()]
    if args.debug:
        t0 = pauses[0][0]
        print("arrivals", len(arrivals), "first pause at +0; arrival offsets ms:",
              [round((a - t0) / 1e6) for a in arrivals if a > t0 - 200e6][:60])
    stop_ms, resume_ms, apply_ms, leaked = [], [], [], []
    for (t_pause, applied), t_resume in zip(pauses, resumes):
        during = [a for a in arrivals if t_pause <= a < t_resume]
        last = max(during, default=t_pause)
        stop_ms.append((last - t_pause) / 1e6)
        leaked.append(len(during))
        apply_ms.append((applied - t_pause) / 1e6)
        first = min((a for a in arrivals if a >= t_resume), default=None)
        if first is not None:
            resume_ms.append((first - t_resume) / 1e6)
    q = lambda v, p: sorted(v)[max(0, int(round(p / 100 * len(v))) - 1)]  # noqa: E731
    doc = {"trials": args.trials, "cut_burst": args.cut_burst,
           "netlink_apply_ms": {"median": statistics.median(apply_ms), "p99": q(apply_ms, 99)},
           "stop_ms": {"median": statistics.median(stop_ms), "p99": q(stop_ms, 99)},
           "packets_after_pause": {"median": statistics.median(leaked), "max": max(leaked)},
           "resume_ms": {"median": statistics.median(resume_ms), "p99": q(resume_ms, 99)}
           if resume_ms else None}
    print(json.dumps(doc, indent=1))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
