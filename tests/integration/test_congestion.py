"""ECN marking on real switch ports: the kernel's own counters see CE, and marking keeps an
incast's queue from filling and dropping."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.conftest import DATAPATHS, ROOT, experiment

LS = ("version: 1\nfabric:\n  topology: leaf_spine\n  leaves: 2\n  spines: 1\n"
      "  hosts_per_leaf: 4\n  hosts: {ecn: true}\n  queue: {size_kb: 128}\n")


def _nstat(fabric, host: str, counter: str) -> int:
    proc = fabric.spawn(host, ["nstat", "-az", counter], f"nstat:{host}")
    out, _ = proc.communicate(timeout=10)
    fabric.stop(proc)
    (line,) = [l for l in out.splitlines() if l.startswith(counter)]
    return int(line.split()[1])


@DATAPATHS
def test_ecn_capable_tcp_through_a_marked_port_sees_ce(make_fabric, datapath):
    from traffic.agents.runner import run_job

    exp = experiment(LS + "  host_link: {ecn: {mode: step}}\n  fabric_link: {ecn: {mode: step}}\n"
                     "workload:\n  collectives:\n"
                     "    - {op: flows, pattern: incast, fan_in: 2, size: 1MiB}\n", datapath)
    fabric = make_fabric(exp)
    assert fabric.marker is not None and len(fabric.marker.ports) == len(fabric.switch_ports())
    senders = ["h1_2", "h1_3"]
    before = {h: _nstat(fabric, h, "TcpExtTCPDeliveredCE") for h in senders}
    (job,) = exp.workload.jobs
    run_job(fabric, list(job.collectives), timeout_s=60, congestion_control="cubic")
    after = {h: _nstat(fabric, h, "TcpExtTCPDeliveredCE") for h in senders}
    # the senders' kernels count data delivered with CE echoed back: the mark went end to end
    assert all(after[h] > before[h] for h in senders), (before, after)
    marked = sum(c["marked"] for (port, _), c in fabric.marker.counters().items()
                 if port == "leaf1-eth1")  # h1_1's port: where the incast queues
    assert marked > 0


def _run(state_dir, tmp_path, name: str, text: str) -> dict:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           "run", str(path), "--out", str(tmp_path / name), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["congestion"]


def test_marking_keeps_an_incast_queue_from_filling_and_dropping(state_dir, tmp_path):
    workload = ("workload:\n  congestion_control: cubic\n  collectives:\n"
                "    - {op: flows, pattern: incast, fan_in: 3, size: 3MiB}\n")
    lossy = _run(state_dir, tmp_path, "lossy", LS + workload)
    marked = _run(state_dir, tmp_path, "ecn", LS + "  host_link: {ecn: {mode: step}}\n"
                  + workload)
    print("lossy", {k: v for k, v in lossy.items() if k != "ports"})
    print("ecn", {k: v for k, v in marked.items() if k != "ports"})
    # without marking, cubic fills the 128 KiB bfifo until it drops
    assert lossy["drops"] >= 10 and lossy["ecn_marked"] == 0
    assert lossy["queue_max_bytes"] > 0.9 * 128 * 1024
    # with it, the senders back off on CE: only slow start's overshoot still drops (5-10 seen,
    # against 40-53), and the queue's p99 is lower (53-99 KiB seen, against 124 KiB full)
    assert marked["ecn_marked"] > 0 and marked["drops"] * 2 <= lossy["drops"]
    assert marked["queue_p99_bytes"] < lossy["queue_p99_bytes"]
    drift = marked["virtual_queue_drift_bytes"]
    assert drift is not None and drift["mean"] < 48 * 1024  # within ~5 frames of the real queue


def test_dctcp_on_a_kernel_without_it_is_refused_naming_the_field(state_dir, tmp_path):
    from testbed.linux import capabilities

    if "dctcp" in capabilities.probe(state_dir).tcp_congestion:
        import pytest

        pytest.skip("this kernel has dctcp")
    path = tmp_path / "dctcp.yaml"
    path.write_text(LS + "workload:\n  collectives:\n"
                    "    - {op: all_reduce, size: 64KiB, ranks: 2, congestion_control: dctcp}\n")
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           "run", str(path), "--out", str(tmp_path / "out"), "--backend", "host"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "workload job 0.congestion_control: needs TCP congestion control 'dctcp'" in \
        proc.stderr, proc.stdout + proc.stderr  # errors go to stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["complete"] is False and "dctcp" in doc["error"]  # refused before building


#: one switch; h1 sends at 20 Mbit/s into h2's port of 1 Mbit/s (125,000 bytes/s): a burst
#: of 300 KB queues there for over two seconds
SLOW_PORT = ("version: 1\nfabric:\n  topology: custom\n"
             "  nodes: [{name: s1, kind: switch}, {name: h1, kind: host}, {name: h2, kind: host}]\n"
             "  links: [{a: h1, b: s1}, {a: s1, b: h2, rate_mbps: 1}]\n"
             "  host_link: {rate_mbps: 20, ecn: {mode: step}}\n  queue: {size_kb: 1024}\n")
SEND = ("import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "for _ in range(int(sys.argv[2])):\n    s.sendto(bytes(1400), (sys.argv[1], 9))\n")


def test_a_ports_virtual_queue_drains_over_a_gap_longer_than_a_second(make_fabric):
    """The marker's virtual queue (what ECN, trimming and HPCC's INT read) drains at the port's
    rate over however long the port goes without a packet: a one-second cap once kept the
    bytes the real queue sent after the first second, a time-scaled fabric's tails with them."""
    import ctypes
    import time

    fabric = make_fabric(experiment(SLOW_PORT, "ebpf"))
    marker = fabric.marker
    (slow,) = [i for i, (_, rate) in marker.ports.items() if rate == 125_000]
    h2 = next(h.ip for h in fabric.topo.hosts if h.name == "h2")

    def send(count: int) -> None:
        proc = fabric.spawn("h1", [sys.executable, "-c", SEND, h2, str(count)], "send:h1")
        proc.communicate(timeout=30)
        fabric.stop(proc)

    def level() -> tuple[int, int]:
        q = marker.queue.lookup(ctypes.c_uint32(slow))
        return q.level_bytes, q.last_ns

    send(220)  # 308 KB at 20 Mbit/s: 0.13 s on the wire into a port that drains 125 KB/s
    time.sleep(0.3)
    before, then = level()
    assert before > 200_000, before  # the burst is queued (1.6 s of it at least)
    time.sleep(1.6)  # the port gets nothing: longer than a second
    send(1)
    time.sleep(0.2)
    after, now = level()
    drained = (now - then) * 125_000 // 1_000_000_000
    assert now - then > 1.5e9
    # what it held, less 1.6 s at its rate, plus the one frame (1442 bytes on the wire)
    assert abs(after - (before - drained + 1442)) < 1500, (before, after, drained)
