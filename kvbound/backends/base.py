"""What a solver backend is: a descriptor the driver reads (never a name in an `if`), and the outcome
every backend returns in the same shape. Bounds are in model units (seconds, or ticks for the
integer-scaled CP-SAT model)."""
from __future__ import annotations

import os
import queue
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class BackendOutcome:
    status: str  # optimal, feasible, infeasible, unknown (as the backend proved it, in model units)
    x: np.ndarray | None
    objective: float | None
    bound: float  # a lower bound on the model optimum (-inf if none)
    seconds: float
    warm_start_accepted: bool | None = None
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    """One solver backend, described once: the driver reads these fields instead of branching on names."""

    name: str
    run: Callable[..., BackendOutcome]  # (arrays, deadline, warm, *, verbose[, incumbents]) -> BackendOutcome
    integer_ticks: bool  # needs an integer model: time in whole ticks, coefficients floored
    summary: str
    races: bool = False  # joins the race of `--solver auto` on small models (takes `incumbents`)


#: every backend by name, in the order their modules register (`kvbound.backends`' import line)
BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def threads() -> int:
    """Solver threads: the cores, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


def accepted(arrays, warm, objective) -> bool | None:
    """Whether the solver kept (or beat) the warm start it was given (None: it was given none)."""
    if warm is None:
        return None
    warm_obj = float(arrays.objective @ warm + arrays.objective_offset)
    return objective is not None and objective <= warm_obj + 1e-9 * (1 + abs(warm_obj))


class Exchange:
    """A racing solver's link to the race (`kvbound.backends.race`): it `offer`s each improving
    solution it finds (in its model's units, with a bound it vouches for, or None), and `take`s the
    ones the others found, already translated into its own model's columns."""

    def __init__(self, on_offer: Callable[[np.ndarray, float, float | None], None]):
        self._on_offer = on_offer
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()

    def offer(self, x: np.ndarray, objective: float, bound: float | None = None) -> None:
        self._on_offer(x, objective, bound)

    def give(self, make: Callable[[], np.ndarray]) -> None:
        """A solution for this solver from another: `make()` gives it in this solver's columns."""
        self._inbox.put(make)

    def take(self) -> np.ndarray | None:
        """The newest solution given to this solver, if any (older ones are dropped unmade)."""
        make = None
        while True:
            try:
                make = self._inbox.get_nowait()
            except queue.Empty:
                return None if make is None else np.asarray(make(), dtype=float)
