"""Effective throughput (Apt-Serve's "capacity"): the highest request rate at which a scheduler keeps at
least a given share of requests within an SLO, found by scaling a case's arrival times.

The rate factor f divides every arrival time (f = 2: the same requests in half the time, twice the
rate). `capacity()` brackets the largest f whose SLO attainment is >= the target (doubling or halving
from f = 1), then bisects on log f until the bracket is within `rel_tol`. It assumes attainment falls
as the rate grows (true of every scheduler here in practice, not guaranteed); it reports the largest
f it saw attain the target. Every schedule is replayed by the validator.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InputError
from ..io.schedules import schedule_from_json
from ..schedule import Slo, validate
from ..schedulers import get_scheduler, simulate
from ..workload import Instance, Request

#: the factors tried stay within [1 / LIMIT, LIMIT]
LIMIT = 2.0 ** 20


@dataclass
class CapacityResult:
    scheduler: str
    rate_factor: float  # the largest factor found that attains the target (0: none down to 1 / LIMIT)
    requests_per_second: float  # the case's mean arrival rate times rate_factor
    slo_attainment: float  # at rate_factor
    evaluations: int

    def to_json(self) -> dict:
        return {"scheduler": self.scheduler, "rate_factor": self.rate_factor,
                "requests_per_second": self.requests_per_second, "slo_attainment": self.slo_attainment}


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
    sim = simulate(instance, get_scheduler(scheduler))
    replay = validate(instance, schedule_from_json(sim.schedule.to_json()))
    return replay.apply_slo(slo).slo_attainment


def capacity(instance: Instance, scheduler: str, slo: Slo, attainment: float = 0.7, *, rel_tol: float = 0.01,
             progress: Callable[[float, float], None] | None = None) -> CapacityResult:
    """The largest rate factor with SLO attainment >= `attainment` (see the module docstring)."""
    if not 0 < attainment <= 1:
        raise InputError("", "attainment", f"must be in (0, 1], got {attainment}")
    get_scheduler(scheduler)  # a bad name or option is bad input before any work
    rate = base_rate(instance)
    seen: dict[float, float] = {}

    def att(f: float) -> float:
        if f not in seen:
            seen[f] = slo_attainment(scale_arrivals(instance, f), scheduler, slo)
            if progress:
                progress(f, seen[f])
        return seen[f]

    lo, hi = 1.0, 1.0
    if att(1.0) >= attainment:
        while hi < LIMIT and att(hi * 2) >= attainment:
            hi *= 2
        lo, hi = hi, hi * 2
    else:
        while lo > 1 / LIMIT and att(lo / 2) < attainment:
            lo /= 2
        lo, hi = lo / 2, lo
    if hi > LIMIT or lo < 1 / LIMIT:  # never fell below the target, or never reached it
        best = max((f for f, a in seen.items() if a >= attainment), default=0.0)
        return CapacityResult(scheduler, best, rate * best, seen.get(best, 0.0), len(seen))
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if att(mid) >= attainment:
            lo = mid
        else:
            hi = mid
    return CapacityResult(scheduler, lo, rate * lo, att(lo), len(seen))
