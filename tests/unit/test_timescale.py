"""Real units and one time scale (fabriclab.model.timescale), the agents' delay line
(traffic.transports.delayline), and the delay line over loopback."""

import math

import pytest
import yaml

from fabriclab.model import experiment as xp
from fabriclab.model import timescale as ts
from testbed.errors import ConfigError
from testbed.model.congestion import PFC_WATCHDOG_MS, frame_bytes
from traffic.measure.results import transport_totals
from testbed.plan import delayline

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def real_incast(**emulator) -> dict:
    """A 400G leaf-spine with 650 ns per link, a 16-to-1 uet incast, in real units."""
    pairs = [[f"h{1 + (i + 1) // 9}_{(i + 1) % 9 + 1}", "h1_1"] for i in range(16)]
    return {"version": 1, "name": "real",
            "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 9,
                       "host_link": {"rate_gbps": 400, "latency_ns": 650,
                                     "ecn": {"mode": "step", "k_bdp": 0.5}},
                       "fabric_link": {"rate_gbps": 400, "latency_ns": 650,
                                       "ecn": {"mode": "step", "k_bdp": 0.5}},
                       "queue": {"size_bdp": 2}, "mtu": 4200},
            "emulator": {"datapath": "ebpf", **emulator},
            "controller": {"routing": "adaptive"},
            "failures": [{"at_s": 1e-4, "link": ["leaf1", "spine1"], "action": "down"}],
            "workload": {"transport": "uet", "timeout_s": 300,
                         "collectives": [{"op": "flows", "size": "256KiB", "pairs": pairs,
                                          "gap_s": 2e-5}]}}


def test_real_units_read_as_the_emulated_ones_at_scale_one():
    units = ts.real_units({"fabric": {"host_link": {"rate_gbps": 400, "latency_ns": 500},
                                      "servers": {"scale_up": {"rate_gbps": 900}}}})
    assert units["fabric"]["host_link"] == {"rate_mbps": 400_000, "delay_us": 0.5}
    assert units["fabric"]["servers"]["scale_up"] == {"rate_mbps": 900_000}
    with pytest.raises(ConfigError) as err:
        ts.real_units({"fabric": {"fabric_link": {"rate_gbps": 1, "rate_mbps": 5}}})
    assert err.value.path == "fabric.fabric_link.rate_gbps" and "not both" in err.value.message
    with pytest.raises(ConfigError) as err:
        ts.real_units({"fabric": {"host_link": {"latency_ns": 1, "latency_us": 5}}})
    assert err.value.path.startswith("fabric.host_link.latency")


def test_scaling_divides_rates_multiplies_times_and_keeps_sizes():
    data = ts.real_units(real_incast())
    data["controller"]["poll_interval_s"] = 1e-4
    out = ts.scaled(data, 1000)
    fab = out["fabric"]
    assert fab["host_link"]["rate_mbps"] == pytest.approx(400)
    assert fab["host_link"]["delay_us"] == pytest.approx(650)
    assert fab["mtu"] == 4200 and fab["queue"] == {"size_bdp": 2}  # sizes: as given
    assert out["controller"]["poll_interval_s"] == pytest.approx(0.1)
    assert out["failures"][0]["at_s"] == pytest.approx(0.1)
    assert out["workload"]["collectives"][0]["gap_s"] == pytest.approx(0.02)
    assert out["workload"]["timeout_s"] == 300  # a wall-clock guard
    assert data["fabric"]["host_link"]["rate_mbps"] == 400_000  # the input is left alone
    replay = ts.scaled({"workload": {"replay": {"size_scale": "real"}}}, 50)["workload"]
    assert replay["replay"] == {"time_scale": 50, "size_scale": 1}


def test_pfcs_default_times_are_the_real_fabrics_too():
    def pfc(d: dict, n: float = 1000, rate_mbps: float = 400_000) -> dict:
        fabric = {"pfc": d, "mtu": 4200, "host_link": {"rate_mbps": rate_mbps}}
        return ts.scaled({"fabric": fabric}, n)["fabric"]["pfc"]

    # given or not, the watchdog is the real fabric's time: a pause the unscaled default
    # broke mid-incast at 2N (100 packet times at N, 50 at 2N) dropped in a lossless class
    assert pfc({"priorities": [3]})["watchdog_ms"] == pytest.approx(PFC_WATCHDOG_MS * 1000)
    assert pfc({"priorities": [3], "watchdog_ms": 0.2})["watchdog_ms"] == pytest.approx(200)
    # the agent polls once per packet time of the host link (4,218 bytes at 400 Gbit/s:
    # 84 ns), scaled: 5.1 ms at N = 60,000 and twice that at 2N
    packet_ms = frame_bytes(4200) * 8 / 400e9 * 1e3
    assert pfc({}, 60_000)["poll_ms"] == pytest.approx(packet_ms * 60_000)
    assert pfc({}, 120_000)["poll_ms"] == pytest.approx(packet_ms * 120_000)
    # ... but never under the machine's own 2 ms nor over 100 ms, as emulated
    assert pfc({}, 1000)["poll_ms"] == pytest.approx(2.0)
    assert pfc({}, 10_000_000)["poll_ms"] == pytest.approx(100.0)
    assert pfc({"poll_ms": 1e-4}, 60_000)["poll_ms"] == pytest.approx(6.0)  # as given
    assert ts.scaled({"fabric": {"pfc": {"priorities": [3]}}}, 1)["fabric"]["pfc"] == {
        "priorities": [3]}


def test_a_time_scaled_file_keeps_the_real_fabrics_regime():
    real = xp.parse(real_incast(time_scale=1))
    for n in (2_000, 40_000):
        exp = xp.parse(real_incast(time_scale=n))
        assert exp.time_scale.n == n and not exp.time_scale.auto
        assert exp.fabric.host_link.rate_mbps == pytest.approx(400_000 / n)
        assert exp.fabric.fabric_link.delay_us == pytest.approx(0.65 * n)
        assert exp.base_rtt_s == pytest.approx(real.base_rtt_s * n)
        # sizes and packets per BDP are the real fabric's, whatever N
        assert exp.bdp()["bdp_bytes"] == pytest.approx(real.bdp()["bdp_bytes"], abs=1)
        assert exp.fabric.queue_kb == real.fabric.queue_kb
        assert exp.port_ecn("host")[0].k_bytes == real.port_ecn("host")[0].k_bytes
        assert exp.time_scale.bdp_packets == pytest.approx(real.bdp()["bdp_bytes"] /
                                                           frame_bytes(4200))
        assert exp.time_scale.real_base_rtt_s == pytest.approx(real.base_rtt_s)
        # real units out: bandwidth x N, time / N, sizes as they are
        rs = exp.real_scale
        assert rs.rate_ratio == pytest.approx(n) and rs.time_ratio == pytest.approx(1 / n)
        assert rs.size_ratio == pytest.approx(1) and "divided by N" in rs.factors()["scales"]
        assert exp.failures[0].at_s == pytest.approx(1e-4 * n)
        assert exp.fabric.delay_line == "agents"  # a UDP workload: the agents add it
        assert not [r for r in exp.requirements() if r.name == "netem"]
    assert real.time_scale.bdp_packets > 64  # the shipped regime: 650 ns per link
    # 2 BDPs of queue, rounded up to a KiB
    assert real.fabric.queue_kb == math.ceil(2 * real.bdp()["bdp_bytes"] / 1024)


def test_buffers_in_bdps_and_their_errors():
    data = real_incast(time_scale=10)
    data["fabric"]["queue"] = {"size_bdp": 2, "size_kb": 64}
    with pytest.raises(ConfigError) as err:
        xp.parse(data)
    assert err.value.path == "fabric.queue.size_bdp" and "not both" in err.value.message
    data = real_incast()  # no time_scale: a BDP in the file's own (emulated) units
    data["fabric"]["host_link"] = {"rate_mbps": 20, "ecn": {"mode": "red", "kmin_bdp": 0.25,
                                                            "kmax_bdp": 1, "pmax": 0.1}}
    data["fabric"]["fabric_link"] = {"rate_mbps": 20}
    exp = xp.parse(data)
    assert exp.time_scale is None and exp.fabric.host_link.rate_mbps == 20
    red = exp.port_ecn("host")[0]
    assert red.kmax_bytes == pytest.approx(exp.bdp()["bdp_bytes"], rel=0.01)
    assert red.kmin_bytes == pytest.approx(exp.bdp()["bdp_bytes"] / 4, rel=0.01)


def test_the_compiled_engine_lets_auto_run_the_fabric_faster(monkeypatch):
    """The agents' CPU and timing bounds follow the engine the jobs run."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    by_engine = {}
    for engine in ("native", "python"):
        data = real_incast(time_scale="auto")
        data["workload"]["transport"] = {"kind": "uet", "engine": engine}
        scale = xp.parse(data).time_scale
        by_engine[engine] = {b.name: b.least for b in scale.bounds}
        assert f"{engine} engine" in next(b.why for b in scale.bounds
                                          if b.name == "agents' CPU")
    native, python = by_engine["native"], by_engine["python"]
    assert native["agents' CPU"] == pytest.approx(python["agents' CPU"] * (
        ts.AGENT_CPU_S_PER_PACKET["native"]["uet"] / ts.AGENT_CPU_S_PER_PACKET["python"]["uet"]))
    assert native["agents' timing"] == pytest.approx(python["agents' timing"] * (
        ts.LOOP_GRANULARITY_S["native"] / ts.LOOP_GRANULARITY_S["python"]))
    # where the compiled engine is not built the agents run the Python one: its costs count
    monkeypatch.setattr(xp, "find_spec", lambda name: None)
    data = real_incast(time_scale="auto")
    data["workload"]["transport"] = {"kind": "uet", "engine": "native"}
    unbuilt = {b.name: b.least for b in xp.parse(data).time_scale.bounds}
    assert unbuilt["agents' CPU"] == pytest.approx(python["agents' CPU"])


def test_auto_picks_the_least_n_this_machine_keeps_up_with(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    exp = xp.parse(real_incast(time_scale="auto"))
    scale = exp.time_scale
    assert scale.auto and scale.n == ts.nice(max(b.least for b in scale.bounds))
    names = [b.name for b in scale.bounds]
    assert names == ["datapath", "agents' CPU", "agents' timing"]
    assert scale.binding().least <= scale.n <= 1.5 * scale.binding().least
    assert exp.raw["emulator"]["time_scale"] == scale.n  # as run
    assert "auto:" in scale.describe() and "packets per BDP" in scale.describe()
    # the emulated packet time leaves the agents' wake-ups an eighth of it
    assert scale.packet_time_s >= ts.PACKET_TIME_IN_WAKES * ts.LOOP_GRANULARITY_S["native"]
    # twice the cores: the CPU bound halves (the timing bound stays)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    wider = xp.parse(real_incast(time_scale="auto")).time_scale
    cpu = {b.name: b.least for b in wider.bounds}
    assert cpu["agents' CPU"] == pytest.approx(
        {b.name: b.least for b in scale.bounds}["agents' CPU"] / 2)
    # TCP: no agents; the datapath's budget alone (and the links' latency needs netem)
    data = real_incast(time_scale="auto")
    data["workload"]["transport"] = "tcp"
    tcp = xp.parse(data)
    assert [b.name for b in tcp.time_scale.bounds] == ["datapath"]
    assert tcp.time_scale.n < scale.n and tcp.fabric.delay_line == "link"
    assert [r.field for r in tcp.requirements() if r.name == "netem"] == [
        "fabric.host_link.delay_us", "fabric.fabric_link.delay_us"]


def test_the_services_times_are_checked_as_emulated():
    data = real_incast(time_scale=200)
    data["controller"]["poll_interval_s"] = 1e-4  # 20 ms emulated: faster than polls go
    with pytest.raises(ConfigError) as err:
        xp.parse(data)
    assert err.value.path == "controller.poll_interval_s"
    assert "0.02 s as emulated (the file's 0.0001 x emulator.time_scale 200)" in err.value.message
    data["emulator"]["time_scale"] = 5000  # 0.5 s emulated
    assert xp.parse(data).controller.poll_interval_s == pytest.approx(0.5)


def test_nice_factors():
    assert [ts.nice(x) for x in (0.5, 1, 1.2, 2, 2.1, 7, 9, 11, 50_308, 99_999)] == \
        [1, 1, 1.5, 2, 2.5, 8, 10, 15, 60_000, 100_000]


def test_the_delay_line_and_scale_refusals_name_their_field():
    data = real_incast(time_scale=100, delay_line="agents")
    data["workload"]["transport"] = "tcp"
    with pytest.raises(ConfigError) as err:
        xp.parse(data)
    assert err.value.path == "emulator.delay_line" and "job 0 runs tcp" in err.value.message
    data = real_incast(time_scale=100)
    data["scale"] = {"real_rate_gbps": 400}
    with pytest.raises(ConfigError) as err:
        xp.parse(data)
    assert err.value.path == "scale"
    forced = xp.parse(real_incast(time_scale=100, delay_line="netem"))
    assert forced.fabric.delay_line == "link"
    assert any(r.name == "netem" for r in forced.requirements())


def test_files_in_emulated_units_read_as_before():
    for name in ("quickstart", "leaf-spine", "pfc-deadlock"):
        exp = xp.load(ROOT / "experiments" / f"{name}.yaml")
        assert exp.time_scale is None and exp.fabric.delay_line == "link"
        raw = yaml.safe_load((ROOT / "experiments" / f"{name}.yaml").read_text())
        assert exp.fabric.host_link.rate_mbps == raw["fabric"]["host_link"]["rate_mbps"]


@pytest.mark.parametrize("name", ["congestion-control", "ultra-ethernet", "scale-check",
                                  "transports", "incast"])
def test_the_shipped_real_unit_experiments_keep_a_400g_fabrics_regime(name, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    exp = xp.load(ROOT / "experiments" / f"{name}.yaml")
    for one in (exp, *exp.variants):
        scale = one.time_scale
        assert scale.auto and scale.real_rate_gbps == 400
        assert scale.bdp_packets >= 64, (one.variant, scale.bdp_packets)
        tcp = any(j.transport == "tcp" for j in one.workload.jobs)
        # the UDP transports' agents hold their packets; kernel TCP's, the hosts' relay
        assert one.fabric.delay_line == ("hosts" if tcp else "agents"), one.variant


def test_path_delays_and_round_trips_sum_the_links_on_the_way():
    exp = xp.parse(real_incast(time_scale=1000))
    hosts = ["h1_1", "h1_2", "h2_1"]
    delays, rtts = exp.path_timing_s(hosts)
    link = 0.65e-6 * 1000
    assert delays[0] == pytest.approx([0, 2 * link, 4 * link])
    assert delays[2][0] == pytest.approx(4 * link)
    # the longest path's round trip is the fabric's base RTT; a shorter one's less
    assert rtts[0][2] == pytest.approx(exp.base_rtt_s)
    assert 4 * link < rtts[0][1] < rtts[0][2]


def test_delay_line_releases_in_order_and_lateness_buckets():
    line = delayline.DelayLine()
    for due, item in ((3.0, "c"), (1.0, "a"), (2.0, "b"), (2.0, "b2")):
        line.hold(due, item)
    assert line.next_time() == 1.0 and len(line) == 4
    assert line.release(0.5) == []
    assert [i for _, i in line.release(2.0)] == ["a", "b", "b2"]
    assert line.next_time() == 3.0
    late = delayline.Lateness()
    for s in (0.0001, 0.0003, 0.0009, 0.05):
        late.released(s)
    late.sent(0.0015)
    got = late.summary()
    assert got["rx"]["le_100"] == 1 and got["rx"]["le_500"] == 1 and got["rx"]["le_1000"] == 1
    assert got["rx"][delayline.OVER] == 1 and got["tx"]["le_2000"] == 1
    assert delayline.quantile_us(got["rx"], 0.5) == 500
    assert delayline.quantile_us(got["rx"], 0.99) == 2 * delayline.EDGES_US[-1]
    assert delayline.quantile_us(delayline.empty(), 0.5) is None


def test_transport_totals_add_histograms_and_keep_the_least_rtt():
    a = {"transport": "uet", "tx_packets": 3, "rtt_min_us": 900.0,
         "lateness_us": {"tx": {"le_250": 2}, "rx": {"le_250": 1}}}
    b = {"transport": "uet", "tx_packets": 4, "rtt_min_us": 700.0,
         "lateness_us": {"tx": {"le_250": 1, "le_500": 5}, "rx": {}}}
    out = transport_totals([a, b])
    assert out["tx_packets"] == 7 and out["rtt_min_us"] == 700.0
    assert out["lateness_us"] == {"tx": {"le_250": 3, "le_500": 5}, "rx": {"le_250": 1}}


def test_the_verdict_judges_packets_per_bdp_and_the_agents_lateness():
    from traffic.measure.rows import TransportCounters

    scale = xp.parse(real_incast(time_scale=120_000)).time_scale
    packet_us = scale.packet_time_s * 1e6
    assert 8000 < packet_us < 12000  # 4 KiB at 3.3 Mbit/s
    on_time = {"tx": {"le_1000": 90, "le_2000": 9}, "rx": {"le_250": 100, "le_4000": 1}}
    base_us = scale.real_base_rtt_s * scale.n * 1e6
    good = TransportCounters("uet", probe_excess_max_us=0.05 * base_us, lateness_us=on_time)
    kept, reasons = ts.judge(scale, [good, None, TransportCounters("tcp")])
    assert reasons == [] and kept["packets_per_bdp"]["ratio"] == pytest.approx(1.05)
    assert kept["packets_per_bdp"]["measured"] == pytest.approx(1.05 * scale.bdp_packets,
                                                                abs=0.01)
    assert kept["lateness"] == {"events": 200, "p50_us_at_most": 250, "p99_us_at_most": 2000,
                                "packet_time_us": round(packet_us, 1)}
    # the emulation adding a fifth to an unloaded round trip: more packets per BDP than real
    slow = TransportCounters("uet", probe_excess_max_us=0.2 * base_us, lateness_us=on_time)
    _, reasons = ts.judge(scale, [good, slow])  # the worst pair counts
    assert len(reasons) == 1 and "+20% off the real fabric's" in reasons[0]
    late = TransportCounters("uet", probe_excess_max_us=0.0,
                             lateness_us={"tx": {"le_2000": 60, "le_8000": 40}, "rx": {}})
    _, reasons = ts.judge(scale, [late])
    assert len(reasons) == 1 and "late" in reasons[0]
    assert ts.judge(scale, [TransportCounters("tcp")]) == ({"n": 120_000}, [])
    # the same lateness at half the factor: a p99 of 2 ms is over a quarter of a 5 ms packet
    half = xp.parse(real_incast(time_scale=60_000)).time_scale
    _, reasons = ts.judge(half, [TransportCounters("uet", lateness_us=on_time)])
    assert len(reasons) == 1 and "2000 us (p99)" in reasons[0] and "0.25 (p99)" in reasons[0]


def test_validate_shows_n_the_regime_and_the_wall_time():
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "validate", "--json",
                           str(ROOT / "experiments" / "scale-check.yaml")],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    (doc,) = json.loads(proc.stdout)
    scale = doc["time_scale"]
    assert scale["auto"] and scale["n"] >= 1 and scale["real"]["bdp_packets"] >= 64
    assert scale["real"]["host_rate_gbps"] == 400
    walls = scale["expected_wall_s"]
    assert set(walls) == {"uet-incast", "uet-permutation", "dcqcn-incast", "dcqcn-pfc-incast",
                          "hpcc-incast", "hpcc-pfc-incast"}
    assert all(w > 0 for w in walls.values())
    assert "time scale N =" in proc.stderr and "packets per BDP" in proc.stderr


def test_scale_invariance_bench_takes_the_median_of_repeated_runs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("scaling_bench", ROOT / "bench" / "scaling.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run = lambda p50, fid="ok": {"v": {"fidelity": fid, "incast": {"fct_p50_us": p50},  # noqa
                                       "run": {"queue_p99_bdp": 8.0}}}
    low = bench.median_of([run(130.0), run(150.0), run(152.0)])
    high = bench.median_of([run(151.0), run(160.0, "degraded"), {"v": {"error": "boom"}}])
    assert low["v"]["incast"] == {"fct_p50_us": 150.0, "fct_p50_us_spread": (130.0, 152.0)}
    assert high["v"]["incast"]["fct_p50_us"] == pytest.approx(155.5)  # the two that ran
    assert high["v"]["fidelity"] == "ok/degraded"
    line = next(x for x in bench.compare(low, high) if x["figure"] == "fct_p50_us")
    assert line["ratio"] == pytest.approx(155.5 / 150, abs=1e-4) and line["spread_n"] == [130.0, 152.0]
    failed = bench.median_of([{"v": {"error": "boom"}}, {"v": {"error": "again"}}])
    assert failed == {"v": {"error": "boom"}}
