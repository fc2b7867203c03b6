"""The traffic agent: one process per participating host, run inside the host's namespace.

Usage: ``python -m traffic.agents.agent SPEC.json RANK_HOST`` -- prints one
:class:`traffic.protocol.AgentReport` (its timings, JSON) on stdout and exits 0, or prints the
error on stderr and exits 1.

The spec (a :class:`traffic.protocol.AgentSpec`, written by :mod:`traffic.agents.runner`) lists the
ranks (host, address), the TCP port every agent listens on (on its own address, so that agents
can share a machine's loopback in tests), the number of connections per peer (NCCL opens several
channels per peer; each transfer is split over them), a wall-clock start time shared by all
agents (one machine, one clock), and the collectives in issue order with their transfers. An
agent:

1. listens, connects ``connections`` sockets to every peer it sends to, and accepts the ones
   from every peer that sends to it (each connection announces its sender rank and channel);
2. waits for the start time;
3. runs the collectives in order (stream order, as NCCL does), each behind a barrier over a
   control connection to rank 0 so that all ranks start it together: a step's sends start once every
   receive of the previous step is complete; bytes come from one zero buffer, are sent in
   pieces and never held whole, so sizes from bytes to gigabytes cost the same memory;
4. reports, per collective, its start and end and the completion time of every transfer.

One sender thread per (peer, channel) keeps the byte stream of a connection in step order, and
one receiver thread per (peer, channel) reads it in the same order. With a UDP transport
(``rocev2``, ``uet``: :mod:`traffic.transports`) the data moves over the agent's
:class:`traffic.agents.engine.UdpEngine` instead, one queue pair per (peer, channel) in the
same order; only the barrier stays on TCP. The step engine does not know which.
"""

from __future__ import annotations

import faulthandler
import queue
import resource
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from testbed.errors import TestbedError
from testbed.linux.files import write_text_atomic
from testbed.poll import wait_for
from traffic.protocol import (AgentReport, AgentSpec, CollectiveTiming, Connection,
                              FlowTiming, SendTiming)
from traffic.workloads.schedules import chunk_sizes
from traffic.measure.results import LEAST_KEYS, MOST_KEYS
from traffic.agents import tcpinfo
from traffic.agents.connect import (CONNECT_TIMEOUT_S, HELLO, SourcePorts, accept_hellos,
                                    connect, recv_exact)
from traffic.agents.engine import UdpEngine
from traffic.agents.native import choose
from traffic.transports.packet import Scale

BUF = memoryview(bytearray(1 << 20))
CONTROL = 0xFFFF  # the channel number of the barrier connection every rank opens to rank 0
#: the congestion control of connections inside a server's scale-up domain when the job pins
#: none: NVLink moves data on credits, without pacing, and a window-based sender is its nearer
#: model; BBR paces at its last share of the link, so where two connections share a scale-up
#: link and one ends, the other runs on at half the rate for some round trips (a 4-rank ring of
#: 1 MiB steps, two connections per peer: 1.09 of its prediction under BBR, 1.01 under cubic)
SCALE_UP_CONGESTION = "cubic"
PROBE_WAIT_S = 1.0  # beyond the longest round trip the links' latency makes


@dataclass
class Work:
    """One channel's share of one transfer."""

    collective: int
    step: int
    peer: int
    nbytes: int
    key: tuple  # (collective, step, src, dst): the transfer it belongs to


class Agent:
    """The state of one rank's agent."""

    def __init__(self, spec: AgentSpec, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        self.channels = spec.connections
        self.lock = threading.Condition()
        self.remaining: dict[tuple, int] = {}  # transfer key -> channels not yet done
        self.done_at: dict[tuple, float] = {}
        self.errors: list[str] = []
        self.send_q: dict[tuple[int, int], queue.Queue] = {}
        self.recv_q: dict[tuple[int, int], queue.Queue] = {}
        self.socks: dict[tuple[str, int, int], socket.socket] = {}
        self.control: list[socket.socket] = []
        self.connections: list[Connection] = []  # the send connections' 5-tuples
        self.state = "starting"  # what it is waiting for, published for a stuck-job report
        self.engine: UdpEngine | None = None
        if spec.transport != "tcp":
            scale = Scale(spec.scale["rate_bps"], spec.scale["base_rtt_s"], spec.scale["mss"])
            delays = spec.scale.get("delays_s")
            engine_class, why = choose(spec.transport_options)
            if why:
                print(why, file=sys.stderr)
            self.engine = engine_class(spec.transport, rank, [r.ip for r in spec.ranks], spec.port,
                                    scale, spec.dscp, spec.spray, dcqcn=spec.dcqcn,
                                    options=spec.transport_options,
                                    ranks=spec.ranks,
                                    delays_s=[row[rank] for row in delays] if delays else None,
                                    rtts_s=spec.scale.get("rtts_s", [None] * (rank + 1))[rank],
                                    source_ports=None if spec.seed is None
                                    else SourcePorts(f"{spec.seed}/{rank}/udp"))

    # -- connections ---------------------------------------------------------------------
    def peers(self) -> tuple[set[int], set[int]]:
        send_to, recv_from = set(), set()
        for coll in self.spec.collectives:
            for t in coll.transfers:
                if t.src == self.rank:
                    send_to.add(t.dst)
                if t.dst == self.rank:
                    recv_from.add(t.src)
        return send_to, recv_from

    def connect(self, listener: socket.socket) -> None:
        send_to, recv_from = self.peers()
        if self.engine is not None:  # data over UDP: only the barrier's connections
            self._udp_connections(send_to)
            send_to, recv_from = set(), set()
        expected = {(p, c) for p in recv_from for c in range(self.channels)}
        if self.rank == 0:
            expected |= {(p, CONTROL) for p in range(1, len(self.spec.ranks))}
        accepted: dict[tuple[int, int], socket.socket] = {}

        def accept() -> None:
            accepted.update(accept_hellos(listener, len(expected),
                                          time.monotonic() + CONNECT_TIMEOUT_S))

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        ranks = self.spec.ranks
        ports = None if self.spec.seed is None else SourcePorts(f"{self.spec.seed}/{self.rank}")
        for peer in sorted(send_to):
            self.state = f"connecting to rank {peer}"
            for ch in range(self.channels):
                sock = connect(ranks[peer].address_for(ranks[self.rank], ch), self.spec.port,
                               ports)
                self._congestion_control(sock, peer)
                if self.spec.dscp:  # the traffic class; TCP keeps the ECN bits itself
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, self.spec.dscp << 2)
                sock.sendall(HELLO.pack(self.rank, ch))
                self.socks[("send", peer, ch)] = sock
                (src_ip, sport), (dst_ip, dport) = sock.getsockname()[:2], sock.getpeername()[:2]
                self.connections.append(Connection(self.rank, peer, ch, src_ip, sport, dst_ip,
                                                   dport))
        if self.rank != 0:
            self.state = "connecting to rank 0 (barrier)"
            sock = connect(ranks[0].ip, self.spec.port)
            sock.sendall(HELLO.pack(self.rank, CONTROL))
            self.control = [sock]
        self.state = ("waiting for connections from ranks "
                      f"{sorted({p for p, _ in expected - set(accepted)})}")
        acceptor.join(CONNECT_TIMEOUT_S + 5)
        missing = expected - set(accepted)
        if missing:
            raise RuntimeError(f"rank {self.rank}: no connection from ranks "
                               f"{sorted({p for p, _ in missing})} within {CONNECT_TIMEOUT_S} s")
        for (peer, ch), sock in accepted.items():
            if ch == CONTROL:
                self.control.append(sock)
            else:
                self.socks[("recv", peer, ch)] = sock

    def _udp_connections(self, send_to: set[int]) -> None:
        """The UDP transport's queue pairs that keep one source port (one path), as their
        packets' headers name them; a sprayed one has no single 5-tuple."""
        me = self.spec.ranks[self.rank]
        for peer in sorted(send_to):
            for ch in range(self.channels):
                sport = self.engine.source_port(peer, ch)
                if sport is not None:
                    self.connections.append(Connection(
                        self.rank, peer, ch, me.address_for(self.spec.ranks[peer], ch), sport,
                        self.engine.address(peer, ch), self.spec.port, protocol=17))

    def _congestion_control(self, sock: socket.socket, peer: int) -> None:
        """The sender's choice is what counts: the job's, else cubic to a GPU of the same
        scale-up domain (:data:`SCALE_UP_CONGESTION`; the kernel's default where it has no
        cubic), else the kernel's default."""
        if self.spec.congestion_control:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION,
                            self.spec.congestion_control.encode())
        elif self.spec.ranks[peer].same_server(self.spec.ranks[self.rank]):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION,
                                SCALE_UP_CONGESTION.encode())
            except OSError:  # a kernel without cubic: its default
                pass

    def barrier(self) -> None:
        """All ranks wait here until every rank has arrived (rank 0 gathers, then releases)."""
        self.state = "in the barrier before the next collective"
        if self.rank == 0:
            for sock in self.control:
                recv_exact(sock, 1)
            for sock in self.control:
                sock.sendall(b"g")
        else:
            self.control[0].sendall(b"a")
            recv_exact(self.control[0], 1)

    # -- data movement -------------------------------------------------------------------
    def _finish(self, work: Work) -> None:
        with self.lock:
            self.remaining[work.key] -= 1
            if self.remaining[work.key] == 0:
                self.done_at[work.key] = time.time()
            self.lock.notify_all()

    def _sender(self, sock: socket.socket, q: queue.Queue) -> None:
        try:
            while (work := q.get()) is not None:
                left = work.nbytes
                while left:
                    left -= sock.send(BUF[:min(left, len(BUF))])
                self._finish(work)
        except OSError as err:
            self._fail(f"send: {err}")

    def _receiver(self, sock: socket.socket, q: queue.Queue) -> None:
        try:
            while (work := q.get()) is not None:
                left = work.nbytes
                while left:
                    got = sock.recv_into(BUF, min(left, len(BUF)))
                    if not got:
                        raise OSError(f"rank {work.peer} closed the connection")
                    left -= got
                self._finish(work)
        except OSError as err:
            self._fail(f"receive from rank {getattr(work, 'peer', '?')}: {err}")

    def _fail(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)
            self.lock.notify_all()

    def start_threads(self) -> None:
        if self.engine is not None:
            self.engine.start()
        for (kind, peer, ch), sock in self.socks.items():
            q: queue.Queue = queue.Queue()
            (self.send_q if kind == "send" else self.recv_q)[(peer, ch)] = q
            target = self._sender if kind == "send" else self._receiver
            threading.Thread(target=target, args=(sock, q), daemon=True).start()

    def probe(self) -> None:
        """A time-scaled fabric's unloaded round trip to every peer, once, before the first
        collective (what the emulation adds to the links' latency: the fidelity verdict's
        packets per BDP); answers not back within :data:`PROBE_WAIT_S` past the longest
        expected round trip are left out."""
        delays = (self.spec.scale or {}).get("delays_s")
        if self.engine is None or not delays:
            return
        send_to, recv_from = self.peers()
        peers = sorted(send_to | recv_from)
        self.barrier()  # every rank's engine is up: a late one would hold its pings' answers
        self.engine.ping(peers)
        longest = max((2 * delays[p][self.rank] for p in peers), default=0.0)
        try:
            wait_for(lambda: self.engine.pinged() >= len(peers), longest + PROBE_WAIT_S,
                     "the pings' answers", interval_s=0.002)
        except TestbedError:
            pass  # lost on the way: the answers that came back say it

    def run(self) -> list[CollectiveTiming]:
        """Every collective in turn; each one's transport counters run from its start to the
        next one's (the last one's to after the final barrier), so the job's rows add up to
        everything its queue pairs did (a NACK that comes after a collective's last flow
        completed is counted too)."""
        timings, snapshots = [], []
        sends = Sends(self._retransmitted)
        released = time.time()
        for index, coll in enumerate(self.spec.collectives):
            if coll.barrier:
                if self.spec.barrier:
                    self.barrier()  # every collective starts together, as NCCL-tests times them
                released = time.time()
                sends.close_all()
                time.sleep(coll.gap_for(self.rank))  # the compute before it (training)
            else:  # an overlapped bucket: released its gap after the last barrier
                time.sleep(max(0.0, released + coll.gap_for(self.rank) - time.time()))
            steps: dict[int, list] = {}
            for t in coll.transfers:
                if self.rank in (t.src, t.dst):
                    steps.setdefault(t.step, []).append((t.src, t.dst, t.nbytes))
            start = time.time()
            snapshots.append(self._counters())
            flows = []
            for step in sorted(steps):
                keys = []
                for src, dst, nbytes in steps[step]:
                    key = (index, step, src, dst)
                    peer, queues = (dst, self.send_q) if src == self.rank else (src, self.recv_q)
                    shares = chunk_sizes(nbytes, self.channels)
                    with self.lock:
                        self.remaining[key] = sum(1 for n in shares if n) or 1
                    if src == self.rank:
                        sends.start(index, key, nbytes)
                    if not any(shares):
                        self._finish(Work(index, step, peer, 0, key))
                    for ch, share in enumerate(shares):
                        if share:
                            self._dispatch(src == self.rank, queues, Work(index, step, peer,
                                                                          share, key), ch)
                    if dst == self.rank:
                        keys.append(key)
                    flows.append((key, nbytes, src == self.rank))
                self._wait(keys)  # the next step's sends depend on this step's receives
            self._wait([k for k, _n, _is_send in flows])  # and our own sends to drain
            end = time.time()
            timings.append((index, start, end, tuple(
                FlowTiming(k[2], k[3], k[1], n, self.done_at[k])
                for k, n, is_send in flows if not is_send), released))
        if self.engine is not None or self.spec.barrier:
            # every rank's receives are in: every byte of ours has left its socket (TCP's
            # counters count it), and a UDP receiver whose last ACK was lost keeps answering
            # retransmissions until every rank's sends are acknowledged
            self.barrier()
        snapshots.append(self._counters())
        sends.close_all()
        return [CollectiveTiming(*timing[:4], _delta(before, after), timing[4],
                                 tuple(sends.of(timing[0])))
                for timing, before, after in zip(timings, snapshots, snapshots[1:])]

    def _retransmitted(self, peer: int) -> int | None:
        """What was sent again so far to ``peer``: its connections' ``TCP_INFO``
        retransmissions, or the UDP engine's queue pairs' retransmitted packets."""
        if self.engine is not None:
            return self.engine.retransmitted(peer)
        counts = [tcpinfo.read(sock).get("total_retrans") for (kind, p, _ch), sock
                  in list(self.socks.items()) if kind == "send" and p == peer]
        return None if not counts or None in counts else sum(counts)

    def _counters(self) -> dict:
        """The transport's counters now: the UDP engine's, or the TCP connections' own."""
        if self.engine is not None:
            return self.engine.summary()
        out = tcpinfo.totals(self.socks.values())
        sending = [sock for (kind, _p, _c), sock in self.socks.items() if kind == "send"]
        if sending:  # as the kernel runs it, read back from the sockets
            out["congestion_control"] = "+".join(sorted({tcpinfo.congestion_control(sock)
                                                         for sock in sending}))
        return out

    def _dispatch(self, sending: bool, queues: dict, work: Work, channel: int) -> None:
        """Hand one channel's share of a transfer to its connection's thread, or to the UDP
        engine's queue pair."""
        if self.engine is None:
            queues[(work.peer, channel)].put(work)
        elif sending:
            self.engine.send(work.peer, channel, work.nbytes, lambda: self._finish(work))
        else:
            self.engine.expect(work.peer, channel, work.nbytes, lambda: self._finish(work))

    def _wait(self, keys: list[tuple]) -> None:
        pending = [k for k in keys if k not in self.done_at]
        if pending:
            self.state = (f"collective {pending[0][0]} step {pending[0][1]}: waiting for data "
                          f"from ranks {sorted({k[2] for k in pending if k[3] == self.rank})} "
                          f"and to drain sends to {sorted({k[3] for k in pending if k[2] == self.rank})}")
        with self.lock:
            while not self.errors and any(k not in self.done_at for k in keys):
                self.lock.wait(1.0)
                if self.engine is not None and self.engine.errors:
                    self.errors += self.engine.errors
            if self.errors:
                raise RuntimeError("; ".join(self.errors))

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        for q in [*self.send_q.values(), *self.recv_q.values()]:
            q.put(None)
        for sock in [*self.socks.values(), *self.control]:
            sock.close()


class Sends:
    """The transfers a rank sends, each with its start and the retransmissions on its peer's
    connections from then to the next transfer to that peer, or to the next collective's start
    (after its barrier: what was still in flight at the end is counted)."""

    def __init__(self, retransmitted) -> None:
        self.retransmitted = retransmitted  # peer -> the count so far (None: not known)
        self.open: dict[int, tuple[int, tuple, int, float, int | None]] = {}  # by peer
        self.done: dict[int, list[SendTiming]] = {}  # by collective

    def start(self, index: int, key: tuple, nbytes: int) -> None:
        peer = key[3]
        now, count = time.time(), self.retransmitted(peer)
        self._close(peer, count)
        self.open[peer] = (index, key, nbytes, now, count)

    def _close(self, peer: int, count: int | None) -> None:
        if peer not in self.open:
            return
        index, (_i, step, src, dst), nbytes, start, before = self.open.pop(peer)
        again = None if count is None or before is None else count - before
        self.done.setdefault(index, []).append(SendTiming(src, dst, step, nbytes, start, again))

    def close_all(self) -> None:
        for peer in list(self.open):
            self._close(peer, self.retransmitted(peer))

    def of(self, index: int) -> list[SendTiming]:
        return self.done.get(index, [])


def _delta(before: dict, after: dict) -> dict:
    """The engine's counters over one collective (a histogram's buckets each; a least value,
    ``*_min_us``, ``*_min_ratio``, is the least so far; ``*_max_us`` the greatest)."""
    out = {}
    for k, v in after.items():
        if isinstance(v, dict):
            out[k] = _delta(before.get(k) or {}, v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and \
                not k.endswith(LEAST_KEYS + MOST_KEYS):
            out[k] = v - before.get(k, 0)
        else:
            out[k] = v
    return out


def _publish_state(agent: Agent, path: str) -> None:
    """Keep ``path`` holding what the agent waits for (read by the runner when a job hangs)."""

    def loop() -> None:
        last = None
        while True:
            state = agent.state
            if agent.engine is not None:  # the UDP queue pairs with work left, if any
                try:
                    state = "; ".join([state, *agent.engine.stalled()])
                except RuntimeError:  # a dict changed size under us: next time
                    pass
                except Exception as err:  # noqa: BLE001 - the report says it, and goes on
                    state = f"{state}; (the queue pairs unreadable: {err!r})"
            if state != last:
                last = state
                try:
                    write_text_atomic(path, last)
                except (OSError, TestbedError) as err:  # a full disk: the next change tries
                    print(f"state not published: {err}", file=sys.stderr)
                    last = None
            time.sleep(0.2)

    threading.Thread(target=loop, daemon=True).start()


def main(argv: list[str]) -> int:
    spec_path, host = argv
    with open(spec_path, encoding="utf-8") as fh:
        spec = AgentSpec.from_json(fh.read())
    rank = spec.rank_of(host)
    # a stuck job's report asks for every thread's stack (SIGUSR1: the runner, at its timeout)
    stacks = open(f"{spec_path}.rank{rank}.stacks", "w", encoding="utf-8")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    agent = Agent(spec, rank)
    _publish_state(agent, f"{spec_path}.rank{rank}")
    me = spec.ranks[rank]  # a multi-plane GPU listens on every NIC's address
    listener = socket.create_server(("0.0.0.0" if me.planes else me.ip, spec.port),
                                    backlog=256)
    try:
        agent.connect(listener)
        agent.start_threads()
        time.sleep(max(0.0, spec.start_at - time.time()))
        agent.probe()
        results = agent.run()
    except (OSError, RuntimeError) as err:
        print(f"rank {rank} ({host}): {err}", file=sys.stderr)
        return 1
    finally:
        agent.close()
        listener.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    sys.stdout.write(AgentReport(rank, host, tuple(results), usage.ru_utime + usage.ru_stime,
                                 tuple(agent.connections), usage.ru_utime).to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
