"""A probe stream: sequence-numbered UDP packets every few milliseconds from one host to an
echo on another, to measure how long a failure cuts a path off (ping's 1 s default is far too
coarse for rerouting in tens of milliseconds).

``python -m traffic.agents.probe echo IP PORT SECONDS`` answers every probe (until SECONDS pass) and
prints the sequence numbers it received (one way: a failure's outage in the forward direction
alone, which a round trip mixes with the reverse path's);
``python -m traffic.agents.probe send SRC DST PORT SPORT INTERVAL_MS SECONDS`` sends from a fixed
source port (one ECMP path) and prints one JSON document: the send time of every probe and the
round-trip time of those answered. :func:`traffic.measure.outage.outage` (pure) reads it.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

from traffic.measure.outage import outage

PROBE = struct.Struct("!Id")  # sequence number, send time


def echo(ip: str, port: int, seconds: float) -> list[int]:
    """Answer probes for ``seconds``; returns the sequence numbers received."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((ip, port))
    sock.settimeout(0.2)
    end = time.monotonic() + seconds
    received = set()
    while time.monotonic() < end:
        try:
            data, peer = sock.recvfrom(64)
        except TimeoutError:
            continue
        sock.sendto(data, peer)
        received.add(PROBE.unpack(data[:PROBE.size])[0])
    return sorted(received)


def send(src: str, dst: str, port: int, sport: int, interval_s: float, seconds: float) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((src, sport))
    sock.setblocking(False)
    sent: list[float] = []
    rtt: dict[int, float] = {}
    t0 = time.monotonic()
    nxt = t0
    end = t0 + seconds
    while True:
        now = time.monotonic()
        if now >= nxt and now < end:
            sent.append(now - t0)
            sock.sendto(PROBE.pack(len(sent) - 1, now), (dst, port))
            nxt += interval_s
        try:
            while True:
                data = sock.recv(64)
                seq, when = PROBE.unpack(data[:PROBE.size])
                rtt.setdefault(seq, time.monotonic() - when)
        except BlockingIOError:
            pass
        if now >= end + 0.5:  # late answers
            break
        time.sleep(min(0.001, max(0.0, nxt - time.monotonic())))
    return {"interval_s": interval_s, "sent": sent, "rtt": {str(k): v for k, v in rtt.items()}}


def measure_outage(fabric, src: str, dst: str, action, seconds: float = 3.0,
                   at_s: float = 1.0, interval_ms: float = 5.0, port: int = 7777,
                   sport: int = 30000) -> dict:
    """Run a probe stream from host ``src`` to host ``dst`` on a live fabric, call ``action()``
    ``at_s`` seconds in, and return :func:`outage` of the round trips, with ``forward``: the
    same for the probes' arrival at ``dst`` (one way)."""
    topo = fabric.topo
    cmd = [sys.executable, "-m", "traffic.agents.probe"]
    echo_proc = fabric.spawn(dst, cmd + ["echo", topo.nodes[dst].ip, str(port),
                                         str(seconds + 1.5)], f"probe-echo:{dst}")
    try:
        time.sleep(0.3)  # the echo is listening
        sender = fabric.spawn(src, cmd + ["send", topo.nodes[src].ip, topo.nodes[dst].ip,
                                          str(port), str(sport), str(interval_ms),
                                          str(seconds)], f"probe:{src}")
        time.sleep(at_s)
        action()
        out, err = sender.communicate(timeout=seconds + 30)
        if sender.returncode != 0:
            raise RuntimeError(f"probe sender failed: {err[-500:]}")
        echoed, err = echo_proc.communicate(timeout=30)
        if echo_proc.returncode != 0:
            raise RuntimeError(f"probe echo failed: {err[-500:]}")
    finally:
        fabric.stop(echo_proc)
    doc = json.loads(out)
    result = outage(doc["sent"], {int(k): v for k, v in doc["rtt"].items()}, doc["interval_s"])
    arrived = {seq: 0.0 for seq in json.loads(echoed)["received"]}
    result["forward"] = outage(doc["sent"], arrived, doc["interval_s"])
    return result


def main(argv: list[str]) -> int:
    if argv[:1] == ["echo"] and len(argv) == 4:
        print(json.dumps({"received": echo(argv[1], int(argv[2]), float(argv[3]))}))
        return 0
    if argv[:1] == ["send"] and len(argv) == 7:
        doc = send(argv[1], argv[2], int(argv[3]), int(argv[4]), float(argv[5]) / 1e3,
                   float(argv[6]))
        print(json.dumps(doc))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
