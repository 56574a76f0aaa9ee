"""The anytime search used where no MIP model fits: bounds and schedules improve until the deadline.

Two things alternate while time is left (docs/formulation.md, "Lagrangian bound" and "Ordered
search"):
* for mean latency and mean TTFT, a subgradient pass of the Lagrangian bound
  (`formulation.lagrangian`); every pass's value is a certified bound;
* schedules from admission orders: the Lagrangian trajectories' start and completion batches
  (the Lagrangian heuristic), then random moves of one request in the best order so far, each
  simulated by an ordered unified preset and checked by the validator.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import numpy as np

from .. import progress
from ..deadline import Deadline
from ..errors import SchedulerRefused, SchedulerStuck
from ..interrupt import Stopped
from ..formulation.base import Constraints
from ..formulation.lagrangian import LagrangianBound
from ..objective import Objective
from ..schedule import Schedule, validate
from ..schedulers import get_scheduler, simulate
from ..schedulers.unified import OrderedScheduler, UnifiedScheduler
from ..workload import Instance

#: the unified presets whose admission order the search permutes
ORDERED_BASES = ("sjf-mc", "rank-i")
#: Lagrangian passes between two rounds of order moves (more when a pass is cheap)
PASSES_PER_ROUND = 5


@dataclass
class SearchOutcome:
    bound: float  # -inf: no Lagrangian bound (total latency, or no time for a pass)
    schedule: Schedule | None  # the best schedule the search found, if it beats the one it started from
    value: float
    name: str
    stats: dict = field(default_factory=dict)


def admission_keys(schedule: Schedule, n: int) -> np.ndarray:
    """Per request, the batch it is first processed in (an admission order)."""
    keys = np.full(n, float(len(schedule.batches)))
    for j, batch in enumerate(reversed(schedule.batches)):
        for i in batch.tokens:
            keys[i] = len(schedule.batches) - 1 - j
    return keys


def search(instance: Instance, objective: Objective, constraints: Constraints, start: Schedule, start_value: float,
           deadline: Deadline, trajectory: "Trajectory", satisfies, seed: int = 0) -> SearchOutcome:
    """Improve the bound and the schedule until `deadline`; `trajectory` gets (seconds, best, bound)
    points as they improve (`Trajectory`); `satisfies(instance, schedule, constraints)` filters schedules."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    best = SearchOutcome(-math.inf, None, start_value, "")
    bases = [p for p in (get_scheduler(b) for b in ORDERED_BASES) if isinstance(p, UnifiedScheduler)]
    tried = simulated = 0
    best_keys = admission_keys(start, len(instance))
    best_base = bases[0]
    cap = constraints.objective_cap

    def consider(keys, base, name) -> bool:
        nonlocal simulated
        try:
            with deadline.enforced():
                res = simulate(instance, OrderedScheduler(base, keys))
        except (SchedulerRefused, SchedulerStuck, ValueError):
            return False
        simulated += 1
        value = objective.of(res.replay.metrics)
        if value >= best.value * (1 - 1e-12) or (cap is not None and value > cap * (1 + 1e-12)):
            return False
        if not satisfies(instance, res.schedule, constraints):
            return False
        checked = objective.of(validate(instance, res.schedule).metrics)  # the one validator's number
        best.schedule, best.value, best.name = res.schedule, checked, name
        progress.report(best=checked)
        trajectory.record(best=checked)
        return True

    passes = None
    if objective.is_mean:
        passes = LagrangianBound(instance, objective, max(1, int(1.1 * len(start.batches)))).iterate(start_value)
    n_pass = 0
    try:
        while not deadline.expired():
            if passes is not None:
                for _ in range(PASSES_PER_ROUND):
                    value, pricing, _ = next(passes, (None, None, None))
                    if value is None:
                        passes = None
                        break
                    n_pass += 1
                    if value > best.bound:
                        best.bound = value
                        progress.report(analytic=value)
                        trajectory.record(bound=value)
                    if deadline.expired():
                        break
                if pricing is not None:  # the Lagrangian heuristic: admit in the trajectories' order
                    for base in bases:
                        for name, keys in (("start", pricing.start), ("completion", pricing.completion),
                                           ("midpoint", pricing.start + pricing.completion)):
                            if consider(keys.astype(float), base, f"lagrangian-{name}:{base.name}"):
                                best_keys, best_base = keys.astype(float), base
                            tried += 1
                if best.bound >= best.value * (1 - 1e-9):
                    break
            # a round of moves: one request earlier or later in the best order
            for _ in range(max(1, 8 // len(bases))):
                if deadline.expired():
                    break
                keys = best_keys.copy()
                i = rng.randrange(len(keys))
                keys[i] = keys[rng.randrange(len(keys))] + rng.choice((-0.5, 0.5))
                for base in (best_base, *[b for b in bases if b is not best_base]):
                    tried += 1
                    if consider(keys, base, f"ordered:{base.name}"):
                        best_keys, best_base = keys, base
                        break
            if passes is None and len(instance) < 2:
                break
    except Stopped:
        pass
    best.stats = {"lagrangian_passes": n_pass, "orders_tried": tried, "orders_simulated": simulated,
                  "search_seconds": time.perf_counter() - t0}
    return best


class Trajectory:
    """The best schedule's value and the certified bound over time, one point per improvement."""

    def __init__(self, deadline: Deadline):
        self.deadline, self.best, self.bound, self.points = deadline, None, -math.inf, []

    def record(self, best: float | None = None, bound: float | None = None) -> None:
        if best is not None and (self.best is None or best < self.best):
            self.best = best
        if bound is not None and bound > self.bound:
            self.bound = bound
        self.points.append({"seconds": round(self.deadline.elapsed(), 3), "best": self.best,
                            "bound": self.bound if math.isfinite(self.bound) else None})
