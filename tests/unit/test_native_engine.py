"""The choice of engine: the compiled one where it is built, the Python one (said in one
line) where it is not, the Python one when asked; and the generator the compiled state
machines draw from is Python's own."""

from __future__ import annotations

import random

import pytest

from tests.unit.differential import needs_engine
from traffic.agents import native
from traffic.agents.engine import UdpEngine


def test_a_machine_without_the_compiled_engine_runs_the_python_one_and_says_so(monkeypatch):
    monkeypatch.setattr(native, "compiled", None)
    monkeypatch.setattr("traffic.native.WHY_NOT", "the compiled transport engine is not built "
                        "(no module named traffic.native._engine)")
    engine_class, why = native.choose({"engine": "native"})
    assert engine_class is UdpEngine
    assert why.startswith("transport engine: python (the compiled transport engine is not "
                          "built") and "\n" not in why
    assert native.choose({"engine": "python"}) == (UdpEngine, "")


@needs_engine
def test_the_compiled_engine_runs_where_it_is_built_unless_python_is_asked():
    assert native.choose(None) == (native.NativeUdpEngine, "")
    assert native.choose({"engine": "native"}) == (native.NativeUdpEngine, "")
    assert native.choose({"engine": "python"}) == (UdpEngine, "")


@needs_engine
@pytest.mark.parametrize("seed", [0, 1, 7, 1000, 2**32 + 5])
def test_the_compiled_generator_draws_what_pythons_random_draws(seed):
    from traffic.native import engine

    rng = random.Random(seed)
    assert engine.rng_draws(seed, 37, 400) == [rng.randrange(37) for _ in range(400)]
    order = list(range(100))
    random.Random(seed).shuffle(order)
    assert engine.rng_shuffled(seed, 100) == order


def test_an_unknown_engine_is_refused_by_name():
    from traffic.transports.options import TransportOptions

    with pytest.raises(ValueError, match="engine 'c': one of native, python"):
        TransportOptions(engine="c")


@needs_engine
def test_the_compiled_engine_counts_lateness_in_the_python_buckets():
    from testbed.plan.delayline import EDGES_US
    from traffic.native import engine

    assert engine.LATENESS_EDGES_US == EDGES_US


#: a process that reads an engine's snapshot from two threads while its completion thread
#: waits and transfers run, handing the GIL over as often as it can; prints "ok" if it ends
SNAPSHOTS_WHILE_WAITING = """
import socket, sys, threading, time
sys.setswitchinterval(1e-6)
from traffic.agents.native import NativeUdpEngine
from traffic.transports.packet import Scale, mss_for

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
ips, scale = ["127.0.0.1", "127.0.0.2"], Scale(200e6, 0.001, mss_for(9000))
a = NativeUdpEngine("uet", 0, ips, port, scale)
b = NativeUdpEngine("uet", 1, ips, port, scale)
for e in (a, b):
    e.start()
until = time.monotonic() + 2.0
def read(e):
    while time.monotonic() < until:
        e.host.snapshot()
readers = [threading.Thread(target=read, args=(e,)) for e in (a, b)]
for t in readers:
    t.start()
while time.monotonic() < until:
    done = threading.Event()
    b.expect(0, 0, 1 << 16, lambda: None)
    a.send(1, 0, 1 << 16, done.set)
    assert done.wait(10)
for t in readers:
    t.join()
for e in (a, b):
    e.close()
print("ok")
"""


@needs_engine
def test_reading_a_snapshot_while_the_completions_are_waited_for_never_deadlocks():
    # A snapshot once took the engine's lock without the GIL and then waited for the GIL,
    # while the completion thread held the GIL and waited for the lock: the agent froze
    # whole (a rank of an incast stuck in the state it had last published). It hung within
    # 3 s in each of three tries; the lock order is now the GIL's first.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run([sys.executable, "-c", SNAPSHOTS_WHILE_WAITING], cwd=root,
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the engine deadlocked: a snapshot against the completion thread's wait")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
