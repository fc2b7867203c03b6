"""Chaos as a benchmark: rounds of a quickstart run (``fabriclab run --telemetry``), each with a
random signal (TERM, KILL, HUP) to a random part of it (the orchestrator, the controller, a
traffic agent, a private vswitchd, the Prometheus server) at a random time, then
``fabriclab clean`` where the orchestrator could not tear down (it was SIGKILLed, or hung).
After each round the machine is compared with what it was before: every namespace, interface,
bridge, BPF pin, process and container left is a leak.

Counted, by part and signal:

* **leaks**: anything left after the round (and its ``clean``, where one was needed);
* **hangs**: no exit within 60 s of the fault;
* **silent faults**: the part died, the run exited 0 and ``results.json`` says nothing of it
  (a dead controller's events, Prometheus's error, a lost vswitchd, a failed job); a part that
  takes the signal and lives (Prometheus reloads its configuration on SIGHUP, a vswitchd
  reopens its log) is counted as ``survived``;
* **next-run failures**: a run that failed before its fault was delivered (what an earlier
  round left broke it).

    python bench/chaos.py [--rounds N] [--seed S] [--json FILE]

Needs root, Open vSwitch running and Prometheus (what ``make setup`` installs). The 6-round
version runs in ``make test`` (tests/integration/test_chaos.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabriclab.model.document import RunDocument  # noqa: E402
from fabriclab.rundirs import read_document  # noqa: E402
from testbed.runs.leaks import leaked, machine_state  # noqa: E402
from testbed.runs.registry import Registry, proc_start_time  # noqa: E402

PARTS = ("orchestrator", "controller", "agent", "vswitchd", "prometheus")
SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "HUP": signal.SIGHUP}
HANG_S = 60.0  # a run that has not exited this long after its fault hangs
START_S = 120.0  # the longest a run may take to reach the point its fault waits for


def experiment(datapath: str) -> str:
    """The quickstart's fabric running one short all-reduce (about 4 s on either datapath)."""
    doc = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    rate = 10 if datapath == "ovs" else 100
    for tier in ("host_link", "fabric_link"):
        doc["fabric"].setdefault(tier, {})["rate_mbps"] = rate
    doc.setdefault("emulator", {})["datapath"] = datapath
    doc["workload"] = {"collectives": [{"op": "all_reduce", "size": f"{rate // 5}MiB"}]}
    doc.pop("variants", None)
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class Round:
    """One round: where the fault went and what came of it."""

    number: int
    part: str
    signal: str
    datapath: str
    delay_s: float
    delivered: bool = False
    survived: bool = False  # the part took the signal and lived (Prometheus reloads on HUP)
    exit_code: int | None = None
    exit_s: float | None = None  # from the fault to the run's exit
    hang: bool = False
    silent: bool = False
    next_run_failure: bool = False
    cleaned: bool = False
    leaks: dict = field(default_factory=dict)
    said: str = ""  # what results.json or the console said of the fault

    @property
    def ok(self) -> bool:
        return not (self.hang or self.silent or self.next_run_failure or self.leaks)


def _cli(state: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=180, **kw)


def _target(state: Path, part: str, run: subprocess.Popen) -> tuple[int, int] | None:
    """The (PID, start time) of ``part`` once the run's workload started (the orchestrator at
    once); None while not there."""
    if part == "orchestrator":
        start = proc_start_time(run.pid)
        return (run.pid, start) if start is not None else None
    for record in Registry(state).runs():
        if not any(Path(record.run_dir).glob("job-*.json")):
            continue
        for proc in record.processes:
            if _is(part, proc.role) and proc.alive():
                return proc.pid, proc.start
    return None


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for its parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _is(part: str, role: str) -> bool:
    """Whether a run record's process ``role`` is of ``part``."""
    kind = role.split(":")[0]
    if part == "vswitchd":
        return kind == "ovs" and role.endswith("ovs-vswitchd")
    return kind == part


def _said(part: str, doc: RunDocument | None) -> str:
    """What the run recorded of a fault in ``part`` (empty: nothing, or no document)."""
    if doc is None:
        return ""
    if part == "controller" and doc.controller and doc.controller.events:
        return "; ".join(f"{e.event}: {e.cause or ''}" for e in doc.controller.events)
    if part == "prometheus" and doc.telemetry and doc.telemetry.errors:
        return "; ".join(doc.telemetry.errors)
    if part == "vswitchd":
        lost = [r for r in (doc.fidelity.reasons if doc.fidelity else ()) if "vswitchd" in r]
        if lost:
            return "; ".join(lost)
    if not doc.complete or doc.error:
        return "incomplete: " + (doc.error or "")[:300]
    return ""


def play(number: int, part: str, sig: str, datapath: str, delay_s: float, work: Path,
         baseline: dict) -> Round:
    """One round, from a clean machine back to one."""
    rnd = Round(number, part, sig, datapath, round(delay_s, 2))
    state, out = work / f"state{number}", work / f"out{number}"
    exp = work / f"exp{number}.yaml"
    exp.write_text(experiment(datapath))
    log = open(work / f"run{number}.log", "w", encoding="utf-8")  # noqa: SIM115 - the child's
    run = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                            "run", str(exp), "--out", str(out), "--telemetry"],
                           stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                           start_new_session=True)
    log.close()
    deadline = time.monotonic() + START_S
    target = None
    while run.poll() is None and time.monotonic() < deadline:
        target = _target(state, part, run)
        if target is not None:
            break
        time.sleep(0.1)
    if target is not None:
        time.sleep(delay_s)
    faulted_at = time.monotonic()
    if target is not None and run.poll() is None and proc_start_time(target[0]) == target[1]:
        os.kill(target[0], SIGNALS[sig])
        rnd.delivered = True
        if part != "orchestrator":  # (its exit, tearing down, is what is measured)
            time.sleep(0.5)
            rnd.survived = proc_start_time(target[0]) == target[1] and _alive(target[0])
    try:
        run.wait(HANG_S)
    except subprocess.TimeoutExpired:
        rnd.hang = True
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    rnd.exit_code = run.returncode
    rnd.exit_s = round(time.monotonic() - faulted_at, 2)
    if not rnd.delivered and run.returncode != 0:
        rnd.next_run_failure = True  # it failed on its own: what an earlier round left?
    doc = read_document(out / "results.json")
    rnd.said = _said(part, doc) if rnd.delivered else ""
    if rnd.delivered and not rnd.survived and run.returncode == 0 and not rnd.said:
        rnd.silent = True
    if rnd.hang or (part == "orchestrator" and sig == "KILL" and rnd.delivered):
        _cli(state, "clean")
        rnd.cleaned = True
    deadline = time.monotonic() + 15
    while True:  # a process's end may trail its parent's exit a little
        rnd.leaks = leaked(baseline, machine_state())
        if not rnd.leaks or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    if rnd.leaks:  # the next round starts clean, whatever this one left
        _cli(state, "clean")
    return rnd


def schedule(rounds: int, seed: int) -> list[tuple[str, str, str, float]]:
    """(part, signal, datapath, delay) of each round: every part in turn (shuffled), a random
    signal and delay; a vswitchd exists on the Open vSwitch datapath only."""
    rng = random.Random(seed)
    parts = list(PARTS)
    rng.shuffle(parts)
    out = []
    for i in range(rounds):
        part = parts[i % len(parts)]
        datapath = "ovs" if part == "vswitchd" else rng.choice(["ovs", "ebpf"])
        delay = rng.uniform(0.0, 6.0) if part == "orchestrator" else rng.uniform(0.0, 2.0)
        out.append((part, rng.choice(sorted(SIGNALS)), datapath, delay))
    return out


def table(rounds: list[Round]) -> list[dict]:
    """Counts by part and signal."""
    rows = {}
    for r in rounds:
        row = rows.setdefault((r.part, r.signal), {"part": r.part, "signal": r.signal,
                                                   "rounds": 0, "delivered": 0,
                                                   "survived": 0, "leaks": 0,
                                                   "hangs": 0, "silent": 0,
                                                   "next_run_failures": 0, "exits": {}})
        row["rounds"] += 1
        row["delivered"] += r.delivered
        row["survived"] += r.survived
        row["leaks"] += bool(r.leaks)
        row["hangs"] += r.hang
        row["silent"] += r.silent
        row["next_run_failures"] += r.next_run_failure
        row["exits"][str(r.exit_code)] = row["exits"].get(str(r.exit_code), 0) + 1
    return [rows[k] for k in sorted(rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--json", type=Path, help="write every round and the table here")
    args = parser.parse_args(argv)
    baseline = machine_state()
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="fabriclab-chaos-") as tmp:
        for i, (part, sig, datapath, delay) in enumerate(schedule(args.rounds, args.seed)):
            rnd = play(i, part, sig, datapath, delay, Path(tmp), baseline)
            rounds.append(rnd)
            print(f"round {i + 1}/{args.rounds}: SIG{sig} to the {part} ({datapath}) after "
                  f"{rnd.delay_s:.1f} s: exit {rnd.exit_code} in {rnd.exit_s} s"
                  + ("" if rnd.delivered else " (not delivered)")
                  + (" (it survived the signal)" if rnd.survived else "")
                  + (f"; leaks {rnd.leaks}" if rnd.leaks else "")
                  + ("; HANG" if rnd.hang else "") + ("; SILENT" if rnd.silent else "")
                  + ("; NEXT-RUN FAILURE" if rnd.next_run_failure else "")
                  + (f"; said: {rnd.said[:160]}" if rnd.said else ""), flush=True)
            if rnd.next_run_failure or rnd.hang:
                print((Path(tmp) / f"run{i}.log").read_text(errors="replace")[-3000:])
    rows = table(rounds)
    totals = {k: sum(r[k] for r in rows) for k in ("rounds", "delivered", "survived", "leaks",
                                                     "hangs", "silent", "next_run_failures")}
    print(json.dumps(totals))
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "totals": totals, "table": rows,
                                         "rounds": [asdict(r) for r in rounds]}, indent=1))
    bad = totals["leaks"] + totals["hangs"] + totals["silent"] + totals["next_run_failures"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
