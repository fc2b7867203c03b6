"""How long a link failure interrupts traffic, as a user sees it: a quickstart fabric kept up by
``fabriclab up``, every host of pods 1, 3 and 4 probing every host of pod 2 (fping, one probe
per pair every 20 ms), and ``fabriclab fail core1 agg2_1`` from another process. The outage of
a pair is the longest gap between two of its replies less the probe interval; the worst over
every pair is the number reported (the traffic through core1 and agg2_1 is the one rerouted:
by the switches' own groups where they see the dead port, by the controller elsewhere).

    python bench/failover.py [--datapath ovs|ebpf] [--no-notices] [--stop-controller MS]
                             [--repeat N] [--json]

``--no-notices``: the eBPF switches without their fault notices (``emulator.fault_notices``),
so that only the controller moves the other pods' traffic off core1. ``--stop-controller MS``:
the controller stopped (SIGSTOP) from just before the fail command until MS after it began (a
controller that is busy, slow or far away): what the switches do on their own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.linux.cpu import machine_cpu_s  # noqa: E402
from testbed.model.topology import from_dict  # noqa: E402
from testbed.poll import wait_for  # noqa: E402
from testbed.runs.registry import Registry  # noqa: E402

INTERVAL_MS = 20
PROBE_S = 4.0
FAIL_AT_S = 1.5
REPLY = re.compile(r"^\[(\d+\.\d+)\] (\S+)\s+: \[(\d+)\], \d+ bytes, ([\d.]+) ms")


def experiment(datapath: str, notices: bool = True) -> str:
    """The quickstart's fabric without its workload, on ``datapath`` (the userspace Open vSwitch
    at 10 Mbit/s, within its budget; the probes are what counts)."""
    doc = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    doc.pop("workload", None)
    doc.setdefault("emulator", {})["datapath"] = datapath
    if not notices:
        doc["emulator"]["fault_notices"] = False
    if datapath == "ovs":
        for tier in ("host_link", "fabric_link"):
            doc["fabric"][tier]["rate_mbps"] = 10
    return yaml.safe_dump(doc, sort_keys=False)


def cli(state: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=120, **kw)


def probe(pid: int, targets: list[str], count: int) -> subprocess.Popen:
    return subprocess.Popen(
        ["nsenter", "-t", str(pid), "-n", "fping", "-D", "-p", str(INTERVAL_MS), "-i", "1",
         "-c", str(count), "-t", "500", *targets],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def parse_replies(outputs: dict[str, str]) -> list[tuple[str, str, int, float, float]]:
    """Every reply fping printed: (source, target, sequence number, when it came, its round
    trip in ms)."""
    return [(source, m.group(2), int(m.group(3)), float(m.group(1)), float(m.group(4)))
            for source, text in outputs.items() for line in text.splitlines()
            if (m := REPLY.match(line))]


def replies(parsed: list[tuple]) -> dict[tuple, list[float]]:
    """(source, target) -> when its replies came."""
    times: dict[tuple, list[float]] = {}
    for source, target, _seq, at, _rtt in parsed:
        times.setdefault((source, target), []).append(at)
    return times


def lost_probes(parsed: list[tuple], began: float) -> list[tuple[float, str]]:
    """Each probe without a reply (between a pair's first and last replied ones): when it was
    sent, in ms after ``began`` (its pair's replied probes' send times, one interval apart per
    sequence number), and its pair; in the order sent."""
    sent: dict[tuple, dict[int, float]] = {}
    for source, target, seq, at, rtt in parsed:  # the send's time: the reply's less its RTT
        sent.setdefault((source, target), {})[seq] = at - rtt / 1000
    lost = []
    for (source, target), times in sent.items():
        first = min(times)
        for seq in range(first, max(times)):
            if seq not in times:
                at = times[first] + (seq - first) * INTERVAL_MS / 1000
                lost.append((round((at - began) * 1000, 1), f"{source}->{target}"))
    return sorted(lost)


def late_replies(parsed: list[tuple], began: float, until_s: float = 1.0) -> dict:
    """Whether a gap was the network's or the prober's: over the replies that came from
    ``began`` to ``until_s`` after it, the longest round trip (ms; a packet held in the
    fabric comes back late) and the longest pause between two sends of one prober (ms, a
    send's time being its reply's less its round trip: a prober that could not send)."""
    rtts, sends = [], {}
    for source, _target, _seq, at, rtt in parsed:
        if began <= at <= began + until_s:
            rtts.append(rtt)
            sends.setdefault(source, []).append(at - rtt / 1000)
    pauses = [(b - a) * 1000 for s in map(sorted, sends.values()) for a, b in zip(s, s[1:])]
    return {"rtt_max_ms": round(max(rtts, default=0.0), 1),
            "send_pause_max_ms": round(max(pauses, default=0.0), 1)}


def gap_windows(times: dict[tuple, list[float]], began: float) -> list[tuple[float, float]]:
    """Each interrupted pair's longest gap as (last reply before, first reply after, in ms
    after ``began``; the pair), longest first."""
    out = []
    for pair, stamps in times.items():
        stamps = sorted(stamps)
        spans = [(b - a, a, b) for a, b in zip(stamps, stamps[1:]) if b >= began]
        if spans:
            _, a, b = max(spans)
            if b - a > 2.5 * INTERVAL_MS / 1000:
                out.append((round((a - began) * 1000, 1), round((b - began) * 1000, 1),
                            "->".join(pair)))
    return sorted(out, key=lambda w: w[0] - w[1])


def worst_gaps(times: dict[tuple, list[float]], failed_at: float) -> dict[tuple, float]:
    """(source, target) -> its longest gap between two replies that spans the failure, in ms
    (0 when its replies did not go on past it)."""
    gaps = {}
    for pair, stamps in times.items():
        stamps = sorted(stamps)
        spans = [(b - a) * 1000 for a, b in zip(stamps, stamps[1:]) if b >= failed_at]
        gaps[pair] = max(spans, default=float("inf"))
    return gaps


def controller_status(run_dir: Path) -> dict:
    """The controller's status document (empty where it cannot be read)."""
    try:
        return json.loads((run_dir / "controller-status.json").read_text())
    except (OSError, ValueError):
        return {}


def controller_heard(status: dict, failed_at: float) -> list[dict]:
    """Each reroute of the controller after the fail command began cutting: what caused it,
    when the controller heard of it, sent its changes and had every switch's barrier
    answered, in ms after the command began (its status document, the wall clock)."""
    out = []
    for r in status.get("reroutes", []):
        if r["heard"] < failed_at:
            continue
        heard = (r["heard"] - failed_at) * 1000
        out.append({"cause": r["cause"], "heard_ms": round(heard, 1),
                    "sent_ms": round(heard + r["sent_ms"], 1),
                    "installed_ms": round(heard + max(r["installed_ms"].values(), default=0),
                                          1), "switches": len(r["switches"])})
    return out


def controller_events(status: dict, failed_at: float) -> list[str]:
    """The controller's events (port changes, switches connecting or leaving) from a second
    before the fail command began, each in ms after it: beside a gap that the reroute does
    not explain, what else the controller saw."""
    out = []
    for line in status.get("events", []):
        at, _, text = line.partition(" ")
        try:
            ms = (float(at) - failed_at) * 1000
        except ValueError:
            continue
        if ms >= -1000:
            out.append(f"{ms:.1f} {text}")
    return out


class StallWatch:
    """Whether the machine itself stopped: a thread asks for 1 ms sleeps and keeps the wall
    clock of each wake-up, and the machine's CPU time stolen by its hypervisor every 10 ms. A
    gap between wake-ups far over 1 ms is a stall of this process (scheduling, the kernel, or
    the hypervisor: then the steal grows), beside which the probes' gaps can be read."""

    def __init__(self) -> None:
        self.wakes: list[float] = []
        self.steal: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            self.wakes.append(now)
            if not self.steal or now - self.steal[-1][0] >= 0.01:
                self.steal.append((now, machine_cpu_s()["steal"]))
            time.sleep(0.001)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def report(self, began: float, until_s: float = 1.0) -> dict:
        """The longest gap between wake-ups from 100 ms before ``began`` to ``until_s`` after
        it (ms, and where it began, ms after ``began``), and the CPU time stolen meanwhile."""
        lo, hi = began - 0.1, began + until_s
        wakes = [t for t in self.wakes if lo <= t <= hi]
        gaps = [(b - a, a) for a, b in zip(wakes, wakes[1:])]
        gap, at = max(gaps, default=(0.0, began))
        stolen = [s for t, s in self.steal if lo <= t <= hi]
        return {"longest_wake_gap_ms": round(gap * 1000, 1),
                "at_ms": round((at - began) * 1000, 1),
                "steal_ms": round((stolen[-1] - stolen[0]) * 1000, 1) if stolen else None}


def fail(state: Path, record, stop_ms: float) -> subprocess.CompletedProcess:
    """``fabriclab fail core1 agg2_1``; with ``stop_ms``, the controller stopped from before
    the command starts (a second of Python's start-up) until ``stop_ms`` after the command
    began cutting (its ``--json`` document's ``began``), and continued whatever happens."""
    if not stop_ms:
        return cli(state, "fail", "core1", "agg2_1", "--json")
    pid = next(p.pid for p in record.processes if p.kind.kind == "controller")
    os.kill(pid, signal.SIGSTOP)
    try:
        failed = cli(state, "fail", "core1", "agg2_1", "--json")
        doc = re.search(r"^\{", failed.stdout, re.M)
        began = json.loads(failed.stdout[doc.start():]).get("began", 0.0) if doc else 0.0
        time.sleep(max(0.0, began + stop_ms / 1000 - time.time()))
        return failed
    finally:
        os.kill(pid, signal.SIGCONT)


def once(datapath: str, state: Path, notices: bool = True, stop_ms: float = 0.0) -> dict:
    exp = state / "failover.yaml"
    exp.write_text(experiment(datapath, notices))
    up = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                           "up", str(exp)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, cwd=ROOT)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(up.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("fabric is up" in s for s in said) or up.poll() is not None, 180,
                 "the fabric up")
        if up.poll() is not None:
            raise SystemExit("".join(said)[-3000:])
        record = Registry(state).runs()[0]
        topo = from_dict(json.loads((Path(record.run_dir) / "topology.json").read_text()))
        pids = {p.kind.which: p.pid for p in record.processes if p.kind.is_host}
        hosts = sorted((n for n in topo.nodes.values() if not n.is_switch), key=lambda n: n.name)
        pod2 = [h.ip for h in hosts if h.name.startswith("h2_")]
        sources = [h for h in hosts if h.name.split("_")[0] in ("h1", "h3", "h4")]
        count = int(PROBE_S * 1000 / INTERVAL_MS)
        start = time.time()
        watch = StallWatch()
        probes = {h.name: probe(pids[h.name], pod2, count) for h in sources}
        time.sleep(FAIL_AT_S)
        failed_at = time.time()
        failed = fail(state, record, stop_ms)
        if failed.returncode != 0:
            raise SystemExit(failed.stdout + failed.stderr)
        doc = re.search(r"^\{", failed.stdout, re.M)  # --json's document
        steps = json.loads(failed.stdout[doc.start():]) if doc else {}
        outputs = {name: p.communicate(timeout=60)[0] for name, p in probes.items()}
        watch.stop()
        parsed = parse_replies(outputs)
        times = replies(parsed)
        gaps = worst_gaps(times, failed_at)
        status = controller_status(Path(record.run_dir))
        heard = controller_heard(status, steps.get("began", failed_at))
        events = controller_events(status, steps.get("began", failed_at))
        windows = gap_windows(times, steps.get("began", failed_at))
        stall = watch.report(steps.get("began", failed_at))
        stall.update(late_replies(parsed, steps.get("began", failed_at)))
        lost_at = lost_probes(parsed, steps.get("began", failed_at))
        lost = sum(count - len(t) for t in times.values())
        cli(state, "restore", "core1", "agg2_1")
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=120)
        reader.join(timeout=10)
    worst = max(gaps.items(), key=lambda kv: kv[1])
    hit = sorted(g - INTERVAL_MS for g in gaps.values() if g > 2.5 * INTERVAL_MS)
    return {"datapath": datapath, "fault_notices": notices,
            "controller_stopped_ms": stop_ms, "pairs": len(gaps),
            "pairs_interrupted": len(hit),
            "worst_gap_ms": round(worst[1], 1), "worst_pair": list(worst[0]),
            "outage_ms": round(worst[1] - INTERVAL_MS, 1), "replies_lost": lost,
            "probes": count * len(gaps), "started": start,
            "fail_command_ms": steps.get("took_ms"), "fail_steps_s": steps.get("steps_s"),
            "controller_heard_ms": heard,
            "controller_events_ms": events,
            "gap_windows_ms": windows,
            "machine_stall": stall,
            "lost_probes_sent_ms": lost_at,
            "pair_outages_ms": sorted(round(g - INTERVAL_MS, 1) for g in gaps.values()),
            "median_outage_of_interrupted_ms": round(hit[len(hit) // 2], 1) if hit else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datapath", choices=["ovs", "ebpf"], default="ebpf")
    ap.add_argument("--no-notices", action="store_true",
                    help="the eBPF switches without their fault notices")
    ap.add_argument("--stop-controller", type=float, default=0.0, metavar="MS",
                    help="the controller stopped until MS after the fail command began")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="fabriclab-failover-") as tmp:
            results.append(once(args.datapath, Path(tmp), not args.no_notices,
                                args.stop_controller))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(f"{r['datapath']}: worst outage {r['outage_ms']} ms (worst reply gap "
                  f"{r['worst_gap_ms']} ms) over {r['pairs']} pairs, "
                  f"{r['replies_lost']} of {r['probes']} replies lost "
                  f"({r['pairs_interrupted']} interrupted, median "
                  f"{r['median_outage_of_interrupted_ms']} ms; worst {r['worst_pair']}); "
                  f"the controller heard of the ports down at {r['controller_heard_ms']} ms; "
                  f"this process's longest wake-up gap {r['machine_stall']}")
            if r["gap_windows_ms"]:  # interrupted pairs: what the controller saw meanwhile
                print("  gaps (ms after the cut began): "
                      + "; ".join(f"{a:.0f}-{b:.0f} {pair}" for a, b, pair in
                                  r["gap_windows_ms"][:4])
                      + "\n  controller events: " + "; ".join(r["controller_events_ms"]))


if __name__ == "__main__":
    main()
