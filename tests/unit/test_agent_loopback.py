"""The traffic agent's step engine for real, without root: one agent process per rank, each on
its own loopback address (127.0.0.x, same port), running collectives over TCP."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traffic.agents import tcpinfo

from tests.privileges import may_set_congestion_control
from traffic.protocol import AgentReport
from traffic.measure.results import job_spec, summarize
from traffic.workloads.schedules import build, flows
from traffic.workloads.workload import Collective

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("r0", "r1", "r2", "r3")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_agents(tmp_path, collectives, connections=2, silent=None,
                **transport) -> list[AgentReport]:
    """The agents of ``collectives`` on loopback; ``silent(port)`` runs first in a thread
    (a stranger at the agents' port)."""
    ips = {h: f"127.0.0.{i + 1}" for i, h in enumerate(HOSTS)}
    port = _free_port()
    if silent is not None:
        import threading
        threading.Thread(target=silent, args=(port,), daemon=True).start()
    spec = job_spec(collectives, ips, connections, time.time() + 0.5, port, **transport)
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    procs = [subprocess.Popen([sys.executable, "-m", "traffic.agents.agent", str(path), h],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT) for h in HOSTS]
    reports = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            reports.append(AgentReport.from_json(out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return sorted(reports, key=lambda r: r.rank)


def test_ring_all_reduce_and_all_to_all_over_loopback(tmp_path):
    ring = build("all_reduce", 4, 1 << 20)
    a2a = build("all_to_all", 4, 256 << 10)
    colls = [Collective("all_reduce", HOSTS, ring), Collective("all_to_all", HOSTS, a2a)]
    reports = _run_agents(tmp_path, colls)
    assert [r.host for r in reports] == list(HOSTS) and all(r.cpu_s > 0 for r in reports)
    for index, sched in enumerate((ring, a2a)):
        for rank, report in enumerate(reports):
            timing = report.collectives[index]
            got = sum(f.bytes for f in timing.flows)
            assert got == sched.received_by(rank)  # every byte the schedule sends it arrived
            assert timing.start <= min(f.done for f in timing.flows) <= timing.end
        if index > 0:
            continue  # the step dependency below is the ring's
        done = {(f.dst, f.step): f.done for r in reports for f in r.collectives[0].flows}
        for (rank, step), at in done.items():
            # rank+1 receives step s+1 from rank, which sends it only once its own step s is in
            later = done.get(((rank + 1) % 4, step + 1))
            assert later is None or later >= at, (rank, step)
    # every collective starts behind a barrier: ranks start within a few ms of each other
    starts = [r.collectives[1].start for r in reports]
    assert max(starts) - min(starts) < 0.25
    # each rank names the TCP connections it sent on, as their packets carry them: one per
    # peer it sends to and channel, from its own address to the peer's agent port
    for rank, report in enumerate(reports):
        assert {(c.dst, c.channel) for c in report.connections} == {
            (peer, ch) for peer in range(4) if peer != rank for ch in range(2)}
        for c in report.connections:
            # (the source address is the kernel's choice: on loopback 127.0.0.1 for all)
            assert (c.src, c.dst_ip) == (rank, f"127.0.0.{c.dst + 1}")
            assert c.src_ip.startswith("127.")
            assert c.five_tuple == (c.src_ip, c.dst_ip, 6, c.sport, c.dport) and c.sport > 0
        assert len({c.dport for c in report.connections}) == 1  # the agents' port
    results = summarize(colls, reports, rate_mbps=10_000, mtu=9000)
    assert [r.op for r in results] == ["all_reduce", "all_to_all"]
    assert all(r.time_us > 0 and r.flow_end_s["max"] <= r.time_us / 1e6 + 1e-6
               for r in results)
    # every transfer (a 4-rank ring: 6 steps of 4; the all-to-all: 12 pairs) has its
    # sender's start, before its end
    assert [len(r.flows) for r in results] == [24, 12]
    for r in results:
        assert all(0 <= f.start_s <= f.end_s <= r.time_us / 1e6 + 1e-6 for f in r.flows)
        assert all(f.retransmitted == 0 for f in r.flows)  # TCP_INFO, on loopback
    # the congestion control as the kernel ran it, read back from the sending sockets
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        assert {r.transport["congestion_control"] for r in results} == {
            tcpinfo.congestion_control(probe)}


def test_a_run_seed_draws_every_connections_source_port_and_another_seed_others(tmp_path):
    from traffic.agents.connect import SOURCE_PORTS, SourcePorts

    a2a = build("all_to_all", 4, 64 << 10)
    colls = [Collective("all_to_all", HOSTS, a2a)]
    drawn = {}
    for seed in ("7/0", "8/0"):
        reports = _run_agents(tmp_path, colls, 2, seed=seed)
        for rank, report in enumerate(reports):
            # opened peer by peer, channel by channel: the ports in the order the key draws them
            opened = sorted(report.connections, key=lambda c: (c.dst, c.channel))
            assert [c.sport for c in opened] == SourcePorts(f"{seed}/{rank}").order[:6]
            assert all(c.sport in SOURCE_PORTS for c in opened)
        drawn[seed] = {c.five_tuple for r in reports for c in r.connections}
    assert not drawn["7/0"] & drawn["8/0"]  # another seed, other 5-tuples


@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_run_seed_draws_the_udp_transports_source_ports_and_one_path_queue_pairs_report_them(
        tmp_path, engine):
    from traffic.agents.connect import SourcePorts
    from traffic.native import engine as compiled

    if engine == "native" and compiled is None:
        pytest.skip("the compiled engine is not built")
    a2a = build("all_to_all", 4, 64 << 10)
    colls = [Collective("all_to_all", HOSTS, a2a)]
    scale = {"rate_bps": 200e6, "base_rtt_s": 0.001, "mss": 8936}
    for transport, spray in (("rocev2", False), ("uet", True)):
        reports = _run_agents(tmp_path, colls, 1, transport=transport, spray=spray,
                              scale=scale, options={"engine": engine}, seed="3/0")
        for rank, report in enumerate(reports):
            if spray:  # one source port per packet: no 5-tuple of its own
                assert report.connections == ()
                continue
            pool = SourcePorts(f"3/0/{rank}/udp").order[:64]  # entropy i: the i-th drawn
            assert {c.dst for c in report.connections} == {p for p in range(4) if p != rank}
            for c in report.connections:
                assert c.protocol == 17 and c.five_tuple[2] == 17
                assert c.sport == pool[(c.dst * 31 + c.channel) % 64]
                assert c.dst_ip == f"127.0.0.{c.dst + 1}"


@pytest.mark.parametrize("engine", ["python", "native"])
def test_the_udp_transports_move_every_byte_over_loopback(tmp_path, engine):
    from traffic.native import engine as compiled

    if engine == "native" and compiled is None:
        pytest.skip("the compiled engine is not built")
    a2a = build("all_to_all", 4, 256 << 10)
    colls = [Collective("all_to_all", HOSTS, a2a)]
    # loopback has no switches to pace against: 200 Mbit/s, a 1 ms RTT
    scale = {"rate_bps": 200e6, "base_rtt_s": 0.001, "mss": 8936}
    for transport, spray, dcqcn in (("rocev2", False, "connectx"), ("uet", True, "paper")):
        reports = _run_agents(tmp_path, colls, 1, transport=transport, spray=spray,
                              scale=scale, dcqcn=dcqcn, options={"engine": engine})
        for rank, report in enumerate(reports):
            timing = report.collectives[0]
            assert sum(f.bytes for f in timing.flows) == a2a.received_by(rank)
            t = timing.transport
            assert t["transport"] == transport and t["tx_bytes"] >= a2a.sent_by(rank)
            assert t["engine"] == engine
        results = summarize(colls, reports, rate_mbps=200, mtu=9000)
        assert results[0].transport["tx_packets"] > 0, transport
        # every transfer with its sender's start and the queue pairs' retransmissions on it
        # (summed per peer: they add up to the job's)
        sent = results[0].flows
        assert len(sent) == 12 and all(0 <= f.start_s < f.end_s for f in sent)
        assert sum(f.retransmitted for f in sent) == results[0].transport["tx_retransmitted"]
        constants = results[0].transport["constants"]  # printed with the results
        assert ("DCQCN (connectx)" in constants) if transport == "rocev2" else "UET" in constants
        if transport == "uet":
            assert results[0].transport["tx_entropies"] > 4  # sprayed over several ports
        assert results[0].transport["goodput_ratio"] == pytest.approx(1.0, abs=0.05)


def test_uet_with_receiver_credits_and_each_delivery_mode_moves_every_byte(tmp_path):
    incast = flows([(1, 0), (2, 0), (3, 0)], 4, 512 << 10)
    colls = [Collective("flows", HOSTS, incast)]
    scale = {"rate_bps": 100e6, "base_rtt_s": 0.002, "mss": 8936}
    for options in ({"rccc": True}, {"delivery": "rod"}, {"delivery": "uud", "nscc": False},
                    {"entropy": "bitmap"}):
        reports = _run_agents(tmp_path, colls, 1, transport="uet", scale=scale,
                              options={**{"rccc": False, "nscc": True, "delivery": "rud"},
                                       **options})
        results = summarize(colls, reports, rate_mbps=100, mtu=9000)
        t = results[0].transport
        assert sum(f.bytes for f in reports[0].collectives[0].flows) == 3 * (512 << 10)
        assert t["delivery"] == options.get("delivery", "rud")
        assert t["entropy"] == options.get("entropy", "reps")
        if options.get("delivery") != "rod":  # sprayed: every packet took a chosen entropy
            assert t["tx_entropies_explored"] + t["tx_entropies_recycled"] == t["tx_packets"]
        assert t["rccc"] == options.get("rccc", False) and t["nscc"] == options.get("nscc", True)
        if options.get("rccc"):  # the receiver granted: every sender asked, and spent it
            assert t["rx_grants"] > 0 and t["tx_grants"] > 0 and t["tx_credit_requests"] >= 3
        if options.get("delivery") == "uud":  # loopback loses nothing
            assert t["rx_lost"] == 0 and t["tx_retransmitted"] == 0


def _engine_class(engine: str) -> type:
    """The agent engine class named, or a skip where it is not built."""
    from traffic.agents import native

    engine_class, why = native.choose({"engine": engine})
    if why:
        pytest.skip(why)
    return engine_class


@pytest.mark.parametrize("engine", ["python", "native"])
def test_the_udp_engine_paces_its_queue_pairs_together_at_the_nic_rate(engine):
    import threading

    from traffic.transports.packet import Scale, mss_for, wire_bytes

    UdpEngine = _engine_class(engine)

    ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    rate, mss, size = 40e6, mss_for(9000), 1 << 20
    scale = Scale(rate, 0.001, mss)
    engines = [UdpEngine("uet", r, ips, _free_port() if r == 0 else 0, scale) for r in range(1)]
    port = engines[0].port
    engines += [UdpEngine("uet", r, ips, port, scale) for r in (1, 2)]
    done = [threading.Event() for _ in range(4)]
    try:
        for e in engines:
            e.start()
        start = time.monotonic()
        for i, peer in enumerate((1, 2)):  # two queue pairs of one engine, at once
            engines[peer].expect(0, 0, size, done[2 + i].set)
            engines[0].send(peer, 0, size, done[i].set)
        assert all(d.wait(30) for d in done)
        elapsed = time.monotonic() - start
    finally:
        for e in engines:
            e.close()
    packets = -(-size // mss)
    on_the_wire = 2 * packets * wire_bytes(mss) * 8 / rate  # both at line rate would take half
    assert elapsed >= 0.95 * on_the_wire, (elapsed, on_the_wire)
    assert engines[0].summary()["local_drops"] == 0


def test_rocev2_sends_its_cnps_in_their_own_dscp():
    import socket

    from traffic.agents.engine import UdpEngine
    from traffic.transports.packet import Kind, Packet, Scale, mss_for
    from traffic.transports.rocev2 import CNP_DSCP

    engine = UdpEngine("rocev2", 0, ["127.0.0.1"], 0, Scale(40e6, 0.001, mss_for(9000)), dscp=26)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    peer.settimeout(5)
    engine.start()
    try:
        for kind in (Kind.CNP, Kind.ACK):
            engine._reply(Packet(kind, (1, 0)), peer.getsockname(), time.monotonic())
        tos = []
        for _ in range(2):
            data, anc, _flags, _addr = peer.recvmsg(100, socket.CMSG_SPACE(4))
            tos.append((Packet.decode(data).kind, anc[0][2][0] >> 2))
    finally:
        peer.close()
        engine.close()
    assert tos == [(Kind.CNP, CNP_DSCP), (Kind.ACK, 26)]


@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_ce_marked_packet_is_answered_by_a_cnp_in_its_own_dscp_and_an_ack(engine):
    """Through the engine's sockets: DATA arriving CE-marked (its IP header's ECN bits) is
    answered by a CNP in the CNP class and an ACK in the job's."""
    import socket

    from traffic.transports.packet import Flag, Kind, Packet, Scale, mss_for
    from traffic.transports.rocev2 import CNP_DSCP

    port = _free_port()
    udp = _engine_class(engine)("rocev2", 0, ["127.0.0.1", "127.0.0.2"], port,
                                Scale(40e6, 0.001, mss_for(9000)), dscp=26)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.2", 0))
    peer.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    peer.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 26 << 2 | 0b11)  # CE
    peer.settimeout(5)
    udp.start()
    try:
        udp.expect(1, 0, 100, lambda: None)
        data = Packet(Kind.DATA, (1, 0), psn=0, length=100, flags=Flag.LAST)
        peer.sendto(data.encode() + bytes(100), ("127.0.0.1", port))
        got = []
        for _ in range(2):
            raw, anc, _flags, _addr = peer.recvmsg(200, socket.CMSG_SPACE(4))
            got.append((Packet.decode(raw).kind, anc[0][2][0] >> 2))
    finally:
        peer.close()
        udp.close()
    assert sorted(got) == sorted([(Kind.CNP, CNP_DSCP), (Kind.ACK, 26)])


def test_a_udp_engine_wake_up_asks_only_the_queue_pairs_it_touched():
    """A finished queue pair is not asked for its send time or timer while another one moves a
    message: a wake-up costs the queue pairs whose state changed, not all of them."""
    import threading

    from traffic.agents.engine import UdpEngine
    from traffic.transports.packet import Scale, mss_for

    ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    scale = Scale(100e6, 0.001, mss_for(9000))
    engines = [UdpEngine("uet", 0, ips, _free_port(), scale)]
    engines += [UdpEngine("uet", r, ips, engines[0].port, scale) for r in (1, 2)]
    asked = []
    try:
        for e in engines:
            e.start()
        for peer, size in ((1, 64 << 10), (2, 1 << 20)):
            done = [threading.Event(), threading.Event()]
            engines[peer].expect(0, 0, size, done[0].set)
            engines[0].send(peer, 0, size, done[1].set)
            assert all(d.wait(30) for d in done)
            if peer == 1:  # the first queue pair is done: count what it is asked from now on
                idle = engines[0].senders[(1, 0)]
                for name in ("next_send_time", "timer"):
                    method = getattr(idle, name)
                    setattr(idle, name, lambda m=method, n=name: asked.append(n) or m())
    finally:
        for e in engines:
            e.close()
    moved = engines[0].senders[(2, 0)].stats["packets"]
    assert moved >= 100
    assert asked == [], f"the idle queue pair was asked {len(asked)} times over {moved} packets"


def test_a_silent_connection_does_not_stall_the_agents(tmp_path):
    """A connection to an agent's port that never says its rank (a port scanner, a stuck
    peer) is dropped after the hello timeout: the job goes on with its ranks."""
    held = []

    def silent(port: int) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                return  # connected: says nothing, stays open
            except OSError:
                time.sleep(0.02)

    start = time.monotonic()
    ring = build("all_reduce", 4, 256 << 10)
    reports = _run_agents(tmp_path, [Collective("all_reduce", HOSTS, ring)], silent=silent)
    assert held, "the silent connection never reached the agent"
    assert len(reports) == 4 and time.monotonic() - start < 20
    for sock in held:
        sock.close()


@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_queue_pair_to_a_peer_gone_ends_with_a_named_error(monkeypatch, engine):
    """Nothing answers at rank 1 (no agent there): rank 0's queue pair retransmits, and after
    the stall limit the engine reports it by name instead of retrying until the job's
    timeout."""
    import threading

    from traffic.agents import engine as eng
    from traffic.transports.packet import Scale, mss_for

    engine_class = _engine_class(engine)
    monkeypatch.setattr(eng, "STALL_LIMIT_S", 1.0)
    for transport in ("uet", "rocev2"):
        e = engine_class(transport, 0, ["127.0.0.1", "127.0.0.2"], _free_port(),
                         Scale(40e6, 0.001, mss_for(9000)))
        e.start()
        try:
            e.send(1, 0, 1 << 20, threading.Event().set)
            deadline = time.monotonic() + 10
            while not e.errors and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            e.close()
        assert e.errors and f"{transport} to rank 1 channel 0: nothing acknowledged" in \
            e.errors[0], e.errors


def test_a_straggler_computes_longer_and_an_overlapped_bucket_is_released_not_queued(tmp_path):
    """Per-rank gaps: rank 2 computes 0.6 s where the others compute 0.3 s, and the
    collective waits for it; then two buckets, the first after 0.2 s of compute behind its
    barrier, the second released 0.4 s after that same barrier (not 0.4 s after the first
    ended): the agents' clocks and the results say so."""
    ring = build("all_reduce", 4, 64 << 10)
    colls = [Collective("all_reduce", HOSTS, ring, gap_s=0.3, gaps=(0.3, 0.3, 0.6, 0.3)),
             Collective("all_reduce", HOSTS, ring, gap_s=0.2),
             Collective("all_reduce", HOSTS, ring, gap_s=0.4, barrier=False)]
    reports = _run_agents(tmp_path, colls)
    results = summarize(colls, reports, rate_mbps=10_000, mtu=9000)
    first, bucket0, bucket1 = results
    assert 0.58 < first.compute_s < 0.75  # the straggler's
    assert first.time_us / 1e6 > 0.28  # the others waited for its data
    assert bucket0.barrier and not bucket1.barrier
    assert bucket1.released_unix_s == bucket0.released_unix_s  # one barrier for both
    assert 0.39 < bucket1.compute_s < 0.5
    assert bucket1.start_unix_s - bucket0.released_unix_s < 0.5


@pytest.mark.skipif(not may_set_congestion_control("cubic"), reason="needs root or cubic in "
                    "net.ipv4.tcp_allowed_congestion_control: a socket's congestion control "
                    "outside that list is root's to choose")
def test_connections_inside_a_scale_up_domain_are_cubic_unless_the_job_pins_one():
    """A GPU's connections to a GPU of its own server run cubic (NVLink moves data on credits,
    unpaced), its connections across the fabric the kernel's default; a job's own choice
    holds for both."""
    from traffic.agents.agent import SCALE_UP_CONGESTION, Agent
    from traffic.protocol import RankSpec

    def chosen(congestion_control, peer):
        ranks = {h: f"10.0.0.{i + 1}" for i, h in enumerate(HOSTS)}
        spec = job_spec([Collective("all_reduce", HOSTS, build("all_reduce", 4, 1 << 10))],
                        ranks, 1, time.time(), congestion_control=congestion_control,
                        servers={"r0": 1, "r1": 1, "r2": 2, "r3": 2})
        with socket.socket() as sock:
            Agent(spec, 0)._congestion_control(sock, peer)
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0")

    with socket.socket() as sock:
        default = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0")
    assert chosen(None, 1) == SCALE_UP_CONGESTION.encode()
    assert chosen(None, 2) == default
    assert chosen("reno", 1) == chosen("reno", 2) == b"reno"
    assert RankSpec("a", "1", (), 0).same_server(RankSpec("b", "2", (), 0)) is False


def test_the_agents_delay_line_makes_the_links_latency_over_loopback(tmp_path):
    # a time-scaled fabric's links' latency, added by the agents: 20 ms from each rank to each
    pair = flows([(1, 0), (2, 3)], 4, 256 << 10)
    colls = [Collective("flows", HOSTS, pair)]
    delays = [[0.0 if i == j else 0.02 for j in range(4)] for i in range(4)]
    rtts = [[0.0 if i == j else 0.041 for j in range(4)] for i in range(4)]
    scale = {"rate_bps": 50e6, "base_rtt_s": 0.041, "mss": 8936, "delays_s": delays,
             "rtts_s": rtts}
    reports = _run_agents(tmp_path, colls, 1, transport="uet", scale=scale)
    results = summarize(colls, reports, rate_mbps=50, mtu=9000)
    t = results[0].transport
    assert sum(f.bytes for f in reports[0].collectives[0].flows) == 256 << 10
    # every round trip carries both directions' 20 ms, and little more (the agents' own time)
    assert 40_000 <= t["rtt_min_us"] < 60_000, t
    assert 0.97 < t["rtt_min_ratio"] < 1.5, t
    # the pings before the job: what the agents added to an unloaded round trip of 40 ms
    assert 0 <= t["probe_excess_min_us"] <= t["probe_excess_max_us"] < 20_000, t
    released = sum(t["lateness_us"]["rx"].values())
    assert released >= 2 * (256 << 10) // 8936, t["lateness_us"]  # every packet was held


def test_a_peer_slow_to_say_its_rank_is_accepted_and_a_silent_one_holds_up_nobody():
    """An agent descheduled between its connect and its hello (16 agents starting on 2 cores)
    was dropped after 2 s, and the job failed at its barrier ("connection closed")."""
    import threading

    from traffic.agents.connect import HELLO, accept_hellos

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    addr = listener.getsockname()
    silent = socket.create_connection(addr)
    slow = socket.create_connection(addr)
    quick = socket.create_connection(addr)
    quick.sendall(HELLO.pack(2, 0))
    threading.Timer(2.5, lambda: slow.sendall(HELLO.pack(1, 0))).start()
    start = time.monotonic()
    try:
        got = accept_hellos(listener, 2, time.monotonic() + 10)
        assert sorted(got) == [(1, 0), (2, 0)] and time.monotonic() - start < 8
        for conn in got.values():
            conn.close()
    finally:
        for sock in (silent, slow, quick, listener):
            sock.close()
