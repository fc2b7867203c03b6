"""The UDP engine of an agent: drives its queue pairs' state machines (:mod:`.rocev2`,
:mod:`.uet`) over real sockets, in one thread.

Sockets: one bound to the agent's address and the transport's port receives every queue pair's
DATA and answers it (ACK, NAK, CNP go back to the datagram's source). DATA leaves from a pool of
sockets on ephemeral ports, one per entropy value: the entropy of a packet *is* its UDP source
port, which the switches' ECMP hash covers, so a sprayed flow spreads over the paths and a
queue pair that does not spray keeps one port (one path), as RoCEv2's fixed source port does.
DATA is sent ECT(0) in the job's DSCP; CE is read back with ``IP_RECVTOS``.

The agent's threads call :meth:`UdpEngine.send` and :meth:`UdpEngine.expect`; the engine calls
their callbacks (from its thread) when a message is acknowledged or its bytes have arrived.
Payload bytes come from one zero buffer (``sendmsg`` with the header and a view of it).

Pacing: each queue pair paces itself (uet at the line rate within its window, rocev2 at its
DCQCN rate), and the engine paces their sum at the NIC's rate, round robin over the queue pairs
that may send, at most ``ahead_of_the_wire_bytes`` (:mod:`.packet`) ahead of the wire. A
DATA packet the host's queue refuses (its NIC paused by PFC) waits and goes first, as on a NIC.

The engine caches each queue pair's next send time and timer, recomputing those of the queue
pairs it touched (16-rank all-to-all at 20 Mbit/s: 265 us of CPU per packet, 340 without).

The links' latency, where the agents add it, and the engine's timing:
:class:`traffic.transports.delayline.AgentTiming`.
"""

from __future__ import annotations

import errno
import os
import queue
import random
import selectors
import socket
import threading
import time
from collections.abc import Callable

from traffic.agents.connect import SourcePorts, udp_socket
from traffic.measure.transport import (queue_pair_totals, retransmitted_to,
                                       stalled_queue_pairs, transport_settings)
from traffic.transports.delayline import AgentTiming
from traffic.transports.packet import (Flag, Kind, Packet, Scale, ahead_of_the_wire_bytes,
                                       wire_bytes)
from traffic.transports.rccc import CreditReceiver
from traffic.transports.rocev2 import RoceConfig, RoceReceiver, RoceSender
from traffic.transports.uet import UetReceiver, UetSender
from traffic.transports.options import PER_KIND, TransportOptions
from traffic.transports.uet_control import UetConfig

ZERO = memoryview(bytearray(65536))
ECT0 = 0b10
CE = 0b11
IDLE_WAKE_S = 0.05
BACKOFF_S = 0.001  # after a full socket buffer (our own NIC queue is full)
#: A queue pair with data unacknowledged this long (retransmitting all along) ends the job with
#: an error naming it: the peer is gone or the path cut for good
STALL_LIMIT_S = 30.0


class TransportStalled(Exception):
    """A queue pair made no progress for :data:`STALL_LIMIT_S`."""


class UdpEngine:
    """One agent's queue pairs.

    Args:
        transport: ``rocev2`` or ``uet``.
        rank: this agent's rank.
        ips: every rank's address.
        port: the transport's UDP port (every agent listens on its own address).
        scale: the fabric's rate, RTT and MSS, for the transports' constants.
        dscp: the traffic class of the job's packets.
        spray: spread each queue pair's packets over entropies (None: the transport's default,
            on for uet, off for rocev2).
        entropies: the size of the entropy (source port) pool.
        dcqcn: rocev2's DCQCN profile (``DcqcnConfig.PROFILES``).
        options: the transport's further settings (:class:`TransportOptions` as a dict).
        delays_s: the one-way delay from each rank (the links' latency that the agents add:
            :mod:`traffic.transports.delayline`); None: none.
        rtts_s: the unloaded round trip to each rank (the least measured is reported against
            it); None: not known.
    """

    def __init__(self, transport: str, rank: int, ips: list[str], port: int, scale: Scale,
                 dscp: int = 0, spray: bool | None = None, entropies: int = 64,
                 dcqcn: str = "paper", ranks: tuple | None = None,
                 options: dict | None = None, delays_s: list[float] | None = None,
                 rtts_s: list[float] | None = None,
                 source_ports: SourcePorts | None = None) -> None:
        if transport not in ("rocev2", "uet"):
            raise ValueError(f"unknown transport {transport!r}")
        self.transport, self.rank, self.ips = transport, rank, ips
        self.port, self.scale = port, scale
        self.spray = (transport == "uet") if spray is None else spray
        self.entropies = entropies
        self.options = TransportOptions.from_dict(options)
        self.credit: CreditReceiver | None = None
        if transport == "rocev2":
            self.cfg = RoceConfig.scaled(scale, dcqcn, self.options.congestion_control,
                                         spray=self.spray, entropies=entropies)
        else:
            opt = {k: getattr(self.options, k) for k in PER_KIND["uet"] if k != "engine"}
            self.cfg = UetConfig.scaled(scale, spray=self.spray, entropies=entropies, **opt)
        cnp_dscp = self.cfg.cnp_dscp if transport == "rocev2" else dscp
        self.cnp_tos = (socket.IPPROTO_IP, socket.IP_TOS, bytes([cnp_dscp << 2]))
        self.rng = random.Random(rank)
        self.cmds: queue.Queue = queue.Queue()
        self.senders: dict[tuple[int, int], RoceSender | UetSender] = {}
        self.receivers: dict[tuple[int, int], RoceReceiver | UetReceiver] = {}
        self.send_waits: dict[tuple[int, int], list[tuple[int, Callable]]] = {}
        self.recv_waits: dict[tuple[int, int], list[tuple[int, Callable]]] = {}
        self.recv_expected: dict[tuple[int, int], int] = {}
        self.errors: list[str] = []
        self.reply_to: dict[tuple[int, int], tuple] = {}  # queue pair -> its sender's address
        # a multi-plane fabric (``ranks``: the job's RankSpecs): queue pair (peer, channel) goes
        # to the peer's address on its plane, and a rank is known by any of its addresses
        self.ranks = ranks
        self.dest = {}  # (peer, channel) -> the peer's address for it
        self.ip_rank = {ip: i for i, ip in enumerate(ips)}
        for i, r in enumerate(ranks or ()):
            self.ip_rank.update({ip: i for ip in r.planes})
        bind = "0.0.0.0" if ranks and ranks[rank].planes else ips[rank]
        self.local_drops = 0  # replies the host's queue refused (data waits: self.held)
        self.held = None  # a DATA packet the host's queue refused: sent first, as a NIC would
        self.backoff_until = self.unheld_at = 0.0  # ... and when it went: lateness from then
        self.nic_free_at = 0.0  # when the NIC has sent everything handed to it so far
        # a multi-plane NIC's ports together (each is shaped at the link rate by the kernel)
        self.nic_rate_bps = scale.rate_bps * (1 + len(ranks[rank].planes) if ranks else 1)
        if transport == "uet" and self.cfg.rccc:  # grants at the rate the NIC takes payload
            payload_rate = self.nic_rate_bps / 8 * scale.mss / wire_bytes(scale.mss)
            self.credit = CreditReceiver(payload_rate, self.cfg.rccc_window_bytes, scale.mss,
                                         self.cfg.rccc_initial_bytes)
        self.nic_slack_s = ahead_of_the_wire_bytes(self.nic_rate_bps / 1e6, scale.mss) * 8 \
            / self.nic_rate_bps
        self.turn = 0  # round robin over the queue pairs
        # cached per queue pair (see the module's docstring): when each sender may send next
        # and when its timer fires, when each receiver's does; refreshed for the touched ones
        self.send_at, self.timer_at, self.rtimer_at = {}, {}, {}  # (peer, channel) -> time
        self.touched_tx: set[tuple[int, int]] = set()
        self.touched_rx: set[tuple[int, int]] = set()
        self.progress: dict[tuple[int, int], tuple[int, float]] = {}  # (una, when it moved)
        self.stall_check_at = 0.0
        self.timing = AgentTiming(delays_s, rtts_s)
        self.ready_at: dict[tuple[int, int], float] = {}  # when a sender's state last changed
        self.stop = threading.Event()
        self.sel = selectors.DefaultSelector()
        self.listen = udp_socket(bind, port, dscp << 2)
        self.listen.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        # one source port per entropy value, drawn from the run seed where one is given
        self.pool = [udp_socket(bind, 0, dscp << 2 | ECT0, source_ports)
                     for _ in range(entropies)]
        self.sel.register(self.listen, selectors.EVENT_READ, "listen")
        for sock in self.pool:
            self.sel.register(sock, selectors.EVENT_READ, "pool")
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self._loop, name="udp-engine", daemon=True)

    def source_port(self, peer: int, channel: int) -> int | None:
        """The UDP source port queue pair (peer, channel) sends from (None: it sprays)."""
        return None if self.spray else \
            self.pool[(peer * 31 + channel) % self.entropies].getsockname()[1]

    def address(self, peer: int, channel: int) -> str:
        """The address queue pair (peer, channel) sends to."""
        if self.ranks is None:
            return self.ips[peer]
        key = (peer, channel)
        if key not in self.dest:
            self.dest[key] = self.ranks[peer].address_for(self.ranks[self.rank], channel)
        return self.dest[key]

    # -- the agent's side ------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        os.write(self.wake_w, b"x")
        self.thread.join(5)
        for sock in [self.listen, *self.pool]:
            sock.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        self.sel.close()

    def send(self, peer: int, channel: int, nbytes: int, done: Callable[[], None]) -> None:
        """Send a message of ``nbytes`` on queue pair (peer, channel); ``done`` when acked."""
        self.cmds.put(("send", peer, channel, nbytes, done))
        os.write(self.wake_w, b"x")

    def expect(self, peer: int, channel: int, nbytes: int, done: Callable[[], None]) -> None:
        """Call ``done`` once ``nbytes`` more have arrived, in order, from (peer, channel)."""
        self.cmds.put(("expect", peer, channel, nbytes, done))
        os.write(self.wake_w, b"x")

    def ping(self, peers: list[int]) -> None:
        """Probe the round trip to each of ``peers`` once (answers: :meth:`pinged`)."""
        for peer in peers:
            self.cmds.put(("ping", peer, 0, 0, None))
        os.write(self.wake_w, b"x")

    def pinged(self) -> int:
        return self.timing.pongs  # pings answered

    def summary(self) -> dict:
        """Totals over the queue pairs so far (the agent diffs them per collective)."""
        out = {**transport_settings(self.transport, self.spray, self.cfg), "engine": "python",
               "local_drops": self.local_drops, **self.timing.summary()}
        if self.credit is not None:
            out["rx_grants"] = self.credit.grants
        return {**out, **queue_pair_totals(list(self.senders.values()),
                                           list(self.receivers.values()))}

    def retransmitted(self, peer: int) -> int:
        return retransmitted_to(self.senders, peer)

    def stalled(self) -> list[str]:
        """The queue pairs with work left, and where each stands (for a stuck job's report;
        read from another thread, so a snapshot, not a consistent one)."""
        return stalled_queue_pairs(self.transport, dict(self.senders), dict(self.recv_waits),
                                   self.receivers)

    # -- the engine's thread ---------------------------------------------------------------
    def _sender(self, peer: int, channel: int):
        key = (peer, channel)
        if key not in self.senders:
            qp = (self.rank, channel)
            entropy = (peer * 31 + channel) % self.entropies
            cls = RoceSender if self.transport == "rocev2" else UetSender
            self.senders[key] = cls(qp, self.cfg, time.monotonic(), entropy=entropy,
                                    rng=random.Random(self.rank * 1000 + peer * 10 + channel))
            self.send_waits[key] = []
        return self.senders[key]

    def _receiver(self, qp: tuple[int, int]):
        if qp not in self.receivers:
            cls = RoceReceiver if self.transport == "rocev2" else UetReceiver
            self.receivers[qp] = cls(qp, self.cfg)
            self.recv_waits.setdefault(qp, [])
        return self.receivers[qp]

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                self._commands()
                now = time.monotonic()
                self._release(now)
                self._check_stalls(now)
                self._timers(now)
                self._grants(now)
                self._refresh()
                self._transmit(now)
                self._refresh()
                wake = self._next_wake(time.monotonic())
                for key, _ in self.sel.select(max(0.0, wake)):
                    if key.data == "wake":
                        try:
                            os.read(self.wake_r, 4096)
                        except BlockingIOError:
                            pass
                    else:
                        self._read(key.fileobj, key.data == "listen")
                self._release(time.monotonic())
                self._refresh()
        except TransportStalled as err:  # the agent reports it and fails the job
            self.errors.append(str(err))
        except Exception as err:  # noqa: BLE001 - likewise
            self.errors.append(f"udp engine: {err!r}")

    def _commands(self) -> None:
        while True:
            try:
                kind, peer, channel, nbytes, done = self.cmds.get_nowait()
            except queue.Empty:
                return
            if kind == "ping":
                self._reply(Packet(Kind.PING, (self.rank, 0), sent_ns=time.monotonic_ns()),
                            (self.address(peer, 0), self.port), time.monotonic())
            elif kind == "send":
                end = self._sender(peer, channel).offer(nbytes)
                self.send_waits[(peer, channel)].append((end, done))
                self.touched_tx.add((peer, channel))
            else:
                qp = (peer, channel)
                self._receiver(qp)
                self.recv_expected[qp] = self.recv_expected.get(qp, 0) + nbytes
                self.recv_waits[qp].append((self.recv_expected[qp], done))
                self.touched_rx.add(qp)

    def _check_stalls(self, now: float) -> None:
        """Once a second: a queue pair without progress for :data:`STALL_LIMIT_S` with data
        outstanding ends the engine with an error naming it."""
        if now < self.stall_check_at:
            return
        self.stall_check_at = now + 1.0
        for (peer, ch), (una, since) in self.progress.items():
            s = self.senders[(peer, ch)]
            if s.una < len(s.lengths) and now - since > STALL_LIMIT_S:
                raise TransportStalled(
                    f"{self.transport} to rank {peer} channel {ch}: nothing acknowledged for "
                    f"{now - since:.0f} s while retransmitting ({s.describe()}); the peer is "
                    "gone or every path to it cut")

    def _timers(self, now: float) -> None:
        for key in [k for k, t in self.timer_at.items() if t <= now]:
            self.senders[key].on_timer(now)
            self.touched_tx.add(key)
        for qp in [q for q, t in self.rtimer_at.items() if t <= now]:
            for reply in self.receivers[qp].on_timer(now):
                self._reply(reply, self.reply_to.get(qp), now)
            self.touched_rx.add(qp)

    def _grants(self, now: float) -> None:
        """Receiver credits due now, each to its queue pair's sender."""
        if self.credit is None:
            return
        for qp, total in self.credit.poll(now):
            self._reply(Packet(Kind.GRANT, qp, sack=total), self.reply_to.get(qp), now)

    def _refresh(self) -> None:
        """Recompute the cached times of the touched queue pairs and call the callbacks of
        their finished messages."""
        now = time.monotonic()
        for key in self.touched_tx:
            s = self.senders[key]
            last = self.progress.get(key)
            if last is None or last[0] != s.una or s.una >= len(s.lengths):  # moved, or idle
                self.progress[key] = (s.una, now)
            _cache(self.send_at, key, s.next_send_time())
            self.ready_at[key] = now
            _cache(self.timer_at, key, s.timer())
            waits = self.send_waits[key]
            while waits and s.una >= waits[0][0]:
                waits.pop(0)[1]()
        self.touched_tx.clear()
        for qp in self.touched_rx:
            r = self.receivers[qp]
            _cache(self.rtimer_at, qp, r.timer())
            waits = self.recv_waits.get(qp)
            while waits and r.delivered >= waits[0][0]:
                waits.pop(0)[1]()
        self.touched_rx.clear()

    def _nic_sent(self, now: float, payload: int) -> None:
        self.nic_free_at = max(now, self.nic_free_at) + \
            wire_bytes(payload) * 8 / self.nic_rate_bps

    def _transmit(self, now: float) -> None:
        if now < self.backoff_until or not self.senders:
            return
        if self.held is not None and not self._send(*self.held, now):
            return
        # every queue pair in its order of creation, the start rotating by one per wake-up:
        # rotating over the ready ones alone (an order that changes as they fill their windows)
        # let a sender burst to one peer, and an all-to-all's incast lost 10 times the packets
        keys = list(self.senders)
        self.turn = (self.turn + 1) % len(keys)
        sent = bool(self.send_at)
        while sent:  # one packet per queue pair per round, while the NIC has room
            sent = False
            for i in range(len(keys)):
                if self.nic_free_at - now > self.nic_slack_s:
                    return
                peer, ch = key = keys[(self.turn + i) % len(keys)]
                due = self.send_at.get(key)
                if due is None or due > now:
                    continue
                pkt = self.senders[key].poll(now)
                if pkt is None:
                    continue
                self.timing.late.sent(now - max(due, self.ready_at.get(key, due), self.unheld_at,
                                                self.nic_free_at - self.nic_slack_s))
                self.touched_tx.add(key)
                if not self._send(self.pool[pkt.entropy % self.entropies], pkt,
                                  (self.address(peer, ch), self.port), now):
                    return
                sent = True

    def _send(self, sock: socket.socket, pkt: Packet, addr, now: float) -> bool:
        """A DATA packet to the host's queue; False when full: held, sent first later."""
        try:
            sock.sendmsg([pkt.encode(), ZERO[:pkt.filler]], [], 0, addr)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.ENOBUFS):
                raise
            self.held, self.backoff_until = (sock, pkt, addr), now + BACKOFF_S
            return False
        if self.held is not None:  # the NIC took the held packet: a pause, not the agent
            self.held, self.unheld_at = None, now
        self._nic_sent(now, pkt.length)
        return True

    def _reply(self, pkt: Packet, addr, now: float) -> None:
        if addr is None:
            return
        try:
            if pkt.kind == Kind.CNP:  # in its own class (the fabric may serve it first)
                self.listen.sendmsg([pkt.encode()], [self.cnp_tos], 0, addr)
            else:
                self.listen.sendto(pkt.encode(), addr)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.ENOBUFS):
                raise
            self.local_drops += 1
            return
        self._nic_sent(now, 0)  # replies take the NIC's time too

    def _read(self, sock: socket.socket, data_socket: bool) -> None:
        now = time.monotonic()
        for _ in range(256):
            try:
                if data_socket:
                    data, anc, _flags, addr = sock.recvmsg(65536, socket.CMSG_SPACE(4))
                else:
                    data, addr = sock.recvfrom(65536)
                    anc = []
            except BlockingIOError:
                return
            try:
                pkt = Packet.decode(data)
            except ValueError:
                continue  # not ours
            if data_socket and pkt.kind == Kind.DATA:
                tos = next((c[2][0] for c in anc if c[0] == socket.IPPROTO_IP
                            and c[1] == socket.IP_TOS and c[2]), 0)
                if tos & 0b11 == CE:
                    pkt.flags |= Flag.CE
            delay = self.timing.delay(self._peer_of(addr)) if self.timing.delays_s else 0.0
            if delay > 0:
                self.timing.line.hold(now + delay, (pkt, addr, data_socket))
            else:
                self._deliver(pkt, addr, data_socket, now)

    def _release(self, now: float) -> None:
        """The held packets due by ``now`` (their lateness counted)."""
        for pkt, addr, data_socket in self.timing.released(now):
            self._deliver(pkt, addr, data_socket, now)

    def _deliver(self, pkt: Packet, addr, data_socket: bool, now: float) -> None:
        """A packet arrived (after the delay line, if any)."""
        if data_socket and pkt.kind == Kind.DATA:
            rx = self._receiver(pkt.qp)
            self.reply_to[pkt.qp] = addr
            before = getattr(rx, "received_bytes", 0)
            for reply in rx.on_packet(pkt, now):
                self._reply(reply, addr, now)
            if self.credit is not None:
                self.credit.on_data(pkt.qp, rx.received_bytes - before)
            self.touched_rx.add(pkt.qp)
        elif data_socket and pkt.kind == Kind.PING:
            self._reply(Packet(Kind.PONG, pkt.qp, sent_ns=pkt.sent_ns), addr, now)
        elif data_socket and pkt.kind == Kind.PONG:
            self.timing.pong(now - pkt.sent_ns / 1e9, self._peer_of(addr))
        elif data_socket and pkt.kind == Kind.REQ and self.credit is not None:
            self.reply_to[pkt.qp] = addr
            self.credit.on_request(pkt.qp, pkt.sack)
            total = self.credit.granted(pkt.qp)
            if total is not None:  # asked again: its grants may have been lost
                self._reply(Packet(Kind.GRANT, pkt.qp, sack=total), addr, now)
        elif not data_socket and pkt.kind != Kind.DATA:
            key = (self._peer_of(addr), pkt.qp[1])
            sender = self.senders.get(key)
            if pkt.kind == Kind.ACK and pkt.sent_ns and not pkt.flags & Flag.RETX:
                self.timing.rtt(now - pkt.sent_ns / 1e9, key[0])
            if sender is not None:
                sender.on_packet(pkt, now)
                self.touched_tx.add(key)

    def _peer_of(self, addr) -> int:
        return self.ip_rank.get(addr[0], -1)

    def _next_wake(self, now: float) -> float:
        wake = now + IDLE_WAKE_S
        if self.backoff_until > now:
            wake = min(wake, self.backoff_until)
        if self.send_at:
            wake = min(wake, max(min(self.send_at.values()), self.nic_free_at - self.nic_slack_s))
        if self.timer_at:
            wake = min(wake, min(self.timer_at.values()))
        if self.rtimer_at:
            wake = min(wake, min(self.rtimer_at.values()))
        grant = self.credit.next_time() if self.credit is not None else None
        if grant is not None:
            wake = min(wake, grant)
        held = self.timing.line.next_time()
        if held is not None:
            wake = min(wake, held)
        return wake - now


def _cache(times: dict[tuple[int, int], float], key: tuple[int, int], t: float | None) -> None:
    """Keep ``t`` as ``key``'s time in ``times`` (None: it has none)."""
    if t is None:
        times.pop(key, None)
    else:
        times[key] = t
