"""The hosts' delay relay (``emulator.delay_line: hosts``): one process that holds every IPv4
packet a host receives for its path's one-way delay (:mod:`testbed.plan.hostdelay`).

It opens one TUN device per host (``IFF_TUN | IFF_NO_PI``: packets start at the IPv4 header),
says their names on its standard output as one JSON line, and waits: the fabric moves each
device into its host's namespace and turns the host NIC's incoming IPv4 packets to it (a
``u32`` filter with a ``mirred`` redirect at the NIC's ingress). What the relay reads from a
device it writes back to the same device once the packet's delay has passed; the host's stack
then receives it from the TUN device as from the wire. The delay is found by the packet's
source address (bytes 12-16 of the IPv4 header); a source not in the plan waits nothing.

The devices belong to the relay's file descriptors: when it exits, they are gone, and the
filters that pointed at them with them. Every second, and on SIGTERM before it exits, the
relay writes its counters (packets, bytes, the most held at once, its lateness histogram)
to the stats file, atomically.

Run as ``python -m testbed.linux.tunrelay CONFIG`` (a JSON file: ``ports``, a list of
:class:`~testbed.plan.hostdelay.RelayPort` documents, and ``stats``, the counters' path).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

from testbed.plan.delayline import DelayLine, Lateness
from testbed.plan.hostdelay import TUN_PATTERN, RelayPort

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
MAX_PACKET = 65_536
STATS_EVERY_S = 1.0


def open_tun(pattern: str = TUN_PATTERN) -> tuple[int, str]:
    """A new TUN device (non-blocking file descriptor, and the name the kernel gave it)."""
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    except OSError as err:
        raise OSError(f"/dev/net/tun: {err.strerror} (the hosts' delay relay needs the "
                      "kernel's TUN driver)") from None
    got = fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", pattern.encode(), IFF_TUN | IFF_NO_PI))
    return fd, got[:16].rstrip(b"\0").decode()


class Relay:
    """The relay's loop over its devices (any datagram file descriptors: the tests use socket
    pairs).

    Args:
        ports: (file descriptor, source IPv4 address as 4 bytes -> seconds held) per host.
        clock: monotonic seconds.
    """

    def __init__(self, ports: list[tuple[int, dict[bytes, float]]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ports = {fd: delays for fd, delays in ports}
        self.clock = clock
        self.line = DelayLine()
        self.late = Lateness()
        self.packets = self.bytes = self.held_max = self.write_errors = 0
        self.poll = select.epoll()
        for fd in self.ports:
            self.poll.register(fd, select.EPOLLIN)

    def step(self, timeout_s: float | None) -> None:
        """Wait for packets (at most until the next one is due, or ``timeout_s``), hold what
        arrived, and give back what is due."""
        due = self.line.next_time()
        wait = timeout_s if due is None else max(0.0, due - self.clock())
        if timeout_s is not None:
            wait = min(wait, timeout_s)
        for fd, _ in self.poll.poll(-1 if wait is None else wait):
            self._read(fd)
        self._release()

    def _read(self, fd: int) -> None:
        delays = self.ports[fd]
        while True:
            try:
                packet = os.read(fd, MAX_PACKET)
            except BlockingIOError:
                return
            now = self.clock()
            self.packets += 1
            self.bytes += len(packet)
            hold = delays.get(packet[12:16], 0.0)
            if hold <= 0:
                self._write(fd, packet)
                continue
            self.line.hold(now + hold, (fd, packet))
            self.held_max = max(self.held_max, len(self.line))

    def _release(self) -> None:
        now = self.clock()
        for due, (fd, packet) in self.line.release(now):
            self.late.released(now - due)
            self._write(fd, packet)

    def _write(self, fd: int, packet: bytes) -> None:
        try:
            os.write(fd, packet)
        except OSError:  # the device went with its namespace (teardown)
            self.write_errors += 1

    def counters(self) -> dict:
        return {"packets": self.packets, "bytes": self.bytes, "held_max": self.held_max,
                "cpu_s": round(time.process_time(), 4),
                "held_now": len(self.line), "write_errors": self.write_errors,
                "lateness_us": self.late.summary()["rx"]}


def _write_stats(path: Path, counters: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(counters))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    ports = [RelayPort.from_json(p) for p in config["ports"]]
    stats = Path(config["stats"])
    fds, names = [], {}
    for port in ports:
        fd, name = open_tun()
        fds.append((fd, {socket.inet_aton(ip): s for ip, s in port.delays_s.items()}))
        names[port.host] = name
    relay = Relay(fds)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    print(json.dumps({"tuns": names}), flush=True)
    last = 0.0
    while not stop:
        relay.step(STATS_EVERY_S)
        if relay.clock() - last >= STATS_EVERY_S:
            last = relay.clock()
            _write_stats(stats, relay.counters())
    _write_stats(stats, relay.counters())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
