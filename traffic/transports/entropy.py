"""The sender's choice of entropy (pure, sans-I/O): which of a queue pair's ``entropies`` values
each sprayed packet carries, and so (through the switches' hash of its source port) which path
it takes. UEC 1.0 names three, and its reference simulator (uet-htsim, ``uec_mp.cpp``) models
them; these follow that model's rules:

* ``oblivious``: every entropy in turn, in an order drawn afresh at each wrap; feedback is
  ignored (spraying evenly, blind to congestion);
* ``reps`` (recycled entropy packet spraying): the first ``entropies`` packets explore (a random
  entropy each), then the entropies acknowledged without congestion are reused, oldest first;
  with none in hand a random one is explored. An entropy that came back congested (CE, or
  the sender's own evidence of a queue) is simply not recycled;
* ``bitmap``: the oblivious order, skipping entropies that carry a penalty. Congestion feedback
  adds to an entropy's penalty (CE 1, a NACK or a loss 4, a timeout the most, 15), and each
  time the order passes a penalised entropy it skips it and takes one off (so a path marked
  once is skipped once).

Counters for the job's results: ``entropies_recycled`` (packets sent on a recycled entropy),
``entropies_explored`` (packets sent on a fresh draw or the next in order) and
``entropies_penalised`` (feedback events that added a penalty or withheld a recycle).
"""

from __future__ import annotations

import enum
import random
from collections import deque

#: the choices, as ``transport: {kind: uet, entropy: ...}`` names them
ENTROPY_CHOICES = ("oblivious", "reps", "bitmap")
#: bitmap: the penalty each kind of feedback adds, and the most an entropy holds (htsim's)
PENALTY_ECN, PENALTY_NACK, MAX_PENALTY = 1, 4, 15


class Feedback(enum.Enum):
    """What came back about a packet sent on an entropy."""

    GOOD = "good"  # acknowledged, no congestion seen
    ECN = "ecn"  # acknowledged with CE (or over the flow's delay slack)
    NACK = "nack"  # trimmed, or declared lost
    TIMEOUT = "timeout"  # in flight when the retransmission timer fired


class EntropyChoice:
    """The shared counters; subclasses choose."""

    def __init__(self, entropies: int, rng: random.Random) -> None:
        if entropies < 1:
            raise ValueError(f"entropies must be at least 1, got {entropies}")
        self.entropies = entropies
        self.rng = rng
        self.recycled = self.explored = self.penalised = 0

    def choose(self) -> int:
        raise NotImplementedError

    def feedback(self, entropy: int, what: Feedback) -> None:
        """What an acknowledgement, NACK or timeout said about a packet sent on ``entropy``."""

    def counters(self) -> dict[str, int]:
        return {"entropies_recycled": self.recycled, "entropies_explored": self.explored,
                "entropies_penalised": self.penalised}


class Oblivious(EntropyChoice):
    """Every entropy once per round, in a random order drawn again at each wrap."""

    def __init__(self, entropies: int, rng: random.Random) -> None:
        super().__init__(entropies, rng)
        self.order: list[int] = []
        self.index = 0

    def _next_in_order(self) -> int:
        if self.index >= len(self.order):
            self.order = list(range(self.entropies))
            self.rng.shuffle(self.order)
            self.index = 0
        entropy = self.order[self.index]
        self.index += 1
        return entropy

    def choose(self) -> int:
        self.explored += 1
        return self._next_in_order()


class Reps(EntropyChoice):
    """Recycled entropies (see the module docstring)."""

    def __init__(self, entropies: int, rng: random.Random) -> None:
        super().__init__(entropies, rng)
        self.good: deque[int] = deque(maxlen=entropies)

    def choose(self) -> int:
        if self.good and self.explored >= self.entropies:
            self.recycled += 1
            return self.good.popleft()
        self.explored += 1
        return self.rng.randrange(self.entropies)

    def feedback(self, entropy: int, what: Feedback) -> None:
        if what is Feedback.GOOD:
            self.good.append(entropy)
        else:
            self.penalised += 1


class Bitmap(Oblivious):
    """The oblivious order, skipping penalised entropies (see the module docstring)."""

    def __init__(self, entropies: int, rng: random.Random) -> None:
        super().__init__(entropies, rng)
        self.penalty = [0] * entropies

    def choose(self) -> int:
        self.explored += 1
        entropy = self._next_in_order()
        first = True
        for _ in range(self.entropies):  # at most one round: all penalised, take the next
            if not self.penalty[entropy]:
                break
            if first:  # passing a penalised entropy takes one off its penalty (htsim's rule)
                self.penalty[entropy] -= 1
                first = False
            entropy = self._next_in_order()
        return entropy

    def feedback(self, entropy: int, what: Feedback) -> None:
        add = {Feedback.ECN: PENALTY_ECN, Feedback.NACK: PENALTY_NACK,
               Feedback.TIMEOUT: MAX_PENALTY}.get(what, 0)
        if add:
            self.penalised += 1
            slot = entropy % self.entropies
            self.penalty[slot] = min(MAX_PENALTY, self.penalty[slot] + add)


def make(kind: str, entropies: int, rng: random.Random) -> EntropyChoice:
    """The choice named ``kind`` (one of :data:`ENTROPY_CHOICES`).

    Raises:
        ValueError: another name, naming the choices.
    """
    choices = {"oblivious": Oblivious, "reps": Reps, "bitmap": Bitmap}
    if kind not in choices:
        raise ValueError(f"entropy {kind!r}: one of {', '.join(ENTROPY_CHOICES)}")
    return choices[kind](entropies, rng)
