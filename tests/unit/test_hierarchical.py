"""Hierarchical schedules for servers of GPUs: bytes per GPU against the formulas, the order of
their phases, rails kept by PXN, and the scale-out bytes the hierarchy saves."""

from __future__ import annotations

import pytest

from traffic.workloads import hierarchical as hier
from traffic.workloads.schedules import build

S, G, SIZE = 4, 4, 16 * 1024 * 1024  # 4 servers x 4 GPUs, 16 MiB


def _split(sched, gpus):
    """Per rank: bytes sent inside its server and over the scale-out network."""
    up, out = {}, {}
    for t in sched.transfers:
        side = up if t.src // gpus == t.dst // gpus else out
        side[t.src] = side.get(t.src, 0) + t.nbytes
    return up, out


def test_hierarchical_all_reduce_bytes_per_gpu_follow_the_formula():
    sched = hier.all_reduce(S, G, SIZE)
    up, out = _split(sched, G)
    n = S * G
    for r in range(n):
        assert up[r] == pytest.approx(2 * (G - 1) / G * SIZE, rel=1e-6)
        assert out[r] == pytest.approx(2 * (S - 1) / (S * G) * SIZE, rel=1e-6)
        assert out[r] and all(t.src % G == t.dst % G for t in sched.transfers
                              if t.src // G != t.dst // G)  # scale-out stays on its rail
    # phases in order: intra-server reduce-scatter, the rails' rings, intra-server all-gather
    steps = {t.step for t in sched.transfers if t.src // G != t.dst // G}
    assert min(steps) == G - 1 and max(steps) == G - 1 + 2 * (S - 1) - 1
    assert sched.steps == 2 * (G - 1) + 2 * (S - 1)
    # a flat ring over the 16 GPUs sends 2 (N-1)/N x size on every link, those between servers
    # included: the hierarchy cuts each NIC's scale-out bytes by about the GPUs per server
    flat = build("all_reduce", n, SIZE, "ring")
    _, flat_out = _split(flat, G)
    assert max(flat_out.values()) / max(out.values()) == pytest.approx(
        (2 * (n - 1) / n) / (2 * (S - 1) / (S * G)), rel=1e-6)
    # the flat ring leaves each server through one NIC; the hierarchy through all of them
    assert len(flat_out) == S and len(out) == S * G


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
def test_hierarchical_halves_move_half_of_the_all_reduce(op):
    sched = getattr(hier, op)(S, G, SIZE)
    up, out = _split(sched, G)
    for r in range(S * G):
        assert up[r] == pytest.approx((G - 1) / G * SIZE, rel=1e-6)
        assert out[r] == pytest.approx((S - 1) / (S * G) * SIZE, rel=1e-6)
    first_out = min(t.step for t in sched.transfers if t.src // G != t.dst // G)
    assert first_out == (G - 1 if op == "reduce_scatter" else 0)


def test_pxn_all_to_all_keeps_scale_out_on_rails_and_delivers_every_byte():
    sched = hier.all_to_all_pxn(S, G, SIZE)
    n = S * G
    direct = build("all_to_all", n, SIZE, "direct")
    cross = [t for t in direct.transfers if t.src // G != t.dst // G and t.src % G != t.dst % G]
    assert cross  # the direct all-to-all crosses rails
    outs = [t for t in sched.transfers if t.src // G != t.dst // G]
    assert all(t.src % G == t.dst % G for t in outs) and {t.step for t in outs} == {1}
    # the same bytes leave each server as with the direct exchange, only on the right rail
    assert hier.scale_out_bytes(sched, G) == hier.scale_out_bytes(direct, G)
    per_peer = SIZE // n
    for dst in range(n):
        over_rail = sum(t.nbytes for t in sched.transfers if t.dst == dst and t.step == 1)
        inside = sum(t.nbytes for t in sched.transfers if t.dst == dst and t.step == 0)
        # from each other server, what all its GPUs have for this one; from the local GPUs,
        # what each has for this GPU's index on every server (its own share, and what it
        # forwards on its rail)
        assert over_rail == (S - 1) * G * per_peer
        assert inside == (G - 1) * S * per_peer
    with pytest.raises(ValueError):
        hier.all_reduce(1, 1, SIZE)
