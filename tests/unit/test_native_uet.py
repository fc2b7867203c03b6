"""The compiled UET-like state machines against the Python reference: generated sequences in
every delivery mode, entropy choice and window, with and without receiver credits, over a
network that delays, reorders, loses, duplicates, marks and trims; every emitted packet and
counter compared (tests/unit/differential.py)."""

from __future__ import annotations

import random

import pytest

from tests.unit.differential import BLOCKS, Network, Twin, drive, needs_engine, seeds
from traffic.native import engine
from traffic.transports.packet import Scale, wire_bytes
from traffic.transports.rccc import CreditReceiver
from traffic.transports.uet import UetReceiver, UetSender
from traffic.transports.uet_control import UetConfig

pytestmark = needs_engine
SEQUENCES = 3000


def config(rng: random.Random) -> tuple[UetConfig, Scale]:
    scale = Scale(rng.choice([2e6, 10e6, 100e6]), rng.choice([0.001, 0.004, 0.02]),
                  rng.choice([1000, 1457, 8955]))
    kw = dict(spray=rng.random() < 0.8, delivery=rng.choice(["rud", "rud", "rod", "uud"]),
              nscc=rng.random() < 0.8, rccc=rng.random() < 0.3,
              entropy=rng.choice(["oblivious", "reps", "bitmap"]),
              entropies=rng.choice([1, 4, 64, 128]))
    if rng.random() < 0.5:  # small thresholds and windows: more of every event
        kw.update(reorder_threshold=rng.choice([1, 3, 8]), ack_every=rng.choice([1, 2, 4]),
                  max_bdps=rng.choice([0.5, 1.0, 4.0]), path_slack=rng.choice([0.0, 1.0]),
                  rccc_initial_bdps=rng.choice([0.0, 0.5]))
    return UetConfig.scaled(scale, **kw), scale


def one(seed: int) -> None:
    rng = random.Random(seed)
    cfg, scale = config(rng)
    qp, entropy = (rng.randrange(16), rng.randrange(4)), rng.randrange(64)
    sender = Twin(UetSender(qp, cfg, 0.0, entropy=entropy, rng=random.Random(seed)),
                  engine.UetSender(qp, cfg, 0.0, entropy=entropy, seed=seed))
    receiver = Twin(UetReceiver(qp, cfg), engine.UetReceiver(qp, cfg))
    credit = None
    if cfg.rccc:
        credit = CreditReceiver(scale.rate_bps / 8 * cfg.mss / wire_bytes(cfg.mss),
                                cfg.rccc_window_bytes, cfg.mss, cfg.rccc_initial_bytes)
    offers = [(rng.random() * 20 * scale.base_rtt_s, rng.choice([0, 1, cfg.mss - 1,
                                                                 rng.randrange(40 * cfg.mss)]))
              for _ in range(rng.randrange(1, 5))]
    net = Network.draw(rng, scale.base_rtt_s)
    drive(sender, receiver, rng, net, scale.base_rtt_s, scale.rate_bps, offers,
          until_s=200 * scale.base_rtt_s + 20 * cfg.rto_s, credit=credit)
    for attr in ("summary", "una", "nxt", "describe"):
        sender.same(attr)
    for attr in ("stats", "delivered", "cum", "received_bytes"):
        receiver.same(attr)


@pytest.mark.parametrize("block", range(BLOCKS))
def test_the_compiled_uet_emits_what_the_reference_emits(block):
    for seed in seeds(block, SEQUENCES):
        one(seed)
