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
    assert native.choose(None) == (UdpEngine, "")  # the default, for now
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
