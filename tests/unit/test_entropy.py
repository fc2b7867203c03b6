"""The sender's choice of entropy (traffic.transports.entropy): oblivious, REPS and the bitmap,
as UEC's reference simulator states their rules."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traffic.transports import entropy as ent
from traffic.transports.entropy import Feedback


def test_oblivious_sends_every_entropy_once_per_round_in_a_fresh_order():
    choice = ent.make("oblivious", 8, random.Random(1))
    rounds = [[choice.choose() for _ in range(8)] for _ in range(3)]
    assert all(sorted(r) == list(range(8)) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # drawn again at each wrap
    choice.feedback(rounds[0][0], Feedback.TIMEOUT)  # blind to feedback
    assert sorted(choice.choose() for _ in range(8)) == list(range(8))
    assert choice.counters() == {"entropies_recycled": 0, "entropies_explored": 32,
                                 "entropies_penalised": 0}


def test_bitmap_skips_a_penalised_entropy_and_takes_one_off_each_pass():
    choice = ent.make("bitmap", 4, random.Random(2))
    choice.feedback(1, Feedback.ECN)
    choice.feedback(2, Feedback.NACK)
    assert choice.penalty == [0, 1, ent.PENALTY_NACK, 0]
    sent = [choice.choose() for _ in range(40)]
    # entropy 1 is skipped once, 2 four times (when the order first meets them)
    counts = {e: sent.count(e) for e in range(4)}
    assert counts[1] < counts[0] and counts[2] < counts[1], counts
    assert choice.penalty == [0, 0, 0, 0]
    choice.feedback(3, Feedback.TIMEOUT)
    choice.feedback(3, Feedback.TIMEOUT)
    assert choice.penalty[3] == ent.MAX_PENALTY and choice.penalised == 4


def test_bitmap_with_every_entropy_penalised_still_sends():
    choice = ent.make("bitmap", 4, random.Random(3))
    for e in range(4):
        choice.feedback(e, Feedback.TIMEOUT)
    assert choice.choose() in range(4)


def test_reps_explores_first_then_recycles_the_good_oldest_first():
    choice = ent.make("reps", 4, random.Random(4))
    first = [choice.choose() for _ in range(4)]
    for e in first[:3]:
        choice.feedback(e, Feedback.GOOD)
    choice.feedback(first[3], Feedback.NACK)
    assert [choice.choose() for _ in range(3)] == first[:3]
    assert choice.counters() == {"entropies_recycled": 3, "entropies_explored": 4,
                                 "entropies_penalised": 1}


@given(kind=st.sampled_from(ent.ENTROPY_CHOICES), n=st.integers(1, 64),
       events=st.lists(st.tuples(st.integers(0, 200), st.sampled_from(list(Feedback))),
                       max_size=60), seed=st.integers(0, 99))
def test_every_choice_stays_in_range_and_counts_every_packet(kind, n, events, seed):
    choice = ent.make(kind, n, random.Random(seed))
    for e, what in events:
        assert 0 <= choice.choose() < n
        choice.feedback(e % n, what)
    c = choice.counters()
    assert c["entropies_recycled"] + c["entropies_explored"] == len(events)


def test_an_unknown_choice_is_named():
    with pytest.raises(ValueError, match="oblivious, reps, bitmap"):
        ent.make("random", 8, random.Random(0))
    with pytest.raises(ValueError, match="at least 1"):
        ent.make("reps", 0, random.Random(0))
