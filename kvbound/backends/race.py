"""`--solver auto` on a small model: the backends that race (HiGHS and CP-SAT) run side by side, each
on its own build of the same formulation, and share their incumbents; the first proof ends the race.

HiGHS runs in this thread (its solve in its own), CP-SAT's process is watched from another; each
gets the deadline `until` the race is settled, so the loser stops at once, and a Ctrl-C stops both
as it stops one. A racer joins `JOIN_AFTER` seconds late: a model the first proves at once never
starts a CP-SAT process. An improving solution of one racer is handed to the others as a schedule
and translated into their own columns when they take it (HiGHS takes them as user solutions;
CP-SAT cannot take any once started). A bound a racer vouches for (CP-SAT's) that meets the best
solution of any racer settles the race too.
"""
from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import progress
from ..bounds.base import meets
from ..deadline import Deadline
from ..formulation.model import ModelArrays
from .base import Backend, BackendOutcome, Exchange

#: model variables (the route's estimate) up to which `--solver auto` races its backends
RACE_LIMIT = 20_000
#: seconds the racers after the first wait before they start
JOIN_AFTER = 0.3
#: statuses that settle a race: a proof either way
SETTLED = ("optimal", "infeasible")
#: `--solver auto`: the backends that race where the model is small, else the first of them alone
AUTO = "auto"


def chosen_backends(name: str, size: int, backends: dict[str, Backend]) -> tuple[Backend, ...]:
    """The backends a solve runs for `--solver name` on a model of about `size` variables."""
    if name != AUTO:
        return (backends[name],)
    racers = tuple(b for b in backends.values() if b.races)
    return racers if size <= RACE_LIMIT else racers[:1]


@dataclass
class Entrant:
    """One backend in a race, on its own model (its units: `scale` per second)."""

    backend: Backend
    arrays: ModelArrays
    warm: np.ndarray | None
    scale: float
    to_schedule: Callable[[np.ndarray], object]  # a point of this model -> Schedule (or None)
    from_schedule: Callable[[object], np.ndarray]  # a Schedule -> a point of this model


@dataclass
class RaceResult:
    outcomes: list[BackendOutcome | None]  # per entrant (None: it never started, the race was settled)
    winner: int  # the entrant whose answer settled the race, or with the best solution
    finished: list[float]  # per entrant, seconds from the start of the race to its return
    shared: int = 0  # solutions handed from one racer to another
    errors: list = field(default_factory=list)


class _Board:
    """What the race knows in seconds: the best solution offered and the best vouched-for bound."""

    def __init__(self, entrants: list[Entrant], settled: threading.Event):
        self.entrants, self.settled = entrants, settled
        self.best, self.bound = math.inf, -math.inf
        self.lock = threading.Lock()
        self.exchanges = [Exchange(self._offer_from(k)) for k in range(len(entrants))]
        self.shared = 0

    def _offer_from(self, k: int):
        entrant = self.entrants[k]

        def offer(x, objective, bound):
            seconds = objective / entrant.scale
            schedule = None
            with self.lock:
                if bound is not None and math.isfinite(bound):
                    self.bound = max(self.bound, bound / entrant.scale)
                better = seconds < self.best
                self.best = min(self.best, seconds)
                if math.isfinite(self.bound) and meets(self.best, self.bound):
                    self.settled.set()
            if better and not self.settled.is_set():
                schedule = entrant.to_schedule(np.asarray(x, dtype=float))
            if schedule is not None:
                for other, exchange in enumerate(self.exchanges):
                    if other != k:
                        exchange.give(functools.partial(self.entrants[other].from_schedule, schedule))
                        self.shared += 1
            first = self.entrants[0].scale
            progress.report(incumbent=self.best * first, **({"bound": self.bound * first} if bound is not None else {}))

        return offer


def race(entrants: list[Entrant], deadline: Deadline, verbose: bool = False) -> RaceResult:
    """Run every entrant's backend until one proves its answer (or the deadline); each outcome in its
    own model's units."""
    settled = threading.Event()
    board = _Board(entrants, settled)
    outcomes: list[BackendOutcome | None] = [None] * len(entrants)
    finished = [math.nan] * len(entrants)
    errors: list = []
    order: list[int] = []  # entrants in the order they returned
    began = time.monotonic()
    until = deadline.until(settled)

    def run(k: int) -> None:
        entrant = entrants[k]
        if k and settled.wait(JOIN_AFTER):
            return
        try:
            outcomes[k] = entrant.backend.run(entrant.arrays, until, entrant.warm, verbose=verbose,
                                              incumbents=board.exchanges[k])
        except BaseException as exc:  # raised in the caller's thread once every racer is back
            errors.append(exc)
            settled.set()
            return
        finally:
            finished[k] = time.monotonic() - began
        with board.lock:
            order.append(k)
        if outcomes[k].status in SETTLED:
            settled.set()

    others = [threading.Thread(target=run, args=(k,), name=f"race-{entrants[k].backend.name}", daemon=True)
              for k in range(1, len(entrants))]
    for thread in others:
        thread.start()
    try:
        run(0)
    finally:
        for thread in others:
            thread.join()
    if errors:
        raise errors[0]
    return RaceResult(outcomes, _winner(entrants, outcomes, order), finished, board.shared)


def _winner(entrants: list[Entrant], outcomes: list[BackendOutcome | None], order: list[int]) -> int:
    """The first racer back with a proof; else the one with the best solution (in seconds)."""
    for k in order:
        if outcomes[k].status in SETTLED:
            return k
    values = [outcomes[k].objective / entrants[k].scale if outcomes[k] is not None and outcomes[k].objective is not None
              else math.inf for k in range(len(entrants))]
    return int(np.argmin(values))
