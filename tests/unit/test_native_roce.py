"""The compiled RoCEv2-like state machines against the Python reference: generated sequences
of sends, losses, reordering, duplicates, CE marks, trims and INT, every emitted packet and
counter compared (tests/unit/differential.py)."""

from __future__ import annotations

import random

import pytest

from tests.unit.differential import BLOCKS, Network, Twin, drive, needs_engine, seeds
from traffic.native import engine
from traffic.transports.packet import Scale
from traffic.transports.rocev2 import RoceConfig, RoceReceiver, RoceSender

pytestmark = needs_engine
SEQUENCES = 2500


def config(rng: random.Random) -> tuple[RoceConfig, Scale]:
    scale = Scale(rng.choice([2e6, 10e6, 100e6]), rng.choice([0.001, 0.004, 0.02]),
                  rng.choice([1000, 1457, 8955]))
    cc = rng.choice(["dcqcn", "dcqcn", "hpcc", "swift"])
    profile = rng.choice(["paper", "connectx", "off"])
    cfg = RoceConfig.scaled(scale, profile, cc, spray=rng.random() < 0.3,
                            entropies=rng.choice([1, 4, 64, 256]))
    if rng.random() < 0.5:  # small windows and eager ACKs: more of every event
        cfg = RoceConfig(cfg.mss, cfg.rto_s, rng.choice([2, 8, 16]), rng.choice([1, 2, 4]),
                         cfg.ack_delay_s, cfg.cnp_interval_s, dcqcn=cfg.dcqcn,
                         spray=cfg.spray, entropies=cfg.entropies,
                         line_rate_bps=cfg.line_rate_bps, hpcc=cfg.hpcc, swift=cfg.swift)
    return cfg, scale


def one(seed: int) -> None:
    rng = random.Random(seed)
    cfg, scale = config(rng)
    qp, entropy, qp_seed = (rng.randrange(16), rng.randrange(4)), rng.randrange(64), seed
    sender = Twin(RoceSender(qp, cfg, 0.0, entropy=entropy, rng=random.Random(qp_seed)),
                  engine.RoceSender(qp, cfg, 0.0, entropy=entropy, seed=qp_seed))
    receiver = Twin(RoceReceiver(qp, cfg), engine.RoceReceiver(qp, cfg))
    offers = [(rng.random() * 20 * scale.base_rtt_s, rng.choice([0, 1, cfg.mss - 1,
                                                                 rng.randrange(30 * cfg.mss)]))
              for _ in range(rng.randrange(1, 5))]
    net = Network.draw(rng, scale.base_rtt_s)
    drive(sender, receiver, rng, net, scale.base_rtt_s, scale.rate_bps, offers,
          until_s=200 * scale.base_rtt_s + 10 * cfg.rto_s)
    for attr in ("summary", "una", "nxt", "high", "rate_bps", "describe"):
        sender.same(attr)
    for attr in ("stats", "delivered", "expected"):
        receiver.same(attr)


@pytest.mark.parametrize("block", range(BLOCKS))
def test_the_compiled_rocev2_emits_what_the_reference_emits(block):
    for seed in seeds(block, SEQUENCES):
        one(seed)
