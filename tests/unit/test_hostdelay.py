"""The hosts' delay relay (``emulator.delay_line: hosts``): its plan, its loop over datagram
descriptors (socket pairs standing for its TUN devices), and what it adds to the verdict."""

from __future__ import annotations

import socket
import struct

import pytest

from fabriclab.model import experiment as xp
from fabriclab.model import timescale as ts
from testbed.errors import ConfigError
from testbed.linux.tunrelay import Relay
from testbed.plan.delayline import difference, empty
from testbed.plan.hostdelay import RelayPort, relay_ports
from tests.unit.test_timescale import real_incast


N = 100_000  # auto's for 400 Gbit/s hosts and 4 KiB frames


def _tcp_incast(**emulator) -> dict:
    data = real_incast(time_scale=N, **emulator)
    data["workload"]["transport"] = "tcp"
    return data


def test_a_tcp_job_with_latency_takes_the_hosts_relay_by_name():
    exp = xp.parse(_tcp_incast(delay_line="hosts"))
    assert exp.fabric.delay_line == "hosts"
    assert exp.fabric.link_delay_us("host") == 0.0  # no netem leaf on any link
    needs = {(r.field, r.name) for r in exp.requirements()}
    assert ("emulator.delay_line", "clsact") in needs
    assert not any(name == "netem" for _, name in needs)
    with pytest.raises(ConfigError) as err:
        xp.parse(_tcp_incast(delay_line="agents"))
    assert "emulator.delay_line: hosts" in err.value.message


def test_each_host_holds_packets_from_each_other_for_their_paths_one_way_delay():
    exp = xp.parse(_tcp_incast(delay_line="hosts"))
    hosts = [h.name for h in exp.topology.hosts]
    ports = {p.host: p for p in relay_ports(exp, hosts)}
    delays, _ = exp.path_timing_s(hosts)
    ip = {h.name: h.ip for h in exp.topology.hosts}
    link_s = 650e-9 * N
    h11, h12, h21 = ports["h1_1"], ports["h1_2"], ports["h2_1"]
    assert h11.nic == exp.topology.host_link("h1_1").a.ifname and h11.owner == "h1_1"
    assert ip["h1_1"] not in h11.delays_s and len(h11.delays_s) == len(hosts) - 1
    assert h11.delays_s[ip["h1_2"]] == pytest.approx(2 * link_s)  # through the leaf
    assert h11.delays_s[ip["h2_1"]] == pytest.approx(4 * link_s)  # and a spine
    assert h21.delays_s[ip["h1_1"]] == pytest.approx(delays[0][hosts.index("h2_1")])
    assert h12.delays_s[ip["h1_1"]] == h11.delays_s[ip["h1_2"]]
    assert RelayPort.from_json(h11.to_json()) == h11


def _ipv4(src: str) -> bytes:
    """A 20-byte IPv4 header from ``src`` (the relay reads bytes 12-16) and a payload."""
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 17, 0,
                       socket.inet_aton(src), socket.inet_aton("10.0.0.1")) + b"payload!"


def test_the_relay_gives_each_packet_back_once_its_delay_has_passed():
    now = [100.0]
    dev, host = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    dev.setblocking(False)
    host.setblocking(False)
    relay = Relay([(dev.fileno(), {socket.inet_aton("10.0.0.2"): 0.5})], clock=lambda: now[0])
    try:
        far, stranger = _ipv4("10.0.0.2"), _ipv4("10.9.9.9")
        host.send(far)
        host.send(stranger)
        relay.step(0)
        assert host.recv(100) == stranger  # a source not in the plan waits nothing
        with pytest.raises(BlockingIOError):
            host.recv(100)
        now[0] = 100.4
        relay.step(0)
        with pytest.raises(BlockingIOError):
            host.recv(100)  # held
        now[0] = 100.5007  # due at 100.5: given back 0.7 ms late
        relay.step(0)
        assert host.recv(100) == far
        got = relay.counters()
        assert got["packets"] == 2 and got["held_max"] == 1 and got["held_now"] == 0
        assert got["lateness_us"]["le_1000"] == 1 and sum(got["lateness_us"].values()) == 1
    finally:
        relay.poll.close()
        dev.close()
        host.close()


def test_the_relay_counts_a_write_to_a_device_that_went_with_its_namespace():
    dev, host = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    relay = Relay([(dev.fileno(), {})])
    host.close()
    relay._write(dev.fileno(), b"x")
    assert relay.counters()["write_errors"] == 1
    relay.poll.close()
    dev.close()


def test_the_relays_probe_and_lateness_join_the_verdict():
    scale = xp.parse(_tcp_incast(delay_line="hosts")).time_scale
    base_us = scale.real_base_rtt_s * scale.n * 1e6
    on_time = {**empty(), "le_500": 90, "le_2000": 10}
    relay = {"probe_excess_max_us": 0.03 * base_us, "lateness_us": on_time}
    kept, reasons = ts.judge(scale, [None], relay)
    assert reasons == [] and kept["packets_per_bdp"]["ratio"] == pytest.approx(1.03)
    assert kept["lateness"]["events"] == 100 and kept["delay_relay"] is relay
    _, reasons = ts.judge(scale, [], {"error": "h1_1 -> h2_9: exit 1"})
    assert len(reasons) == 1 and "could not be probed: h1_1 -> h2_9" in reasons[0]
    late = {"lateness_us": {**empty(), "le_16000": 60, "le_250": 40}}
    _, reasons = ts.judge(scale, [], late)
    assert len(reasons) == 1 and "the agents and the delay relay were up to" in reasons[0]


def test_the_relays_lateness_differences_two_readings():
    before = {**empty(), "le_250": 5}
    after = {**empty(), "le_250": 8, "le_1000": 2}
    got = difference(before, after)
    assert got["le_250"] == 3 and got["le_1000"] == 2 and sum(got.values()) == 5
    assert sum(difference(None, None).values()) == 0


def test_auto_weighs_the_relays_cpu_and_timing():
    exp = xp.parse(_tcp_incast(delay_line="hosts") | {"emulator": {
        "datapath": "ebpf", "time_scale": "auto", "delay_line": "hosts"}})
    names = {b.name for b in exp.time_scale.bounds}
    assert {"delay relay's CPU", "delay relay's timing", "datapath"} <= names
    cpu = next(b for b in exp.time_scale.bounds if b.name == "delay relay's CPU")
    # 16 senders' full frames at 400 Gbit/s, each with its ACK, at the relay's measured cost
    packets = 16 * 400e9 / 8 / (4200 + 38)
    assert cpu.least == pytest.approx(packets * 2 * ts.RELAY_CPU_S_PER_PACKET
                                      / ts.RELAY_HEADROOM, rel=0.01)
    assert exp.time_scale.n >= max(b.least for b in exp.time_scale.bounds)
