"""`Result`: one solve's outcome, the same shape from every route (a model, the search, or neither)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..bounds.base import Bound
from ..objective import Objective
from ..schedule import Metrics, Schedule


@dataclass
class Result:
    """One solve's outcome, the same shape from every backend and formulation (like scipy's OptimizeResult).

    `objective` is the validator's latency of the best schedule; `lower_bound` is certified when
    `bound_certified` (else it is conditional on the horizon, see `horizon_reason`).
    """
    status: str  # optimal | feasible | infeasible | unknown
    objective_name: Objective
    objective: float | None  # exact latency of the best schedule (validator), seconds
    lower_bound: float
    bound_certified: bool
    gap: float | None
    solver: str
    formulation: str
    seconds: float
    schedule: Schedule | None
    metrics: Metrics | None = None
    source: str = ""  # which schedule is best: "solver" or the heuristic's name
    message: str = ""
    horizon: int | None = None  # the model's batch count J
    horizon_reason: str = ""
    warm_start: str | None = None  # the heuristic whose schedule seeded the solver
    warm_start_accepted: bool | None = None
    build_seconds: float = 0.0
    backend_seconds: float = 0.0
    backend_status: str = "unknown"
    solver_bound: float = -math.inf  # the backend's bound in seconds (-inf: none, or discarded)
    analytic_bound: float = -math.inf
    conditional_bound: float | None = None  # the solver's bound when the horizon is not certified
    bound_discarded: str | None = None  # why a solver bound above a validated schedule was dropped
    model: dict = field(default_factory=dict)  # size of the model built (or estimated, if skipped)
    tick: float | None = None  # CP-SAT: model time units per second
    constraints: tuple[str, ...] = ()
    formulation_requested: str = ""
    backend_stats: dict = field(default_factory=dict)  # what the backend and the phases report (nodes, status text, ...)
    trajectory: list = field(default_factory=list)  # {"seconds", "best", "bound"} at each improvement
    bounds: list[Bound] = field(default_factory=list)  # every bound computed, certified or not, by name
    skipped: str | None = None  # why no model was solved where one could have been
    exported: str | None = None  # the file the model was written to (`--export`)
    export_problem: str | None = None  # why the model asked for was not written

    @property
    def success(self) -> bool:
        """The answer is proven: an optimal schedule, or proven infeasibility."""
        return self.status in ("optimal", "infeasible")

    @property
    def stats(self) -> dict:
        """The statistics as `solve --json` reports them (kvbound's own keys, then the backend's)."""
        return {
            "horizon": self.horizon, "horizon_reason": self.horizon_reason, "backend_status": self.backend_status,
            "backend_seconds": self.backend_seconds, "build_seconds": self.build_seconds,
            "warm_start": self.warm_start, "warm_start_accepted": self.warm_start_accepted,
            "solver_bound": _finite_or_none(self.solver_bound), "analytic_bound": _finite_or_none(self.analytic_bound),
            "conditional_bound": _finite_or_none(self.conditional_bound) if self.conditional_bound is not None else None,
            "bound_discarded": self.bound_discarded, "model": self.model, "tick": self.tick,
            "constraints": list(self.constraints), "formulation_requested": self.formulation_requested,
            **self.backend_stats,
        }

    def to_json(self) -> dict:
        return {
            "status": self.status,
            "success": self.success,
            "message": self.message,
            "objective_name": str(self.objective_name),
            "objective": self.objective,
            "lower_bound": _finite_or_none(self.lower_bound),
            "bound_certified": self.bound_certified,
            "gap": self.gap,
            "solver": self.solver,
            "formulation": self.formulation,
            "seconds": self.seconds,
            "schedule": self.schedule.to_json() if self.schedule is not None else None,
            "best_source": self.source,
            "metrics": self.metrics.to_dict() if self.metrics is not None else None,
            "stats": self.stats,
            "trajectory": self.trajectory,
            "bounds": [b.to_json() for b in self.bounds],
            "exported": self.exported,
            "export_problem": self.export_problem,
        }


def _finite_or_none(v: float):
    return v if v is not None and math.isfinite(v) else (None if v is None or v != math.inf else "inf")
