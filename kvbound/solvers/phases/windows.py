"""Window schedules in the search, for mean latency with every request arriving together: plans from
the relaxation of `kvbound.schedulers.windows` (every request starting at once, and the best
schedule's own completion batches), each improved by its local search and built; then local moves
of one request's start (or two requests' starts swapped) on the built schedules, keeping a move that
is no worse. Every schedule better than the ledger's best is offered to it (the ledger validates it).
"""
from __future__ import annotations

import random

import numpy as np

from ... import progress
from ...interrupt import Stopped
from ...objective import Objective
from ...schedulers.windows import build_windows, completion_batches, plan_windows
from .bursts import offer_built

#: share of the time left the plans may take
SHARE = 0.1
#: local moves in a round of the search
ROUND_MOVES = 16
#: the start shifts a move tries (batches, either way)
SHIFTS = (1, 2, 3, 5, 10, 20, 50, 100)


class Windows:
    name = "windows"
    before_patterns = True  # cheap: the plans are numpy passes, a build one replay

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.ledger = None
        self.current = None
        self.planned_from = None  # the ledger's best a plan last started from

    def applies(self, ledger) -> bool:
        c, inst = ledger.constraints, ledger.instance
        return (ledger.objective is Objective.MEAN_LATENCY and not ledger.proven and len(inst) > 1
                and np.ptp(inst.arrivals) == 0 and not c.no_hybrid and c.admission_order is None)

    def run(self, ledger) -> None:
        self.ledger = ledger
        self.rng = random.Random(self.seed)
        self.built = self.kept = 0
        self.best_value = np.inf
        progress.report(phase=self.name)
        deadline = ledger.deadline.share(SHARE)
        self.planned_from = ledger.best
        starts = [None] + ([completion_batches(ledger.best_schedule)] if ledger.best is not None else [])
        try:
            for completion in starts:
                if deadline.expired():
                    break
                self._plan(completion, deadline)
        except Stopped:
            if ledger.deadline.expired():
                raise
        ledger.stats["windows"] = self.report()

    def _plan(self, completion, deadline) -> None:
        with deadline.enforced():
            plan = plan_windows(self.ledger.instance, completion, deadline, self.seed)
            self._try(plan.starts())

    def _try(self, starts) -> float:
        self.built += 1
        schedule = build_windows(self.ledger.instance, starts, self.ledger.constraints)
        value, kept = offer_built(self.ledger, schedule, "window schedule")
        self.kept += kept
        if value <= self.best_value * (1 + 1e-12):
            self.best_value, self.current = value, np.array(starts, dtype=np.int64)
        return value

    def moves(self, ledger, count: int = ROUND_MOVES, deadline=None) -> bool:
        """`count` local moves from the best window schedule's starts (within `deadline`, else the
        solve's). False where there is none to move from."""
        if self.current is None or ledger is not self.ledger:
            return False
        deadline = deadline or ledger.deadline
        if ledger.best is not self.planned_from and ledger.best_value < self.best_value * (1 - 1e-12):
            # another step found a better schedule: a plan from its completion batches (the local search
            # keeps to the basin it starts in: 1,000 arXiv requests, F 85.09 from every request at once)
            self.planned_from = ledger.best
            try:
                self._plan(completion_batches(ledger.best_schedule), deadline.share(SHARE))
            except Stopped:  # the plan's share is over; the search goes on unless its own time is
                if deadline.expired():
                    raise
        rng, n = self.rng, len(self.current)
        for _ in range(count):
            if deadline.expired():
                break
            starts = self.current.copy()
            i = rng.randrange(n)
            if rng.random() < 0.25:
                k = rng.randrange(n)
                starts[i], starts[k] = starts[k], starts[i]
            else:
                starts[i] = max(1, starts[i] + rng.choice(SHIFTS) * rng.choice((-1, 1)))
            with deadline.enforced():
                self._try(starts)
        ledger.stats["windows"] = self.report()
        return True

    def report(self) -> dict:
        return {"built": self.built, "offered_better": self.kept,
                "best_value": None if not np.isfinite(self.best_value) else self.best_value}
