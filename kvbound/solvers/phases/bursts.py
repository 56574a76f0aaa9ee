"""Burst schedules in the search, for the mean objectives: the burst builder
(`kvbound.schedulers.bursts`) over a few orders and parameters, then a local search that moves one
request in the order or one parameter at a time, keeping a move that is no worse; every schedule
better than the ledger's best is offered to it (the ledger validates it).

`Bursts.run` is the search's one-shot step (the starting grid, within a share of the time left);
`Bursts.moves` a round of local moves, run by the search between rounds of bound passes. Each build
is a replay of the instance (linear in its batches and requests), cut short by the deadline, so on
traces of thousands of requests the grid is only as long as the time allows.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np

from ... import progress
from ...interrupt import Stopped
from ...alone import time_alone
from ...schedule import validate
from ...bounds.analytic import first_prefill_groups
from ...schedulers.bursts import BurstParams, build_burst, build_prefill_groups, refill_pays
from .patterns import admission_keys, search_seeds

#: share of the time left the starting grid may take (it stops earlier once every start is built)
GRID_SHARE = 0.25
#: before a model (`BurstSeeds`): the grid's share of the time left, the rest the model's
SEED_SHARE = 0.15
#: before a model, the local moves end after this many rounds in a row without a better schedule
SEED_STALL = 3
#: local moves in a round of the search
ROUND_MOVES = 16
#: waits (x intercept) the moves try
WAITS = (0.0, 0.25, 0.5, 1.0, 2.0)


def offer_built(ledger, schedule, label: str) -> tuple[float, bool]:
    """The objective of a built schedule (the validator's replay: its numbers decide; inf where none was
    built) and whether the ledger kept it: it is offered only where it beats the best."""
    if schedule is None:
        return np.inf, False
    metrics = validate(ledger.instance, schedule).metrics
    value = ledger.objective.of(metrics)
    return value, value < ledger.best_value * (1 - 1e-12) and ledger.offer(schedule, label, metrics)


class Bursts:
    name = "bursts"
    before_patterns = True  # the search runs the grid before the seeds' patterns (`phases.search`)

    share = GRID_SHARE

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.ledger = None

    def applies(self, ledger) -> bool:
        c = ledger.constraints
        return (ledger.objective.is_mean and not ledger.proven and not c.no_hybrid and c.admission_order is None
                and len(ledger.instance) > 0)

    # ------------------------------------------------------------------ the grid
    def run(self, ledger) -> None:
        self.ledger = ledger
        self.rng = random.Random(self.seed)
        self.built = self.kept = 0
        self.best_value, self.best = np.inf, None  # (keys, params) of the best burst schedule
        self.current = None
        progress.report(phase=self.name)
        deadline = ledger.deadline.share(self.share)
        try:
            self._prefill_groups(deadline)
            for keys, params in self._starts():
                if deadline.expired():
                    break
                self._try(keys, params, deadline)
        except Stopped:
            if ledger.deadline.expired():  # the solve's own time (or an interrupt): the search ends
                raise
        self.current = self.best
        ledger.stats["bursts"] = self.report()

    def _orders(self) -> dict[str, np.ndarray]:
        inst, objective = self.ledger.instance, self.ledger.objective
        prompt, output, arrival = inst.prompts.astype(float), inst.outputs.astype(float), inst.arrivals.astype(float)
        alone = np.asarray(time_alone(inst, objective), dtype=float)
        tie = 1e-9 * np.arange(len(inst))
        orders = {"prompt": prompt + tie, "alone": alone + tie, "work": prompt + output + tie}
        if np.ptp(arrival) > 0:
            orders["arrival"] = arrival + tie
            orders["arrival+alone"] = arrival + alone
        for k, schedule in enumerate(search_seeds(self.ledger)):
            orders[f"seed {k}"] = admission_keys(schedule, len(inst)) + tie
        return orders

    def _starts(self):
        """(keys, params) to build first, the likeliest first."""
        inst, ttft = self.ledger.instance, self.ledger.objective.first_token
        orders = self._orders()
        waits = (0.0, 0.5, 1.0) if np.ptp(inst.arrivals) > 0 else (0.0,)
        refills = (False, True) if refill_pays(inst) else (False,)
        # for TTFT first: the least prompt left first, whole prompts only (the best of these on Splitwise code
        # with arrivals), then the order's own
        modes = ([BurstParams(first_tokens=True, wait=w, fill=False, shortest_left=True) for w in waits]
                 + [BurstParams(first_tokens=True, wait=w, fill=f) for w in waits for f in (True, False)]) if ttft else []
        modes += [BurstParams(wait=w, reserve=rs, refill=rf, fill=f)
                  for rs in (True, False) for w in waits for rf in refills for f in (True, False)]
        if not ttft:
            modes += [BurstParams(first_tokens=True, wait=w) for w in waits]
        for params in modes[:1]:
            for keys in orders.values():
                yield keys, params
        for params in modes[1:]:
            for keys in orders.values():
                yield keys, params

    # ------------------------------------------------------------------ building
    def _prefill_groups(self, deadline) -> None:
        """Mean TTFT with every request arriving together: the schedule of the batching bound's groups
        (`analytic.first_prefill_groups`), offered where it beats the best."""
        ledger = self.ledger
        inst = ledger.instance
        if not ledger.objective.first_token or np.ptp(inst.arrivals) > 0:
            return
        with deadline.enforced():
            schedule = build_prefill_groups(inst, first_prefill_groups(inst)[1], ledger.constraints)
        self._offer(schedule, "prefill groups")

    def _try(self, keys, params: BurstParams, deadline) -> float:
        with deadline.enforced():
            schedule = build_burst(self.ledger.instance, keys, params, self.ledger.constraints)
        value = self._offer(schedule, params.label())
        if value < self.best_value:
            self.best_value, self.best = value, (keys, params)
        return value

    def _offer(self, schedule, label: str) -> float:
        """Count a build; `offer_built`'s value."""
        self.built += 1
        value, kept = offer_built(self.ledger, schedule, label)
        self.kept += kept
        return value

    # ------------------------------------------------------------------ local moves
    def moves(self, ledger, count: int = ROUND_MOVES, deadline=None) -> bool:
        """`count` local moves from the current point (within `deadline`, else the solve's): keep one
        that is no worse. False where there is no point to move from (no burst schedule could be built)."""
        if self.current is None or ledger is not self.ledger:
            return False
        deadline = deadline or self.ledger.deadline
        for _ in range(count):
            if deadline.expired():
                break
            keys, params = self.current
            keys, params = self._moved(keys, params)
            value = self._try(keys, params, deadline)
            if value <= self.best_value * (1 + 1e-12):
                self.current = (keys, params)
        self.ledger.stats["bursts"] = self.report()
        return True

    def _moved(self, keys: np.ndarray, params: BurstParams):
        rng, n = self.rng, len(keys)
        kind = rng.randrange(4)
        if kind <= 1 or n < 2:  # one request to another place in the order (near, or anywhere)
            order = list(np.argsort(keys, kind="stable"))
            i = rng.randrange(n)
            j = min(n - 1, max(0, i + rng.choice((-3, -2, -1, 1, 2, 3)))) if kind == 0 else rng.randrange(n)
            order.insert(j, order.pop(i))
            new = np.empty(n)
            new[np.asarray(order)] = np.arange(n, dtype=float)
            return new, params
        if kind == 2:  # two requests swap places
            new = keys.copy()
            i, j = rng.randrange(n), rng.randrange(n)
            new[i], new[j] = keys[j], keys[i]
            return new, params
        field = rng.choice(("wait", "group", "fill", "reserve", "refill", "first_tokens", "shortest_left"))
        if field == "wait":
            return keys, replace(params, wait=rng.choice(WAITS))
        if field == "group":
            g = params.group or n
            return keys, replace(params, group=None if g + 1 >= n else max(1, g + rng.choice((-1, 1))))
        return keys, replace(params, **{field: not getattr(params, field)})

    def report(self) -> dict:
        return {"built": self.built, "offered_better": self.kept,
                "best": None if self.best is None else self.best[1].label(),
                "best_value": None if self.best is None else self.best_value}


class BurstSeeds(Bursts):
    """The starting grid and local moves before a model, within `SEED_SHARE` of the time: the best is the
    model's incumbent (the ledger's best) where it beats the heuristics', and the solve's answer where
    the model finds nothing better in its time (mean TTFT on 10 requests: 116.7% of the optimum from a
    20 s chain MIP alone, bench/results/NOTES.md "Issue 33, item 4")."""

    name = "burst seeds"
    share = SEED_SHARE * GRID_SHARE  # the grid: a quarter of the seeds' time

    def applies(self, ledger) -> bool:
        return ledger.route is not None and ledger.route.way == "model" and super().applies(ledger)

    def run(self, ledger) -> None:
        """The grid, then local moves, together within `SEED_SHARE` of the time left."""
        mine = ledger.deadline.share(SEED_SHARE)
        super().run(ledger)
        if not math.isfinite(mine.limit):  # no time limit: the grid only
            return
        stalled = 0  # rounds without a better burst schedule: small instances run out of moves that pay
        try:
            while not mine.expired() and stalled < SEED_STALL:
                before = self.best_value
                if not self.moves(ledger, deadline=mine):
                    break
                stalled = stalled + 1 if self.best_value >= before else 0
        except Stopped:
            if ledger.deadline.expired():
                raise
