"""`--solver auto` on a small model: the backends that race (HiGHS and CP-SAT) run side by side, each
on its own build of the same formulation, and share their incumbents; the first proof ends the race.

HiGHS runs in this thread (its solve in its own), CP-SAT's process is watched from another; each
gets the deadline `until` the race is settled, so the loser stops at once, and a Ctrl-C stops both
as it stops one. A racer joins `JOIN_AFTER` seconds late: a model the first proves at once never
starts a CP-SAT process. An improving solution of one racer is handed to the others as a schedule
and translated into their own columns when they take it (HiGHS takes them as user solutions;
CP-SAT cannot take any once started). A bound a racer vouches for (CP-SAT's) that meets the best
solution of any racer settles the race too: the race ends where the ledger will find a proof.
"""
from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

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
    value: Callable[[object], float]  # a Schedule's exact objective in seconds (the validator's)


@dataclass
class RaceResult:
    outcomes: list[BackendOutcome | None]  # per entrant (None: it never started, the race was settled)
    winner: int  # the entrant whose bound settled the race (its proof), else the one with the best solution
    finished: list[float]  # per entrant, seconds from the start of the race to its return
    shared: int = 0  # solutions handed from one racer to another


class _Board:
    """What the race knows in seconds: the best schedule offered (its exact value, not a model's:
    CP-SAT's coefficients are floored) and the best bound of a racer; settled when they meet, as the
    ledger will judge them."""

    def __init__(self, entrants: list[Entrant], settled: threading.Event):
        self.entrants, self.settled = entrants, settled
        self.best, self.bound = math.inf, -math.inf
        self.prover: int | None = None  # the racer whose bound is `bound`
        self.settler: int | None = None  # the prover, once its bound meets the best schedule
        self.lock = threading.Lock()
        self.exchanges = [Exchange(functools.partial(self.note, k)) for k in range(len(entrants))]
        self.shared = 0

    def note(self, k: int, x, objective, bound) -> None:
        """Racer k's solution `x` (model units; may be None) and a bound it vouches for (or None)."""
        entrant = self.entrants[k]
        schedule = entrant.to_schedule(np.asarray(x, dtype=float)) if x is not None else None
        seconds = entrant.value(schedule) if schedule is not None else math.inf
        with self.lock:
            better = seconds < self.best
            self.best = min(self.best, seconds)
            if bound is not None and math.isfinite(bound) and bound / entrant.scale > self.bound:
                self.bound, self.prover = bound / entrant.scale, k
            if math.isfinite(self.bound) and meets(self.best, self.bound) and not self.settled.is_set():
                self.settler = self.prover  # the proof is its bound, whoever found the schedule
                self.settled.set()
        if better and not self.settled.is_set():
            for other, exchange in enumerate(self.exchanges):
                if other != k:
                    exchange.give(functools.partial(self.entrants[other].from_schedule, schedule))
                    self.shared += 1
        first = self.entrants[0].scale
        progress.report(incumbent=self.best * first, **({"bound": self.bound * first} if bound is not None else {}))


def race(entrants: list[Entrant], deadline: Deadline, verbose: bool = False) -> RaceResult:
    """Run every entrant's backend until one proves its answer (or the deadline); each outcome in its
    own model's units."""
    settled = threading.Event()
    board = _Board(entrants, settled)
    outcomes: list[BackendOutcome | None] = [None] * len(entrants)
    finished = [math.nan] * len(entrants)
    errors: list = []
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
        out = outcomes[k]
        if out.status == "infeasible" and not settled.is_set():
            board.settler = k
            settled.set()
        elif out.status != "unknown":  # its last solution and its bound: a proof if they meet the best
            board.note(k, out.x, out.objective, out.bound)

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
    winner = board.settler if board.settler is not None and outcomes[board.settler] is not None else None
    return RaceResult(outcomes, winner if winner is not None else _best(entrants, outcomes), finished, board.shared)


def _best(entrants: list[Entrant], outcomes: list[BackendOutcome | None]) -> int:
    """The racer with the best solution (its model's value in seconds), the first on ties."""
    values = [outcomes[k].objective / entrants[k].scale if outcomes[k] is not None and outcomes[k].objective is not None
              else math.inf for k in range(len(entrants))]
    return int(np.argmin(values))
