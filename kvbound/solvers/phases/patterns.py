"""The admission-pattern search: schedules from an order of the requests and a batch before which each
is not admitted, served by an ordered unified preset (`OrderedScheduler`) and offered to the ledger
(docs/formulation.md, "The admission-pattern search")."""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from ...bounds.base import Hint
from ...errors import SchedulerRefused, SchedulerStuck
from ...schedule import Schedule
from ...schedulers import get_scheduler, simulate
from ...schedulers.unified import OrderedScheduler, UnifiedScheduler

#: the unified presets whose admission order the search permutes
ORDERED_BASES = ("sjf-mc", "rank-i", "srpt", "srpt:ratio=2", "sjf-mc:prefill_limit=512")
#: pattern moves in a round of the search (between rounds of bound passes)
ROUND_MOVES = 8
#: how many of the best heuristic schedules seed the search
SEARCH_SEEDS = 3


def search_seeds(ledger) -> list[Schedule]:
    """The best schedules offered as seeds (the heuristics', best first): the search starts from their
    patterns, and packing from their orders."""
    return [c.schedule for c in sorted(ledger.seeds, key=lambda c: c.value)[:SEARCH_SEEDS]]


def admission_keys(schedule: Schedule, n: int) -> np.ndarray:
    """Per request, the batch it is first processed in (an admission pattern)."""
    keys = np.full(n, float(len(schedule.batches)))
    for j, batch in enumerate(reversed(schedule.batches)):
        for i in batch.tokens:
            keys[i] = len(schedule.batches) - 1 - j
    return keys


@dataclass
class Pattern:
    """An admission pattern: the order (keys), the batches before which no request is admitted
    (hold; None: at once) and the preset that serves it."""

    keys: np.ndarray
    hold: np.ndarray | None
    base: UnifiedScheduler

    def moved(self, rng: random.Random, batches: int) -> "Pattern":
        """One random move: a request to another place in the order, its hold later or earlier, or released."""
        keys = self.keys.copy()
        hold = None if self.hold is None else self.hold.copy()
        i = rng.randrange(len(keys))
        if not self.base.ranks_by_keys:  # the base keeps its own order: only holds move
            hold = np.zeros(len(keys)) if hold is None else hold
            move = rng.randrange(1, 3)
        else:
            move = rng.randrange(3) if hold is not None else 0
        if move == 0:
            keys[i] = keys[rng.randrange(len(keys))] + rng.choice((-0.5, 0.5))
        elif move == 1:
            hold[i] = max(0.0, hold[i] + rng.choice((-1, 1)) * rng.randint(1, max(2, batches // 20)))
        else:
            hold[i] = 0.0
        return Pattern(keys, hold, self.base)


class Patterns:
    """The search's state: the patterns tried, the best one (`incumbent`, even while its schedule is
    worse than the ledger's best, which no pattern may reproduce exactly) and the best one whose
    order is its keys (`keyed`: every other move starts there, so that an srpt incumbent, whose moves
    only shift holds, does not take every move)."""

    def __init__(self, ledger, batches: int, seed: int = 0):
        self.ledger, self.batches = ledger, batches  # moves shift holds by up to a twentieth of `batches`
        self.rng = random.Random(seed)
        self.bases = [p for p in (get_scheduler(b) for b in ORDERED_BASES) if isinstance(p, UnifiedScheduler)]
        self.tried = self.simulated = 0
        self.incumbent, self.incumbent_value = None, np.inf
        self.keyed, self.keyed_value = None, np.inf
        self.seen: set[bytes] = set()  # two heuristics may give the same schedule: one pattern

    def consider(self, pattern: Pattern, name: str) -> None:
        ledger = self.ledger
        self.tried += 1
        try:
            with ledger.deadline.enforced():
                res = simulate(ledger.instance, OrderedScheduler(pattern.base, pattern.keys, pattern.hold))
        except (SchedulerRefused, SchedulerStuck, ValueError):
            return
        self.simulated += 1
        value = ledger.objective.of(res.replay.metrics)
        if not ledger.constraints.within_cap(value) or not ledger.constraints.admit(ledger.instance, res.schedule):
            return
        if value < self.incumbent_value:
            self.incumbent, self.incumbent_value = pattern, value
        if pattern.base.ranks_by_keys and value < self.keyed_value:
            self.keyed, self.keyed_value = pattern, value
        if value < ledger.best_value * (1 - 1e-12):
            ledger.offer(res.schedule, f"{name}:{pattern.base.name}")  # the validator's numbers decide

    def seed(self, schedule: Schedule) -> None:
        """A good schedule's own pattern, with and without its admission batches."""
        admitted = admission_keys(schedule, len(self.ledger.instance))
        if admitted.tobytes() in self.seen:
            return
        self.seen.add(admitted.tobytes())
        for base in self.bases:
            self.consider(Pattern(admitted, admitted.copy(), base), "pattern")
            self.consider(Pattern(admitted, None, base), "pattern")

    def hint(self, hint: Hint) -> None:
        """A bound's hint (its trajectories' admission order and time): the Lagrangian heuristic."""
        for base in self.bases:
            for name, pattern in (("lagrangian", Pattern(hint.keys, hint.hold, base)),
                                  ("lagrangian-order", Pattern(hint.keys, None, base))):
                self.consider(pattern, name)

    def moves(self) -> None:
        """A round of moves from the best patterns so far."""
        for move in range(ROUND_MOVES if self.incumbent is not None else 0):
            if self.ledger.deadline.expired():
                break
            source = self.keyed if move % 2 and self.keyed is not None else self.incumbent
            self.consider(source.moved(self.rng, self.batches), "pattern")
