"""Effective throughput (Apt-Serve's "capacity"): the highest request rate at which a scheduler keeps at
least a given share of requests within an SLO, found by scaling a case's arrival times.

The rate factor f divides every arrival time (f = 2: the same requests in half the time, twice the
rate). `capacity()` brackets the largest f whose SLO attainment is >= the target (doubling or halving
from f = 1), then bisects on log f until the bracket is within `rel_tol`. It assumes attainment falls
as the rate grows (true of every scheduler here in practice, not guaranteed); it reports the largest
f it saw attain the target. Every schedule is replayed by the validator.

The factors tried stay within [1 / LIMIT, LIMIT]. When the attainment never falls below the target up
to LIMIT (or never reaches it down to 1 / LIMIT), the result is that cap, not a measurement: `capped`
says so (`rate_factor` is LIMIT, or 0).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .. import interrupt
from ..errors import InputError
from ..interrupt import Stopped
from ..schedule import Slo
from ..schedulers import get_scheduler, simulate
from ..workload import Instance, Request

#: the factors tried stay within [1 / LIMIT, LIMIT]
LIMIT = 2.0 ** 20
#: `rel_tol`, the relative width of the final bracket, is in [MIN_TOLERANCE, MAX_TOLERANCE]: below, the
#: bisection would stall on floating-point steps; above 1 the doubling bracket (a factor 2) is already narrower
MIN_TOLERANCE, MAX_TOLERANCE = 1e-6, 1.0


@dataclass
class CapacityResult:
    scheduler: str
    rate_factor: float  # the largest factor found that attains the target (0: none down to 1 / LIMIT)
    requests_per_second: float  # the case's mean arrival rate times rate_factor
    slo_attainment: float  # at rate_factor
    evaluations: int
    capped: bool = False  # the search hit a cap of its range: rate_factor is LIMIT (or 0), not a measurement
    interrupted: bool = False  # cut short by Ctrl-C or SIGTERM: the best factor found by then
    target: str = "the SLO attainment"  # what the factor keeps (for the notes): the SLO's, or an objective's limit

    def to_json(self) -> dict:
        return {"scheduler": self.scheduler, "rate_factor": self.rate_factor,
                "requests_per_second": self.requests_per_second, "slo_attainment": self.slo_attainment,
                "capped": self.capped, "status": "interrupted" if self.interrupted else "complete"}

    @property
    def cap_note(self) -> str:
        """What a capped result means, in a sentence ("" when not capped)."""
        if not self.capped:
            return ""
        if self.rate_factor > 0:
            return (f"the search reached its cap, rate factor {LIMIT:.0f} (2^20), with {self.target} still met: "
                    f"the capacity is at least this, not measured")
        return (f"{self.target} is not met even at rate factor 1/{LIMIT:.0f} (2^-20), the search's lower cap: "
                f"no capacity measured")


def scale_arrivals(instance: Instance, factor: float) -> Instance:
    """The same requests with every arrival time divided by `factor` (> 0)."""
    reqs = tuple(Request(r.prompt, r.output, r.arrival / factor) for r in instance.requests)
    return Instance(reqs, instance.system, instance.cost, instance.name, source=instance.source)


def base_rate(instance: Instance) -> float:
    """Requests per second of the case as given: N / (last arrival - first arrival)."""
    arrivals = [r.arrival for r in instance.requests]
    span = max(arrivals) - min(arrivals)
    if span <= 0:
        raise InputError(instance.source or "", "workload",
                         "every request arrives at the same time, so there is no rate to scale (give arrival times)")
    return len(arrivals) / span


def slo_attainment(instance: Instance, scheduler: str, slo: Slo) -> float:
    replay = simulate(instance, get_scheduler(scheduler)).replay  # the validator's replay, as it ran
    return replay.apply_slo(slo).slo_attainment


def capacity(instance: Instance, scheduler: str, slo: Slo, attainment: float = 0.7, *, rel_tol: float = 0.01,
             progress: Callable[[float, float], None] | None = None) -> CapacityResult:
    """The largest rate factor with SLO attainment >= `attainment` (see the module docstring)."""
    if not 0 < attainment <= 1:
        raise InputError("", "attainment", f"must be in (0, 1], got {attainment}")
    _check_tolerance(rel_tol)
    get_scheduler(scheduler)  # a bad name or option is bad input before any work
    return _search(instance, scheduler, lambda inst: slo_attainment(inst, scheduler, slo),
                   lambda a: a >= attainment, rel_tol, progress, f"the SLO attainment >= {attainment:g}")


def objective_value(instance: Instance, scheduler: str, objective) -> float:
    """The scheduler's value of `objective` (a Metrics field, e.g. mean_latency) on `instance`, replayed by
    the validator (SchedulerRefused / SchedulerStuck when it cannot serve the case)."""
    replay = simulate(instance, get_scheduler(scheduler)).replay  # the validator's replay, as it ran
    return float(getattr(replay.metrics, str(objective)))


def latency_capacity(instance: Instance, scheduler: str, objective, limit: float, *, rel_tol: float = 0.01,
                     progress: Callable[[float, float], None] | None = None) -> CapacityResult:
    """The largest rate factor at which the scheduler's `objective` (mean_latency, mean_ttft) is <= `limit`
    seconds, by the same search as `capacity` (assuming the value grows with the rate). The result's
    `slo_attainment` field holds the objective's value at that factor."""
    if not (math.isfinite(limit) and limit > 0):
        raise InputError("", "limit", f"must be a finite number of seconds > 0, got {limit}")
    _check_tolerance(rel_tol)
    get_scheduler(scheduler)
    return _search(instance, scheduler, lambda inst: objective_value(inst, scheduler, objective),
                   lambda v: v <= limit, rel_tol, progress, f"{objective} <= {limit:g} s")


def _check_tolerance(rel_tol: float) -> None:
    if not MIN_TOLERANCE <= rel_tol <= MAX_TOLERANCE:
        raise InputError("", "tolerance", f"must be in [{MIN_TOLERANCE:g}, {MAX_TOLERANCE:g}] (the relative width "
                                          f"of the final bracket), got {rel_tol:g}")


def _search(instance: Instance, scheduler: str, measure: Callable[[Instance], float], ok: Callable[[float], bool],
            rel_tol: float, progress: Callable[[float, float], None] | None, target: str) -> CapacityResult:
    """The largest factor f whose `measure(scale_arrivals(instance, f))` is `ok` (assumed ok below it,
    not ok above): bracketed by doubling or halving from 1, then bisected on log f."""
    rate = base_rate(instance)
    seen: dict[float, float] = {}

    def att(f: float) -> float:
        if f not in seen:
            if interrupt.requested() is not None:  # one pending since before the search (it raises only as it comes)
                raise Stopped("interrupted")
            seen[f] = measure(scale_arrivals(instance, f))
            if progress:
                progress(f, seen[f])
        return seen[f]

    def best_seen(**flags) -> CapacityResult:
        best = max((f for f, a in seen.items() if ok(a)), default=0.0)
        return CapacityResult(scheduler, best, rate * best, seen.get(best, 0.0), len(seen), target=target, **flags)

    try:
        with interrupt.raising():  # one pending since before the search too (it would raise only as it came)
            lo, hi = 1.0, 1.0
            if ok(att(1.0)):
                while hi < LIMIT and ok(att(hi * 2)):
                    hi *= 2
                lo, hi = hi, hi * 2
            else:
                while lo > 1 / LIMIT and not ok(att(lo / 2)):
                    lo /= 2
                lo, hi = lo / 2, lo
            if hi > LIMIT or lo < 1 / LIMIT:  # never fell below the target, or never reached it
                return best_seen(capped=True)
            while hi / lo > 1 + rel_tol:
                mid = math.sqrt(lo * hi)
                if ok(att(mid)):
                    lo = mid
                else:
                    hi = mid
            return CapacityResult(scheduler, lo, rate * lo, att(lo), len(seen), target=target)
    except Stopped:  # an interrupt: the best factor measured by then, said so
        if interrupt.requested() is None:
            raise
        return best_seen(interrupted=True)
