"""The ledger every phase of a solve talks to: schedules are offered, bounds are certified, and the
result is read off it at the end.

`offer` validates a schedule, applies the hypothesis constraints and the objective cap, keeps the
best, and records it in the trajectory and on the progress line; `certify` keeps every bound by
name and the best certified one, and drops any bound above a validated schedule (a bug in it:
never reported), in one place, whichever came first.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

from .. import interrupt, progress
from ..bounds.base import REL_TOL, Bound, bound_above, meets
from ..deadline import Deadline
from ..interrupt import Stopped
from ..schedule import Metrics, Schedule, validate
from ..workload import Instance
from .options import SolveOptions
from .result import Result


@dataclass
class Candidate:
    """A validated schedule meeting the constraints, its metrics, its objective value and its source."""

    name: str
    schedule: Schedule
    metrics: Metrics
    value: float


class Trajectory:
    """The best schedule's value and the certified bound over time, one point per improvement from the
    first schedule on (bounds found before it are in its point)."""

    def __init__(self, deadline: Deadline):
        self.deadline, self.best, self.bound, self.points = deadline, None, -math.inf, []

    def record(self, best: float | None = None, bound: float | None = None) -> None:
        if best is not None and (self.best is None or best < self.best):
            self.best = best
        if bound is not None and bound > self.bound:
            self.bound = bound
        if self.best is None:
            return
        self.points.append({"seconds": round(self.deadline.elapsed(), 3), "best": self.best,
                            "bound": self.bound if math.isfinite(self.bound) else None})


@dataclass
class ModelRun:
    """What the model phase did: the model's size, the warm start it took, the backend's answer."""

    info: dict
    build_seconds: float = 0.0
    warm_start: str | None = None
    warm_start_accepted: bool | None = None
    backend_seconds: float = 0.0
    backend_status: str = "unknown"
    solver_bound: float = -math.inf  # seconds; -inf: none
    infeasible: bool = False  # the backend proved that no schedule meets the constraints


class Ledger:
    """One solve's schedules, bounds and report, until `deadline`."""

    def __init__(self, instance: Instance, options: SolveOptions, deadline: Deadline):
        self.instance, self.options = instance, options
        self.objective, self.constraints = options.objective, options.constraints
        self.deadline = deadline
        self.best: Candidate | None = None  # the best schedule within the objective cap: the answer
        self.upper: Candidate | None = None  # the best meeting the other constraints: the horizon's source
        self.seeds: list[Candidate] = []  # good schedules of other kinds, in the order offered (the search's seeds)
        self.rows: dict[str, Bound] = {}
        self.lower = -math.inf
        self.analytic = -math.inf  # the best analytic bound (reported apart)
        self.fewest_batches = 0
        self.discarded: list[str] = []
        self.backend: str | None = None  # the backend whose answer the model phase took (a race's winner)
        self.trajectory = Trajectory(deadline)
        self.stats: dict = {}  # reported in `solve --json`'s stats, never read back
        self.route = None  # `route.Route`, once the heuristics have run
        self.model: ModelRun | None = None
        self.skipped: str | None = None
        self.impossible: str | None = None  # why the case alone shows that no schedule meets the constraints
        self.exported: str | None = None  # where the model was written (`options.export`)
        self.export_problem: str | None = None  # why it was not
        self.phases: tuple = ()  # the plan `run` goes through

    # ------------------------------------------------------------------ the loop

    def run(self, phases) -> None:
        """Every phase of `phases` (the plan) that applies to what the ledger holds, in order; a phase that
        solves part of the instance runs the same plan on a ledger of its own (`self.phases`)."""
        self.phases = phases
        for phase in phases:
            if phase.applies(self):
                try:
                    phase.run(self)
                except Stopped:  # an interrupt (or a deadline) outside a phase's own guard: what is known stands
                    pass

    # ------------------------------------------------------------------ what bounds may read (`bounds.base.Known`)

    @property
    def best_schedule(self) -> Schedule | None:
        return self.best.schedule if self.best is not None else None

    @property
    def best_value(self) -> float:
        return self.best.value if self.best is not None else math.inf

    # ------------------------------------------------------------------ schedules

    def offer(self, schedule: Schedule, source: str, metrics: Metrics | None = None, *, seed: bool = False,
              wins_ties: bool = False) -> bool:
        """Keep `schedule` if it meets the constraints and beats the best (`wins_ties`: or equals it).
        `metrics`: the one semantics' replay where the caller has it (a simulation); else the validator
        replays it. A `seed` is kept for the search too. True if it became the best."""
        metrics = metrics if metrics is not None else validate(self.instance, schedule).metrics
        if not self.constraints.admit(self.instance, schedule):
            return False
        candidate = Candidate(source, schedule, metrics, self.objective.of(metrics))
        if seed:
            self.seeds.append(candidate)
        if self.upper is None or candidate.value < self.upper.value:
            self.upper = candidate
        if not self.constraints.within_cap(candidate.value):
            return False
        if self.best is not None and not (candidate.value < self.best.value * (1 - 1e-12)
                                          or (wins_ties and candidate.value <= self.best.value)):
            return False
        self.best = candidate
        progress.report(best=candidate.value)
        self.trajectory.record(best=candidate.value)
        for row in list(self.rows.values()):
            if row.certified:
                self._check(row)
        return True

    # ------------------------------------------------------------------ bounds

    def certify(self, bound: Bound) -> Bound:
        """Record `bound` under its name (a later one replaces it); a certified one raises the lower
        bound. One above a validated schedule is dropped, with a warning. Returns what was kept."""
        self.rows[bound.name] = bound
        bound = self._check(bound)
        if not bound.certified or not bound.found:
            return bound
        self.fewest_batches = max(self.fewest_batches, bound.batches)
        if bound.value > self.lower:
            self.lower = bound.value
            progress.report(analytic=bound.value)
            self.trajectory.record(bound=bound.value)
        return bound

    def _check(self, bound: Bound) -> Bound:
        """`bound`, or where it is above the best validated schedule, its row emptied and said so."""
        if not (bound.found and self.best is not None and bound_above(bound.value, self.best.value, REL_TOL)):
            return bound
        # a validated schedule beats the "lower bound": a bug in it. Never report it
        why = f"the {bound.name} bound {bound.value:.9g} is above a validated schedule's {self.best.value:.9g}; discarded"
        warnings.warn(why, RuntimeWarning, stacklevel=3)
        self.discarded.append(why)
        bound = replace(bound, value=-math.inf, note="none kept: it was above a validated schedule (discarded)")
        self.rows[bound.name] = bound
        certified = [r.value for r in self.rows.values() if r.certified and r.found]
        self.lower = max(certified, default=-math.inf)
        return bound

    @property
    def proven(self) -> bool:
        """The best schedule meets a certified bound: it is optimal."""
        return self.best is not None and self.constraints.objective_cap is None and meets(self.best.value, self.lower)

    def done(self) -> bool:
        """Nothing more to do: proven (where a proven schedule may end the solve) or out of time."""
        return (self.proven and self.options.skip_proven and not self.options.export) or self.deadline.expired()

    # ------------------------------------------------------------------ the result

    def result(self, solver: str) -> Result:
        """The `Result` of what was found, an interrupt said as such."""
        best, route, model = self.best, self.route, self.model or ModelRun({})
        value = best.value if best is not None else None
        certified = route.certified if route is not None else True
        if self.impossible is not None or (model.infeasible and certified and not self.discarded):
            status = "infeasible"
        elif value is not None and certified and meets(value, self.lower):
            status = "optimal"
        elif value is not None:
            status = "feasible"
        else:
            status = "unknown"
        gap = max(0.0, (value - self.lower) / value) if value is not None and math.isfinite(self.lower) and value > 0 else None
        message = self._message(status, value, gap, certified)
        if interrupt.requested() is not None:
            if not interrupt.installed():  # a library caller may solve again: the interrupt is forgotten
                interrupt.reset()
            status, message = "interrupted", f"interrupted ({status}): {message}"
        if route is None:
            horizon, why, info, tick, formulation = None, "no schedule to derive a horizon from", {}, None, ""
        else:
            horizon, why, tick = route.J, route.why, route.tick
            info = model.info or {"variables": route.size}
            formulation = "search" if route.way == "search" else route.kind.name
        stats = dict(self.stats)
        if route is None and value is None:
            stats["stopped"] = "before any schedule was found"
        if self.skipped:
            stats["skipped"] = self.skipped
        self.trajectory.record(best=value, bound=self.lower)
        return Result(
            status, self.objective, value, self.lower, certified, gap, solver, formulation or self.options.formulation,
            self.deadline.elapsed(), best.schedule if best else None, best.metrics if best else None,
            best.name if best else "", message=message, horizon=horizon, horizon_reason=why,
            warm_start=model.warm_start, warm_start_accepted=model.warm_start_accepted,
            build_seconds=model.build_seconds, backend_seconds=model.backend_seconds,
            backend_status=model.backend_status, solver_bound=model.solver_bound, analytic_bound=self.analytic,
            conditional_bound=None if certified else model.solver_bound,
            bound_discarded="; ".join(self.discarded) or None, model=info, tick=tick,
            constraints=tuple(self.constraints.describe()), formulation_requested=self.options.formulation,
            backend_stats=stats, trajectory=self.trajectory.points, bounds=list(self.rows.values()),
            skipped=self.skipped, exported=self.exported,
            export_problem=(self.export_problem or "no model was built") if self.options.export and not self.exported
            else None)

    def _message(self, status: str, value, gap, certified: bool) -> str:
        """One sentence for people: what was found and what is known about it."""
        skipped = f"; {self.skipped}" if self.skipped else ""
        if status == "optimal":
            return f"optimal: {value:.9g} s, proven by a certified bound"
        if status == "infeasible":
            return f"infeasible: {self.impossible or 'no schedule meets the constraints within the certified horizon'}"
        if value is None:
            if self.route is None:
                bound = "the bound is analytic" if math.isfinite(self.lower) else "no bound computed yet"
                return f"stopped before any schedule was found; {bound}"
            return "no schedule found" + skipped
        what = "certified" if certified else "analytic (the solver's bound is conditional on the horizon)"
        gap_text = f", gap {gap:.2%}" if gap is not None else ""
        return f"best schedule {value:.9g} s, {what} lower bound {self.lower:.9g} s{gap_text}" + skipped
