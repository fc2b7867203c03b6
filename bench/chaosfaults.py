"""The chaos bench's faults beyond a signal (bench/chaos.py): what a shared lab machine does to
a run besides killing its parts.

* **twin**: a second ``fabriclab run`` into the same state directory at the same moment: one
  builds, the other is refused by name (both building was the fault);
* **full-disk**: the run's ``--out`` on a 64 KiB tmpfs: a named system error (exit 3), no
  temporary file left, what was written before the disk filled still readable;
* **double-hup**: an ssh session that drops sends SIGHUP twice; the second lands in the
  teardown the first started, which must finish;
* **rogue-switch**: a local client speaks OpenFlow to the controller's port and claims a
  switch's datapath id while the job runs: it must get no OpenFlow answer, the run no harm;
* **squat**: the controller is killed (``controller.restart: true``) and a local process
  tries to bind its port before the new one starts: the port must stay the fabric's.

A round where a rogue got an OpenFlow answer or the controller's port is counted ``rogue``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import yaml

from testbed.runs.registry import Registry

FAULTS = ("twin", "full-disk", "double-hup", "rogue-switch", "squat")
DISK_KB = 64


def start_run(number: int, work: Path, exp_text: str, out: Path, tag: str = "",
              telemetry: bool = True, state: Path | None = None) -> subprocess.Popen:
    """``fabriclab run`` of ``exp_text`` into ``out``, its console in ``work/runN.log``."""
    root = Path(__file__).resolve().parent.parent
    exp = work / f"exp{number}{tag}.yaml"
    exp.write_text(exp_text)
    state = state or work / f"state{number}"
    log = open(work / f"run{number}{tag}.log", "w", encoding="utf-8")  # noqa: SIM115
    run = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                            "run", str(exp), "--out", str(out)]
                           + (["--telemetry"] if telemetry else []),
                           stdout=log, stderr=subprocess.STDOUT, cwd=root,
                           start_new_session=True)
    log.close()
    return run


def wait_job(state: Path, run: subprocess.Popen, timeout_s: float):
    """The run's record once its workload started (a ``job-*.json`` in its run directory);
    None if the run ended or the time ran out first."""
    deadline = time.monotonic() + timeout_s
    while run.poll() is None and time.monotonic() < deadline:
        for record in Registry(state).scan()[0]:
            if any(Path(record.run_dir).glob("job-*.json")):
                return record
        time.sleep(0.1)
    return None


def controller_port(record) -> int | None:
    try:
        return int((Path(record.run_dir) / "controller.port").read_text())
    except (OSError, ValueError):
        return None


def rogue_switch(port: int, dpid: int = 1) -> bool:
    """A local client's OpenFlow 1.5 hello and a features reply claiming ``dpid``: whether it
    got OpenFlow back (it should get nothing, or a TLS alert)."""
    hello = struct.pack("!BBHI", 6, 0, 8, 1)
    features = struct.pack("!BBHIQIBB2xII", 6, 6, 32, 2, dpid, 0, 254, 0, 0, 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            sock.sendall(hello + features)
            answer = sock.recv(64)
    except OSError:
        return False
    return answer[:1] == b"\x06"


def squat(port: int) -> bool:
    """Whether a local process could bind the controller's port (it should be held)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def finish(run: subprocess.Popen, hang_s: float) -> tuple[int, bool]:
    """The run's exit code, and whether it hung (then killed)."""
    try:
        run.wait(hang_s)
        return run.returncode, False
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        return run.returncode, True


def tmp_files(out: Path) -> list[str]:
    """Temporary files a write left behind."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.tmp")) if out.exists() else []


def readable(path: Path) -> bool:
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def restartable(exp_text: str) -> str:
    doc = yaml.safe_load(exp_text)
    doc.setdefault("controller", {})["restart"] = True
    return yaml.safe_dump(doc, sort_keys=False)


def mount_small_disk(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_KB}k,mode=0755", "tmpfs",
                    str(path)], check=True, capture_output=True)


def unmount(path: Path) -> None:
    subprocess.run(["umount", str(path)], check=False, capture_output=True)
