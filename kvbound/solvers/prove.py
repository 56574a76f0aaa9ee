"""The two workflows of the seed paper (Section 5), each ending in a verdict with its evidence.

* better_than: "a schedule at least X% better than scheduler S exists" is PROVED by a
  validated witness schedule at or below the target, REFUTED by a certified lower bound
  above the target, and UNKNOWN otherwise (at the time limit).
* compare_sets: "constraint set A is strictly better than B" is PROVED when a valid
  schedule under A beats B's certified lower bound, REFUTED when a valid schedule under B
  reaches A's certified lower bound (then A cannot be strictly better), UNKNOWN otherwise.
"""
from __future__ import annotations

from .. import interrupt
from ..constraints import Constraints
from ..deadline import Deadline
from ..interrupt import Stopped
from ..schedulers import run_scheduler
from .driver import solve_with
from .options import SolveOptions
from .result import Result

_EPS = 1e-9


def _s(value) -> str:
    """A value in seconds for a sentence (none where there is none)."""
    return "none" if value is None else f"{value:.6g} s"


def _status(*results: Result) -> str:
    """"interrupted" where any solve was (its evidence is what was known then), else "complete"."""
    return "interrupted" if interrupt.requested() is not None or any(r.status == "interrupted" for r in results) \
        else "complete"


def _summary(res: Result) -> dict:
    return {"status": res.status, "formulation": res.formulation, "objective": res.objective, "lower_bound": res.lower_bound,
            "bound_certified": res.bound_certified, "gap": res.gap, "best_source": res.source,
            "evictions": res.metrics.evictions if res.metrics else None,
            "schedule": res.schedule.to_json() if res.schedule else None}


def better_than(instance, scheduler: str, percent: float, options: SolveOptions, deadline: Deadline | None = None) -> dict:
    objective = options.objective
    deadline = deadline if deadline is not None else Deadline(options.time_limit)
    try:
        with deadline.enforced():  # the reference simulation counts in the time limit
            base = run_scheduler(instance, scheduler)
    except Stopped as stop:
        return {"hypothesis": f"a schedule {percent:g}% better than {scheduler}'s exists", "verdict": "unknown",
                "reason": f"{stop.reason} before {scheduler}'s schedule was simulated",
                "evidence": {"reference": {"scheduler": scheduler, "objective": None}},
                "status": "interrupted" if interrupt.requested() is not None else "complete"}
    reference = objective.of(base.replay.metrics)
    target = reference * (1 - percent / 100.0)
    strict = percent <= 0  # "better by 0%" means strictly better
    res = solve_with(instance, options, deadline)
    hyp = (f"a schedule with {objective} {'<' if strict else '<='} {target:.6g} s exists "
           f"({percent:g}% better than {scheduler}'s {reference:.6g} s)")
    found = res.objective is not None and (res.objective < target * (1 - _EPS) if strict else res.objective <= target * (1 + _EPS))
    if found:
        verdict = "proved"
        reason = f"witness schedule (validated) with {objective} {res.objective:.6g} s"
    elif res.bound_certified and (res.lower_bound >= target * (1 - _EPS) if strict else res.lower_bound > target * (1 + _EPS)):
        verdict = "refuted"
        reason = f"certified lower bound {res.lower_bound:.6g} s {'>=' if strict else '>'} target {target:.6g} s"
    else:
        verdict = "unknown"
        reason = (f"best schedule {_s(res.objective)} and lower bound {_s(res.lower_bound)} "
                  f"({'certified' if res.bound_certified else 'conditional'}) leave the target {target:.6g} s open")
    return {"hypothesis": hyp, "verdict": verdict, "reason": reason,
            "evidence": {"reference": {"scheduler": scheduler, "objective": reference}, "target": target,
                         "optimum": _summary(res)}, "status": _status(res)}


def compare_sets(instance, name_a: str, set_a: Constraints, name_b: str, set_b: Constraints, options: SolveOptions,
                 deadline: Deadline | None = None) -> dict:
    """Each side gets half of the time (set A half of it, set B whatever is left)."""
    deadline = deadline if deadline is not None else Deadline(options.time_limit)
    objective = options.objective
    ra = solve_with(instance, options.but(constraints=set_a), deadline.share(0.5))
    rb = solve_with(instance, options.but(constraints=set_b), deadline)
    hyp = f"schedules under [{name_a}] reach a strictly lower {objective} than any schedule under [{name_b}]"
    if ra.objective is not None and rb.bound_certified and ra.objective < rb.lower_bound * (1 - _EPS):
        verdict = "proved"
        reason = f"a valid [{name_a}] schedule has {ra.objective:.6g} s < certified [{name_b}] bound {rb.lower_bound:.6g} s"
    elif rb.objective is not None and ra.bound_certified and rb.objective <= ra.lower_bound * (1 + _EPS):
        verdict = "refuted"
        reason = f"a valid [{name_b}] schedule has {rb.objective:.6g} s <= certified [{name_a}] bound {ra.lower_bound:.6g} s"
    elif rb.status == "infeasible" and ra.objective is not None:
        verdict = "proved"
        reason = f"no schedule satisfies [{name_b}]"
    else:
        verdict = "unknown"
        reason = "the best schedules and bounds of the two sets overlap at the time limit"
    return {"hypothesis": hyp, "verdict": verdict, "reason": reason,
            "evidence": {name_a: _summary(ra), name_b: _summary(rb)}, "status": _status(ra, rb)}
