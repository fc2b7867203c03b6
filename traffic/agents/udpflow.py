"""A UDP flow that counts its losses: a sender that blasts numbered datagrams as fast as its
socket takes them (a blocking socket: a full NIC queue that does not drop back-pressures it, as a
lossless class should), and a receiver that counts what arrived, once each.

Run in a host's namespace (``Fabric.spawn``); each side prints one JSON line.

    python -m traffic.agents.udpflow send DST_IP PORT --count N [--size B] [--dscp D] [--flow F]
    python -m traffic.agents.udpflow recv BIND_IP PORT [--idle-s S]

The receiver counts per flow (several senders may share it): datagrams received, unique,
duplicates, out of order, and lost (of the count each sender announced in every datagram).
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import TestbedError

HEADER = struct.Struct("!IQQ")  # flow, sequence number, datagrams in the flow
IP_RECVERR = 11
ROOT = Path(__file__).resolve().parents[2]


def datagram(flow: int, seq: int, count: int, size: int) -> bytes:
    """One datagram of ``size`` bytes (at least the header)."""
    return HEADER.pack(flow, seq, count).ljust(size, b"\0")


@dataclass
class FlowTally:
    """What a receiver saw of one flow."""

    count: int = 0  # datagrams the sender announced
    received: int = 0
    bytes: int = 0
    duplicates: int = 0
    reordered: int = 0
    highest: int = -1
    seen: set[int] = field(default_factory=set)
    first_s: float = 0.0
    last_s: float = 0.0

    def add(self, seq: int, count: int, size: int, now: float) -> None:
        if not self.received:
            self.first_s = now
        self.received += 1
        self.count = max(self.count, count)
        self.last_s = now
        if seq in self.seen:
            self.duplicates += 1
            return
        self.seen.add(seq)
        self.bytes += size
        if seq < self.highest:
            self.reordered += 1
        self.highest = max(self.highest, seq)

    def summary(self) -> dict:
        unique = len(self.seen)
        return {"count": self.count, "received": self.received, "unique": unique,
                "lost": self.count - unique, "duplicates": self.duplicates,
                "reordered": self.reordered, "bytes": self.bytes,
                "duration_s": round(self.last_s - self.first_s, 6)}


def tally(packets: list[tuple[bytes, float]]) -> dict[int, dict]:
    """Flow -> its summary, from (datagram, arrival time) pairs."""
    flows: dict[int, FlowTally] = {}
    for data, now in packets:
        flow, seq, count = HEADER.unpack_from(data)
        flows.setdefault(flow, FlowTally()).add(seq, count, len(data), now)
    return {f: t.summary() for f, t in sorted(flows.items())}


def send(dst: str, port: int, count: int, size: int, dscp: int, flow: int) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)  # a drop at our own NIC is an error
    sent = local_drops = 0
    start = time.monotonic()
    for seq in range(count):
        try:
            sock.sendto(datagram(flow, seq, count, size), (dst, port))
            sent += 1
        except OSError:  # ENOBUFS: our own NIC's queue dropped it
            local_drops += 1
    elapsed = time.monotonic() - start
    sock.close()
    return {"flow": flow, "sent": sent, "local_drops": local_drops, "seconds": round(elapsed, 6),
            "mbps": round(sent * size * 8 / elapsed / 1e6, 3) if elapsed else 0.0}


def receive(bind: str, port: int, idle_s: float) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((bind, port))
    print(json.dumps({"listening": port}), flush=True)
    packets: list[tuple[bytes, float]] = []
    sock.settimeout(None)  # wait for the first datagram as long as it takes
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        packets.append((data, time.monotonic()))
        sock.settimeout(idle_s)
    sock.close()
    return {"flows": {str(k): v for k, v in tally(packets).items()}}


def run_flows(fabric, pairs: list[tuple[str, str]], count: int, size: int = 8000,
              dscp: int = 0, port: int = 7000, idle_s: float = 2.0,
              timeout_s: float = 300.0) -> dict:
    """Blast ``count`` datagrams over every (sender, receiver) pair at once, on a running
    fabric; flow ``i`` is pair ``i``.

    Returns:
        ``{"senders": [send reports], "flows": {flow: receiver summary}, "lost": total}``.
    """
    topo = fabric.topo
    module = [sys.executable, "-m", "traffic.agents.udpflow"]
    receivers: dict[str, subprocess.Popen] = {}
    try:
        for dst in dict.fromkeys(d for _, d in pairs):
            rx = fabric.spawn(dst, [*module, "recv", topo.nodes[dst].ip, str(port), "--idle-s",
                                    str(idle_s)], f"udp-rx:{dst}", stdout=subprocess.PIPE,
                              cwd=ROOT)
            receivers[dst] = rx
            first = rx.stdout.readline()
            if not first.startswith('{"listening"'):
                raise TestbedError(f"the UDP receiver on {dst} did not start: {first!r}")
        txs = [fabric.spawn(src, [*module, "send", topo.nodes[dst].ip, str(port), "--count",
                                  str(count), "--size", str(size), "--dscp", str(dscp),
                                  "--flow", str(i)], f"udp-tx:{src}", stdout=subprocess.PIPE,
                            cwd=ROOT)
               for i, (src, dst) in enumerate(pairs)]
        sent = []
        for tx in txs:
            out, _ = tx.communicate(timeout=timeout_s)
            sent.append(json.loads(out))
        flows: dict[str, dict] = {}
        for rx in receivers.values():
            out, _ = rx.communicate(timeout=timeout_s)
            flows.update(json.loads(out)["flows"])
    finally:
        for rx in receivers.values():
            fabric.stop(rx)
    lost = sum(count - flows.get(str(i), {}).get("unique", 0) for i in range(len(pairs)))
    return {"senders": sent, "flows": flows, "lost": lost}


def run_incast(fabric, senders: list[str], receiver: str, count: int, **kwargs) -> dict:
    """:func:`run_flows` from every sender to one receiver."""
    return run_flows(fabric, [(s, receiver) for s in senders], count, **kwargs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="traffic.agents.udpflow", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send")
    s.add_argument("dst")
    s.add_argument("port", type=int)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--size", type=int, default=8000)
    s.add_argument("--dscp", type=int, default=0)
    s.add_argument("--flow", type=int, default=0)
    r = sub.add_parser("recv")
    r.add_argument("bind")
    r.add_argument("port", type=int)
    r.add_argument("--idle-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.cmd == "send":
        if args.size < HEADER.size:
            parser.error(f"--size must be at least {HEADER.size}")
        doc = send(args.dst, args.port, args.count, args.size, args.dscp, args.flow)
    else:
        doc = receive(args.bind, args.port, args.idle_s)
    print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
