"""The transports' sans-I/O tests (tests/unit/test_transports.py, test_uet_modes.py) run
again against the compiled state machines: the same scripted networks, fake clocks and
assertions, with the modules' sender and receiver classes swapped for the compiled ones.

A few tests reach into the Python objects' insides (a window object to call, a set of PSNs in
flight to assign); they run against the reference only and are listed in ``INSIDES``."""

from __future__ import annotations

import pytest

from tests.unit import test_transports as transports
from tests.unit import test_uet_modes as modes
from traffic.native import engine

pytestmark = pytest.mark.skipif(engine is None, reason="the compiled engine is not built")

#: tests that use the Python objects' internals, not their interface
INSIDES = {"test_without_nscc_the_window_ignores_the_network",
           "test_a_timeout_frees_a_window_that_a_lost_packet_holds"}


def _compiled(base: type) -> type:
    """The compiled class with the reference's signature (``rng`` instead of ``seed``)."""
    class Compiled(base):
        def __init__(self, qp, cfg, now=None, entropy=0, rng=None):
            self.cfg = cfg
            if now is None:  # a receiver: (qp, cfg)
                super().__init__(qp, cfg)
            elif rng is not None:
                raise NotImplementedError("a compiled sender takes a seed, not a Random")
            else:
                super().__init__(qp, cfg, now, entropy=entropy, seed=1)

    Compiled.__name__ = base.__name__
    return Compiled


@pytest.fixture(autouse=True)
def compiled(monkeypatch, request):
    if request.node.originalname in INSIDES:
        pytest.skip("reaches into the Python objects' insides")
    for module in (transports, modes):
        for name in ("RoceSender", "RoceReceiver", "UetSender", "UetReceiver"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _compiled(getattr(engine, name)))


for _module in (transports, modes):
    for _name in dir(_module):
        if _name.startswith("test_"):
            globals()[_name] = getattr(_module, _name)
