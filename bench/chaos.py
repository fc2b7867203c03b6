"""Chaos as a benchmark: rounds of a quickstart run (``fabriclab run --telemetry``), each with a
random signal (TERM, KILL, HUP) to a random part of it (the orchestrator, the controller, a
traffic agent, a private vswitchd, the Prometheus server) at a random time, or one of the
faults of a shared machine (bench/chaosfaults.py: a second run at once, a full disk under
``--out``, a double SIGHUP in teardown, a rogue OpenFlow client, the controller's port
squatted during a restart), then ``fabriclab clean`` where the orchestrator could not tear
down (it was SIGKILLed, or hung).
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
  round left broke it);
* **rogue**: a rogue OpenFlow client answered, or the controller's port taken, or a run
  harmed by either;
* **lost**: results written before a fault unreadable afterwards, or a temporary file left.

    python bench/chaos.py [--rounds N] [--seed S] [--json FILE]
    python bench/chaos.py --start N [--json FILE]

``--start N`` plays N rounds of a stop signal (HUP, TERM, INT in turn) to the orchestrator at
moments spread evenly over its first 4 s: its imports, the handlers' installation, the
live-run check and the build.

Needs root, Open vSwitch running and Prometheus (what ``make setup`` installs). A 10-round
version and a 12-round ``--start`` run in ``make test`` (tests/integration/test_chaos.py).
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

from bench import chaosfaults as cf  # noqa: E402
from fabriclab.model.document import RunDocument  # noqa: E402
from fabriclab.rundirs import read_document  # noqa: E402
from testbed.runs.leaks import leaked, machine_state  # noqa: E402
from testbed.runs.registry import Registry, proc_start_time  # noqa: E402

PARTS = ("orchestrator", "controller", "agent", "vswitchd", "prometheus")
SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "HUP": signal.SIGHUP}
STOPS = {"HUP": signal.SIGHUP, "TERM": signal.SIGTERM, "INT": signal.SIGINT}
START_SPREAD_S = 4.0  # --start: the stops' moments spread over the orchestrator's first 4 s
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
    rogue: bool = False  # a rogue was answered, took the port, or harmed the run
    lost: bool = False  # results written before the fault unreadable, or a temporary file left

    @property
    def ok(self) -> bool:
        return not (self.hang or self.silent or self.next_run_failure or self.leaks
                    or self.rogue or self.lost)


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
        os.kill(target[0], {**SIGNALS, **STOPS}[sig])
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
    return _settle(rnd, state, baseline)


def _settle(rnd: Round, state: Path, baseline: dict) -> Round:
    """The machine compared with ``baseline`` (a little while for processes to end), then
    cleaned for the next round whatever this one left."""
    deadline = time.monotonic() + 15
    while True:  # a process's end may trail its parent's exit a little
        rnd.leaks = leaked(baseline, machine_state())
        if not rnd.leaks or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    if rnd.leaks:  # the next round starts clean, whatever this one left
        _cli(state, "clean")
    return rnd


def play_fault(number: int, fault: str, datapath: str, delay_s: float, work: Path,
               baseline: dict) -> Round:
    """One round of a shared machine's fault (:mod:`bench.chaosfaults`)."""
    rnd = Round(number, fault, "-", datapath, round(delay_s, 2))
    state, text = work / f"state{number}", experiment(datapath)
    began = time.monotonic()
    try:
        _fault(rnd, number, fault, delay_s, work, state, text)
    finally:
        rnd.exit_s = round(time.monotonic() - began, 2)  # (from the round's start)
    return _settle(rnd, state, baseline)


def _fault(rnd: Round, number: int, fault: str, delay_s: float, work: Path, state: Path,
           text: str) -> None:
    if fault == "twin":
        runs = [cf.start_run(number, work, text, work / f"out{number}{t}", t, state=state)
                for t in "ab"]
        ends = [cf.finish(r, START_S + HANG_S) for r in runs]
        rnd.delivered, rnd.hang = True, any(h for _, h in ends)
        rnd.exit_code = max(c for c, _ in ends)
        logs = [(work / f"run{number}{t}.log").read_text(errors="replace") for t in "ab"]
        refused = [log for log in logs if "another fabric is up" in log]
        rnd.said = "one refused: another fabric is up" if refused else ""
        rnd.silent = sorted(c for c, _ in ends) != [0, 3] or len(refused) != 1
    elif fault == "full-disk":
        rnd.delivered = True
        _full_disk(rnd, number, work, text)
    else:
        if fault == "squat":
            text = cf.restartable(text)
        run = cf.start_run(number, work, text, work / f"out{number}", state=state)
        record = cf.wait_job(state, run, START_S)
        if record is not None:
            time.sleep(delay_s)
            rnd.delivered = run.poll() is None
        if rnd.delivered:
            _deliver(rnd, fault, run, record)
        rnd.exit_code, rnd.hang = cf.finish(run, HANG_S)
        if rnd.delivered and fault != "double-hup" and rnd.exit_code != 0:  # harmed by it
            rnd.rogue = True
        if not rnd.delivered and rnd.exit_code != 0:
            rnd.next_run_failure = True
        doc = read_document(work / f"out{number}" / "results.json")
        if fault == "squat" and doc is not None:
            rnd.said = _said("controller", doc)
        if rnd.hang:
            _cli(state, "clean")
            rnd.cleaned = True


def _deliver(rnd: Round, fault: str, run: subprocess.Popen, record) -> None:
    """The fault of a running job: two SIGHUPs a moment apart, a rogue switch, or the
    controller killed and its port tried."""
    if fault == "double-hup":
        os.kill(run.pid, signal.SIGHUP)
        time.sleep(0.3)  # the teardown has begun
        os.kill(run.pid, signal.SIGHUP)
        return
    port = cf.controller_port(record)
    if port is None:
        rnd.rogue, rnd.said = True, "no controller port to try"
        return
    if fault == "rogue-switch":
        rnd.rogue = cf.rogue_switch(port)
        rnd.said = "the rogue got OpenFlow" if rnd.rogue else "the rogue got no OpenFlow"
        return
    ctl = next((p for p in record.processes if p.kind.kind == "controller" and p.alive()), None)
    if ctl is None:
        rnd.rogue, rnd.said = True, "no controller to kill"
        return
    os.kill(ctl.pid, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and not rnd.rogue:
        rnd.rogue = cf.squat(port)
        time.sleep(0.01)


def _full_disk(rnd: Round, number: int, work: Path, text: str) -> None:
    """A run whose ``--out`` fills a small tmpfs, beside an earlier result on it."""
    disk = work / f"disk{number}"
    cf.mount_small_disk(disk)
    try:
        earlier = disk / "earlier.json"
        earlier.write_text(json.dumps({"complete": True}))
        run = cf.start_run(number, work, text, disk / "out", telemetry=False)
        rnd.exit_code, rnd.hang = cf.finish(run, START_S + HANG_S)
        log = (work / f"run{number}.log").read_text(errors="replace")
        rnd.said = next((line for line in log.splitlines() if "No space left" in line), "")
        rnd.silent = not (rnd.exit_code == 3 and rnd.said and "internal error" not in log)
        first = disk / "out" / "results.json"
        rnd.lost = (not cf.readable(earlier) or bool(cf.tmp_files(disk / "out"))
                    or (first.exists() and not cf.readable(first)))
        rnd.said = rnd.said[:300]
    finally:
        cf.unmount(disk)


def schedule(rounds: int, seed: int) -> list[tuple[str, str, str, float]]:
    """(part, signal, datapath, delay) of each round: every part and fault in turn
    (shuffled), a random signal and delay; a vswitchd exists on the Open vSwitch datapath
    only. A fault's signal is ``-``."""
    rng = random.Random(seed)
    parts = list(PARTS) + list(cf.FAULTS)
    rng.shuffle(parts)
    out = []
    for i in range(rounds):
        part = parts[i % len(parts)]
        datapath = "ovs" if part == "vswitchd" else rng.choice(["ovs", "ebpf"])
        delay = rng.uniform(0.0, 6.0) if part == "orchestrator" else rng.uniform(0.0, 2.0)
        sig = rng.choice(sorted(SIGNALS))
        out.append((part, "-" if part in cf.FAULTS else sig, datapath, delay))
    return out


def start_schedule(rounds: int) -> list[tuple[str, str, str, float]]:
    """``--start``: a stop signal to the orchestrator at moments spread evenly over its first
    :data:`START_SPREAD_S`, the stops in turn, on the eBPF datapath."""
    stops = sorted(STOPS)
    return [("orchestrator", stops[i % len(stops)], "ebpf", START_SPREAD_S * i / rounds)
            for i in range(rounds)]


def table(rounds: list[Round]) -> list[dict]:
    """Counts by part and signal."""
    rows = {}
    for r in rounds:
        row = rows.setdefault((r.part, r.signal), {"part": r.part, "signal": r.signal,
                                                   "rounds": 0, "delivered": 0,
                                                   "survived": 0, "leaks": 0,
                                                   "hangs": 0, "silent": 0,
                                                   "next_run_failures": 0, "rogue": 0,
                                                   "lost": 0, "exits": {}})
        row["rounds"] += 1
        row["delivered"] += r.delivered
        row["survived"] += r.survived
        row["leaks"] += bool(r.leaks)
        row["hangs"] += r.hang
        row["silent"] += r.silent
        row["next_run_failures"] += r.next_run_failure
        row["rogue"] += r.rogue
        row["lost"] += r.lost
        row["exits"][str(r.exit_code)] = row["exits"].get(str(r.exit_code), 0) + 1
    return [rows[k] for k in sorted(rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--start", type=int, metavar="N",
                        help="instead: N stop signals to the orchestrator over its first "
                             f"{START_SPREAD_S:g} s")
    parser.add_argument("--json", type=Path, help="write every round and the table here")
    args = parser.parse_args(argv)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:  # started under nohup: the runs
        # it starts get SIGHUP as a terminal gives it (a handler is not inherited across
        # exec; an ignored signal is, and fabriclab then keeps ignoring it)
        signal.signal(signal.SIGHUP, lambda _signum, _frame: None)
    plan = start_schedule(args.start) if args.start else schedule(args.rounds, args.seed)
    args.rounds = len(plan)
    baseline = machine_state()
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="fabriclab-chaos-") as tmp:
        for i, (part, sig, datapath, delay) in enumerate(plan):
            rnd = (play_fault(i, part, datapath, delay, Path(tmp), baseline)
                   if part in cf.FAULTS else play(i, part, sig, datapath, delay, Path(tmp),
                                                  baseline))
            rounds.append(rnd)
            what = part if sig == "-" else f"SIG{sig} to the {part}"
            print(f"round {i + 1}/{args.rounds}: {what} ({datapath}) after "
                  f"{rnd.delay_s:.1f} s: exit {rnd.exit_code} in {rnd.exit_s} s"
                  + ("" if rnd.delivered else " (not delivered)")
                  + (" (it survived the signal)" if rnd.survived else "")
                  + (f"; leaks {rnd.leaks}" if rnd.leaks else "")
                  + ("; HANG" if rnd.hang else "") + ("; SILENT" if rnd.silent else "")
                  + ("; NEXT-RUN FAILURE" if rnd.next_run_failure else "")
                  + ("; ROGUE" if rnd.rogue else "") + ("; LOST" if rnd.lost else "")
                  + (f"; said: {rnd.said[:160]}" if rnd.said else ""), flush=True)
            if not rnd.ok:  # the round's output and any traceback fabriclab kept
                for log in sorted(Path(tmp).glob(f"run{i}*.log")) + sorted(
                        Path(tmp).glob(f"state{i}/errors/*.txt")):
                    print(log.read_text(errors="replace")[-3000:])
    rows = table(rounds)
    totals = {k: sum(r[k] for r in rows) for k in ("rounds", "delivered", "survived", "leaks",
                                                     "hangs", "silent", "next_run_failures",
                                                     "rogue", "lost")}
    print(json.dumps(totals))
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "totals": totals, "table": rows,
                                         "rounds": [asdict(r) for r in rounds]}, indent=1))
    bad = sum(totals[k] for k in ("leaks", "hangs", "silent", "next_run_failures", "rogue",
                                  "lost"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
