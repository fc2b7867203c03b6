"""Bit errors and link-level retry (``fabric.*_link.impair``): the settings, the chance a
frame is hit (as the eBPF program draws it), and their counters in the congestion summary."""

from __future__ import annotations

import pytest

from fabriclab.model import experiment as config
from testbed.errors import ConfigError
from testbed.model.congestion import summarize_congestion
from testbed.model.spec import ImpairSpec

BASE = {"version": 1, "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 1,
                                 "hosts_per_leaf": 2}}


def _fabric(**links):
    return config.parse({**BASE, "fabric": {**BASE["fabric"], **links}}).fabric


def test_an_impaired_link_corrupts_a_frame_by_its_bits_and_needs_the_marker():
    fab = _fabric(fabric_link={"rate_mbps": 20, "impair": {"ber": 1e-6, "llr": True}})
    assert fab.fabric_link.impair == ImpairSpec(1e-6, llr=True) and fab.host_link.impair is None
    assert fab.needs_marker and "BER 1e-06 with LLR" in fab.fabric_link.describe()
    assert ImpairSpec(1e-6).frame_error(1500) == pytest.approx(0.012)
    assert ImpairSpec(1e-3).frame_error(9000) == 1.0


@pytest.mark.parametrize("impair,path", [
    ({"ber": 0.01}, "fabric.host_link.impair.ber"),
    ({"llr": True}, "fabric.host_link.impair.ber"),
    ({"ber": 1e-6, "fec": True}, "fabric.host_link.impair.fec"),
])
def test_bad_impairments_name_the_field(impair, path):
    with pytest.raises(ConfigError) as err:
        _fabric(host_link={"impair": impair})
    assert err.value.path == path, err.value


def test_the_summary_counts_corrupted_frames_their_replays_and_their_drops_on_arrival():
    before = {"leaf1-eth3": {"priorities": {0: {"corrupted": 1, "llr_replays": 1}}},
              "spine1-eth1": {"priorities": {0: {"bad_fcs": 2}}}}
    after = {"leaf1-eth3": {"priorities": {0: {"corrupted": 6, "llr_replays": 6}}},
             "spine1-eth1": {"priorities": {0: {"bad_fcs": 7}}}}
    c = summarize_congestion(before, after, {})
    assert (c["corrupted"], c["llr_replays"], c["bad_fcs_drops"]) == (5, 5, 5)


@pytest.mark.parametrize("llr", [False, True])
def test_a_frame_is_clean_corrupted_or_replayed_by_its_draw_as_the_program_decides(llr):
    impair = ImpairSpec(1e-6, llr=llr)
    assert impair.ber_fe == 10 ** 9
    # 4,200 bytes: 33,600 bits at 1e-6: 33,600 parts per million
    assert impair.outcome(4200, 0) == ("replayed" if llr else "corrupted")
    assert impair.outcome(4200, 33_599) == ("replayed" if llr else "corrupted")
    assert impair.outcome(4200, 33_600) == "clean"
    hits = sum(impair.outcome(1500, d) != "clean" for d in range(0, 1_000_000, 100))
    assert hits / 10_000 == pytest.approx(impair.frame_error(1500), abs=1e-4)
    assert ImpairSpec(1e-3).outcome(9000, 999_999) == "corrupted"  # every frame

