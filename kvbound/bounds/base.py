"""What a bound is, and how the solve driver asks for one.

A bound method is a class registered here (`register`) that declares when it can run (`stage`),
and either computes its bounds once (`compute`) or improves one pass after pass (`passes`, the
anytime ones, raced against each other in the search: `bounds.race`). It reads what the solve knows
so far through `Known` (the driver's ledger) and never imports the driver. Adding a bound: a module
here with one registered class, and its module name in the driver's import line
(`kvbound.solvers.plan`), which sets the order.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..constraints import Constraints
    from ..deadline import Deadline
    from ..objective import Objective
    from ..schedule import Schedule
    from ..workload import Instance


@dataclass(frozen=True)
class Bound:
    """A lower bound on the objective, seconds (-inf: none computed; `note` says why).

    `certified`: it holds for every schedule that meets the constraints; otherwise only under
    `conditions` (e.g. a model's horizon that was given rather than derived). `batches`: every
    schedule has at least this many (0: the bound says nothing about them). `details`: what the
    method reports beside the value (`solve --json`'s stats, under the method's name)."""

    name: str
    value: float
    seconds: float = 0.0
    certified: bool = True
    note: str = ""
    conditions: str = ""
    batches: int = 0
    details: dict | None = field(default=None, compare=False)

    @property
    def found(self) -> bool:
        """A value was computed (-inf says nothing; +inf: no schedule meets the constraints)."""
        return self.value > -math.inf

    def to_json(self) -> dict:
        # JSON has no infinity: a bound that could not be computed is null, +inf the string "inf"
        value = self.value if math.isfinite(self.value) else ("inf" if self.found else None)
        return {"name": self.name, "value": value, "seconds": self.seconds,
                "certified": self.certified, "note": self.note, "conditions": self.conditions}


#: relative tolerance of comparisons between bounds and validated schedules
REL_TOL = 1e-6
#: a schedule within this share of a certified bound counts as optimal: REL_TOL for the bounds' floating
#: point plus the share HiGHS's bounds are lowered by (backends.highs.BOUND_MARGIN, 5e-7) and its own
#: tolerances (a two-request optimum of 0.7 s came back from HiGHS 7e-7 below it, then 1.2e-6 below with
#: the margin: "feasible, gap 0.00%" until this was 2e-6)
OPTIMAL_TOL = 2e-6


def bound_above(bound: float, value: float, rel: float = REL_TOL) -> bool:
    """Whether a claimed lower bound exceeds a known feasible value beyond tolerance (so it is wrong)."""
    return bound > value + rel * max(abs(value), 1e-12)


def meets(value: float, bound: float, rel: float = OPTIMAL_TOL) -> bool:
    """Whether a schedule's value is at its lower bound (within tolerance): the schedule is optimal."""
    return value - bound <= rel * max(abs(value), 1e-12)


class Known(Protocol):
    """What a bound may read of the solve so far (the driver's ledger)."""

    instance: Instance
    objective: Objective
    constraints: Constraints

    @property
    def best_schedule(self) -> Schedule | None: ...

    @property
    def best_value(self) -> float: ...  # inf: no schedule yet

    @property
    def lower(self) -> float: ...  # the best certified bound so far

    @property
    def fewest_batches(self) -> int: ...  # the most batches any certified bound has shown every schedule needs


class Stage(Enum):
    """When the driver runs a bound."""

    FIRST = "first"  # before any schedule: the instance alone
    MODEL = "model"  # before a model, where every bound is asked for (`kvbound bound`)
    SEARCH = "search"  # once, where no model is solved, before the race
    ANYTIME = "anytime"  # raced in the search, improving until the deadline or a proof


@dataclass(frozen=True)
class Hint:
    """An admission pattern a bound's certificate suggests: per request the batch to admit it in
    (an order) and the batches to hold it back (None: none)."""

    keys: object  # np.ndarray
    hold: object | None


@dataclass(frozen=True)
class Pass:
    """One pass of an anytime bound: its best value so far and the hint of its best certificate."""

    value: float
    hint: Hint | None = None


class BoundMethod(Protocol):
    """A registered bound. One-shot methods implement `compute`, anytime ones `passes`."""

    name: str
    stage: Stage
    share: float  # one-shot: the share of the time left it may take

    def skip_reason(self, known: Known) -> str | None:
        """Why it cannot run on what is known (None: it can); the reason is reported with its row."""

    def compute(self, known: Known, deadline: Deadline) -> list[Bound]: ...

    def passes(self, known: Known) -> Iterator[Pass]: ...


def rises(known: Known, name: str, note: str):
    """A callback for a one-shot bound that rises as it runs: each value goes to the ledger at once
    (where what is known certifies bounds), so the trajectory and the progress line show it growing."""
    began = time.perf_counter()
    certify = getattr(known, "certify", None)

    def offer(value: float) -> None:
        if certify is not None:
            certify(Bound(name, value, time.perf_counter() - began, note=note))

    return offer


REGISTRY: list[BoundMethod] = []


def register(cls):
    """Class decorator: the driver runs one instance of `cls` at its stage, in registration order."""
    REGISTRY.append(cls())
    return cls


def registered(stage: Stage) -> list[BoundMethod]:
    return [method for method in REGISTRY if method.stage is stage]
