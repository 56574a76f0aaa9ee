"""Headroom under load: latency-load curves of schedulers against the best schedule kvbound finds and
the certified lower bound, at several request rates (docs/analysis.md, "kvbound headroom").

`headroom(instance, rates)` scales the case's arrival times by each rate factor f (every arrival time
divided by f, as `kvbound capacity` does: f = 2 is the same requests at twice the rate) and, at each
factor, runs `compare(..., solve=True)`: every chosen scheduler simulated and replayed by the
validator, a solve warm-started from them (its best schedule replayed too), and the best certified
lower bound of the objective (the analytic bounds and the solve's certified one). Per point:

    lower_bound <= best <= every scheduler's value

where `best` is the least objective value of any validated schedule at that point (the solve's or a
scheduler's). With an SLO, each scheduler's attainment and `slo_attainment_upper_bound`, a certified
upper bound on the share of requests any schedule can keep within the SLO: the least of
`slo_alone_bound` (each request alone; the same at every rate) and kvbound.analysis.slo_bound's
prefill-deadline relaxation (the first prefills of the requests on time fit one machine's time line
within [arrival, arrival + S]).

`capacity`: each scheduler's own capacity, by the bisection of kvbound.analysis.capacity. With an SLO
it is Apt-Serve's effective throughput (the largest factor with attainment >= `attainment`); without,
the largest factor whose objective stays within `within` x the unloaded value (the mean over requests
of each one alone, a lower bound of every schedule at every rate). `upper_bound`: the certified factor
at and above which no schedule stays within that same limit (kvbound.analysis.capacity_bound; None with
an SLO, or where not even every request at once is shown to exceed it), `upper_bound_note` how it is
certified. It is computed first, within the capacity searches' share of the time.

The time limit is shared by the whole call: `CAPACITY_SHARE` of it at most for the capacity searches
(they stop when converged), then the rest split over the rate points (each point gets the time left
over the rounds of points not started, so a point that ends early leaves its time to the others). The
capacity searches, then the points, are independent units (kvbound.units): by default a process pool
runs as many at once as there are cores (each point then getting that many times the time), `workers`
1 runs them in this process, `backend` "ray" as Ray tasks (on the cluster at `address`, else a local
Ray). The result is the same from each, points in the same order, but for what more time finds: a
point that runs beside others gets their shares of the time too.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from .. import interrupt
from ..alone import time_alone
from ..deadline import Deadline
from ..errors import InputError, SchedulerRefused, SchedulerStuck
from ..interrupt import Stopped
from ..objective import Objective
from ..schedule import Slo
from ..solvers.options import DEFAULT_TIME_LIMIT, SolveOptions
from ..units import UnitRunner
from ..workload import Instance
from .capacity_bound import capacity_upper_bound
from .capacity import LIMIT, base_rate, capacity, latency_capacity, scale_arrivals
from .compare import COMPLETE, INTERRUPTED, OPTIMAL, TIME_LIMIT, compare, resolve_schedulers
from .record import UnitRecord
from .slo_bound import alone_attainable, slo_attainment_upper_bound

#: the schedulers compared when none are named (those in the registry)
DEFAULT_SCHEDULERS = ("vllm-v1", "sarathi", "larry", "srpt")
#: the objectives a headroom curve is drawn for
HEADROOM_OBJECTIVES = ("mean_latency", "mean_ttft")
#: the keys of `--json` (a contract: extend, don't rename), in order; the point's and the row's keys
#: marked "slo" appear only with an SLO
TOP_KEYS = ("objective", "points", "capacity", "base_rate", "slo", "time_limit", "seconds", "status", "recorded")
POINT_KEYS = ("rate_factor", "lower_bound", "bound_certified", "best", "slo_attainment_upper_bound", "rows",
              "requests_per_second", "bound_source", "best_source", "status", "seconds")
ROW_KEYS = ("scheduler", "mean_latency", "mean_ttft", "p50_ttft", "p95_ttft", "p99_ttft", "mean_tbt",
            "slo_attainment", "refused")
CAPACITY_KEYS = ("upper_bound", "schedulers", "definition", "upper_bound_note", "notes")
#: the capacity searches take at most this share of the time limit (they end when converged)
CAPACITY_SHARE = 0.2
#: the capacity searches' relative bracket width (kvbound.analysis.capacity)
CAPACITY_TOLERANCE = 0.01
#: without an SLO, a scheduler's capacity is the largest factor whose objective <= WITHIN x the unloaded value
DEFAULT_WITHIN = 2.0
#: seconds kept back from the points for the end of the command (the JSON, a plot), at most a third of the limit
RESERVE_SECONDS = 1.5
#: `upper_bound_note` where the certified capacity bound is not computed
UPPER_BOUND_WITH_SLO = ("not computed with --slo: the certified capacity bound is for the mean objective's limit "
                        "(without --slo); docs/analysis.md, 'The certified capacity bound'")


@dataclass
class HeadroomPoint:
    rate_factor: float
    requests_per_second: float
    lower_bound: float | None  # the best certified lower bound of the objective (None: none known)
    bound_certified: bool
    best: float | None  # the least objective of any validated schedule at this point
    rows: list[dict]  # one per scheduler: ROW_KEYS
    slo_attainment_upper_bound: float | None = None
    bound_source: str = ""
    best_source: str = ""  # the scheduler's name, or the solve's row label ("optimal (proven)" or "optimal (best
    #                        found, not proven)") and where its schedule came from
    status: str = COMPLETE  # COMPLETE, TIME_LIMIT (a row not simulated in time) or INTERRUPTED
    seconds: float = 0.0

    def to_json(self, with_slo: bool) -> dict:
        out = {k: getattr(self, k) for k in POINT_KEYS if k != "rows"}
        out["rows"] = [{k: r.get(k) for k in ROW_KEYS if k != "slo_attainment" or with_slo} for r in self.rows]
        if not with_slo:
            del out["slo_attainment_upper_bound"]
        return {k: out[k] for k in POINT_KEYS if k in out}

    def value(self, scheduler: str, key: str) -> float | None:
        for r in self.rows:
            if r["scheduler"] == scheduler:
                return r.get(key)
        return None


@dataclass
class HeadroomResult:
    objective: str
    points: list[HeadroomPoint]
    schedulers: list[str]
    capacity: dict[str, float | None]  # each scheduler's own capacity (rate factor); None: not found in time
    capacity_definition: str
    base_rate: float  # requests per second at rate factor 1
    slo: Slo | None = None
    time_limit: float | None = None
    seconds: float = 0.0
    capacity_notes: dict[str, str] = field(default_factory=dict)
    capacity_upper_bound: float | None = None
    capacity_upper_bound_note: str = ""  # how the factor is certified, or why it is None
    status: str = COMPLETE
    recorded: int = 0  # units taken from the folder `out` (finished by an earlier run), not computed again

    def to_json(self) -> dict:
        with_slo = self.slo is not None
        cap = {"upper_bound": self.capacity_upper_bound, "schedulers": dict(self.capacity),
               "definition": self.capacity_definition,
               "upper_bound_note": self.capacity_upper_bound_note,
               "notes": dict(self.capacity_notes)}
        return {"objective": self.objective, "points": [p.to_json(with_slo) for p in self.points], "capacity": cap,
                "base_rate": self.base_rate, "slo": str(self.slo) if with_slo else None,
                "time_limit": self.time_limit, "seconds": self.seconds, "status": self.status,
                "recorded": self.recorded}

    def to_markdown(self) -> str:
        """One table: per rate factor, each scheduler's objective, the best found and the bound."""
        label = Objective(self.objective).label
        head = ["rate factor", "req/s", *self.schedulers, "best found", "certified bound", "gap best-bound"]
        lines = [f"*{label} (s) per rate factor; gap = (best - bound) / best*", "",
                 "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for p in self.points:
            vals = [_num(p.value(s, self.objective)) for s in self.schedulers]
            gap = (f"{100 * (p.best - p.lower_bound) / p.best:.1f}%"
                   if p.best and p.lower_bound is not None else "n/a")
            lb = _num(p.lower_bound) + ("" if p.bound_certified or p.lower_bound is None else " (not certified)")
            lines.append("| " + " | ".join([f"{p.rate_factor:g}", f"{p.requests_per_second:.3g}", *vals,
                                            _num(p.best), lb, gap]) + " |")
        caps = ", ".join(f"{s} {_num(f)}" for s, f in self.capacity.items())
        upper = (_num(self.capacity_upper_bound) if self.capacity_upper_bound is not None
                 else f"none ({self.capacity_upper_bound_note})" if self.capacity_upper_bound_note else "not computed")
        lines += ["", f"capacity ({self.capacity_definition}): {caps or 'none'}; certified upper bound: {upper}"]
        return "\n".join(lines)


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def parse_rates(rates, source: str = "", field: str = "rates") -> list[float]:
    """Rate factors from a list or a comma-separated string: finite, > 0, within [2^-20, 2^20];
    duplicates dropped; ascending."""
    if isinstance(rates, str):
        parts = [p.strip() for p in rates.split(",")]
        if not rates.strip() or any(not p for p in parts):
            raise InputError(source, field, f"{rates!r}: expected a comma list of rate factors, e.g. 0.5,1,2")
        values = []
        for p in parts:
            try:
                values.append(float(p))
            except ValueError:
                raise InputError(source, field, f"{p!r} is not a number") from None
    else:
        values = [float(v) for v in rates]
    if not values:
        raise InputError(source, field, "no rate factor given")
    for v in values:
        if not (math.isfinite(v) and 1 / LIMIT <= v <= LIMIT):
            raise InputError(source, field, f"{v:g}: a rate factor must be a finite number in [2^-20, 2^20]")
    return sorted(set(values))


def slo_alone_bound(instance: Instance, slo: Slo) -> float:
    """A certified upper bound on the share of requests any schedule keeps within `slo`: a request can
    attain it only if, even alone, its TTFT can be <= slo.ttft and its least gap between two tokens
    <= slo.tbt (`slo_bound.alone_attainable`). The same at every rate (arrivals do not enter);
    `slo_attainment_upper_bound` is never above it."""
    return float(alone_attainable(instance, slo).mean()) if len(instance) else 1.0


def unloaded_value(instance: Instance, objective) -> float:
    """The objective's mean over requests of each one alone (its fewest batches' intercepts and least
    work from its arrival): a lower bound of every schedule at every rate."""
    return float(time_alone(instance, Objective.parse(objective)).mean()) if len(instance) else 0.0


# ------------------------------------------------------------------------------ the units of work

def _row(r, objective: str) -> dict:
    m = r.metrics.to_dict() if r.metrics is not None else {}
    out = {k: m.get(k) for k in ROW_KEYS if k not in ("scheduler", "refused")}
    return {"scheduler": r.scheduler, **out, "refused": r.refused}


def run_point(instance: Instance, factor: float, names: list[str], options: SolveOptions, slo: Slo | None,
              seconds: float | None) -> HeadroomPoint:
    """One rate point: `compare(..., solve=True)` on the scaled case within `seconds` (None: no limit)."""
    began = time.perf_counter()
    scaled = scale_arrivals(instance, factor)
    table = compare(scaled, names, solve=True, options=options, deadline=Deadline(seconds), slo=slo)
    objective = table.objective_name
    best_source = ""
    if table.best_known is not None:
        best_row = min((r for r in table.rows if r.value(objective) is not None),
                       key=lambda r: (r.value(objective), r.scheduler == OPTIMAL))  # a tie: the scheduler
        best_source = best_row.label  # the solve's row says whether it is proven
        if best_row.scheduler == OPTIMAL and table.solve_result is not None and table.solve_result.source:
            best_source = f"{best_row.label}: {table.solve_result.source}"
    rows = [_row(r, objective) for r in table.rows if r.scheduler != OPTIMAL]
    upper = slo_attainment_upper_bound(scaled, slo) if slo is not None else None  # within the alone bound
    return HeadroomPoint(factor, base_rate(instance) * factor, table.lower_bound, table.bound_certified,
                         table.best_known, rows, upper, table.bound_source, best_source, table.status,
                         round(time.perf_counter() - began, 3))


def run_capacity(instance: Instance, scheduler: str, objective: str, slo: Slo | None, attainment: float,
                 within: float, seconds: float | None) -> tuple[float | None, str]:
    """One scheduler's capacity within `seconds`: (rate factor, "") or (None or the capped factor, why)."""
    try:
        with Deadline(seconds).enforced():
            if slo is not None:
                result = capacity(instance, scheduler, slo, attainment, rel_tol=CAPACITY_TOLERANCE)
            else:
                limit = within * unloaded_value(instance, objective)
                result = latency_capacity(instance, scheduler, objective, limit, rel_tol=CAPACITY_TOLERANCE)
    except Stopped as stop:
        return None, f"not found: {stop.reason}"
    except (SchedulerRefused, SchedulerStuck) as exc:
        return None, f"the scheduler cannot serve the case: {exc}"
    if result.interrupted:
        return None, "not found: interrupted"
    return result.rate_factor, result.cap_note


def run_capacity_bound(instance: Instance, objective: str, within: float | None,
                       seconds: float | None) -> tuple[float | None, str]:
    """The certified capacity bound (kvbound.analysis.capacity_bound) for `within` x the unloaded value
    within `seconds`: (factor or None, how it is certified or why there is none). `within` None: an SLO
    was given, and the bound is not for it."""
    if within is None:
        return None, UPPER_BOUND_WITH_SLO
    try:
        with Deadline(seconds).enforced():
            bound = capacity_upper_bound(instance, objective, within * unloaded_value(instance, objective))
    except Stopped as stop:
        return None, f"not computed: {stop.reason}"
    if bound.factor is None:
        return None, bound.covered_by
    return bound.factor, (f"at every rate factor >= {bound.factor:.6g} every schedule's {Objective(objective).label} "
                          f"exceeds {bound.limit:.6g} s; certified by {bound.covered_by} ({bound.seconds:g} s)")


# ------------------------------------------------------------------------------ the whole curve

def headroom(instance: Instance, rates, schedulers=DEFAULT_SCHEDULERS, *, objective: str = "mean_latency",
             slo: Slo | None = None, attainment: float = 0.7, within: float = DEFAULT_WITHIN,
             time_limit: float | None = DEFAULT_TIME_LIMIT, options: SolveOptions | None = None,
             workers: int | None = None, backend: str = "local", address: str | None = None,
             progress: Callable[[str], None] | None = None, out: str | Path | None = None) -> HeadroomResult:
    """The headroom of `instance` at each rate factor in `rates` (see the module docstring).

    `schedulers`: a list or comma string of scheduler specs (default DEFAULT_SCHEDULERS); `options`:
    how to solve (its objective and time limit are replaced by `objective` and the share of
    `time_limit`, the limit of the whole call; None: none). Where the units run, as `kvbound sweep`'s
    points do: `backend` "local", a process pool of `workers` (default: the CPU count; 1: in this
    process), or "ray", Ray tasks on the cluster at `address` or on a local Ray of `workers` CPUs; the
    points' own solves run their units there too (`options.units`). `progress(label)` is called as
    each unit (a capacity search, a rate point) ends.

    `out`: a folder that keeps each unit as it finishes (kvbound.analysis.record): a unit recorded
    there by an earlier call with the same case and settings is taken from it, not computed again,
    and the time limit is shared by the units left. A unit cut short (by the time limit or an
    interrupt: a capacity search not found, a bound not computed, a point not complete) is not kept.
    """
    t0 = time.perf_counter()
    deadline = Deadline(time_limit)
    if str(objective) not in HEADROOM_OBJECTIVES:
        raise InputError("", "objective", f"{objective!r}: headroom draws {' or '.join(HEADROOM_OBJECTIVES)}")
    objective = str(Objective.parse(objective))
    factors = parse_rates(rates)
    names = resolve_schedulers(schedulers if schedulers is not None else DEFAULT_SCHEDULERS)
    if not 0 < attainment <= 1:
        raise InputError("", "attainment", f"must be in (0, 1], got {attainment}")
    if not (math.isfinite(within) and within >= 1):
        raise InputError("", "within", f"must be a finite number >= 1 (a multiple of the unloaded value), got {within}")
    runner = UnitRunner(backend, workers, address)  # bad input (Ray not installed, no workers) before any work
    rate = base_rate(instance)  # a case without arrival times is bad input here
    options = (options or SolveOptions()).but(objective=objective, units=runner)
    if slo is not None:
        definition = f"the largest rate factor with SLO attainment >= {attainment:g} at {slo}"
    else:
        ref = unloaded_value(instance, objective)
        definition = (f"the largest rate factor with {Objective(objective).label} <= {within:g} x {ref:.6g} s "
                      f"(the mean of each request alone, the unloaded value)")
    # the end of the command (the output, a plot) is kept out of the points' time
    work = deadline.shifted(-min(RESERVE_SECONDS, deadline.limit / 3)) if math.isfinite(deadline.limit) else deadline
    caps: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    points: dict[float, HeadroomPoint] = {}
    status = COMPLETE
    upper, upper_note = None, None
    record = UnitRecord(out, instance) if out is not None else None
    keys = _UnitKeys(record, objective, slo, attainment, within, names, options)

    def capacity_found(name: str, factor: float | None, note: str) -> None:
        caps[name] = factor
        if note:
            notes[name] = note
        if progress:
            progress(f"capacity {name}")

    def point_found(factor: float, point: HeadroomPoint) -> None:
        points[factor] = point
        if progress:
            progress(f"rate factor {factor:g}")

    try:
        with runner.session():  # one Ray (where named) for both groups of units
            cap_deadline = work.share(CAPACITY_SHARE)
            upper, upper_note = keys.recorded(keys.upper_bound()) or (None, None)
            if upper_note is None:
                upper, upper_note = run_capacity_bound(instance, objective, None if slo is not None else within,
                                                       cap_deadline.remaining())
                if not upper_note.startswith("not computed"):
                    keys.keep("capacity bound", keys.upper_bound(), [upper, upper_note])
            todo = keys.not_recorded(names, keys.capacity, lambda name, found: capacity_found(name, *found))
            searches = _shared(runner, cap_deadline, run_capacity, instance, todo, objective, slo, attainment, within)
            with closing(searches):
                for k, (factor, note) in searches:
                    if not note.startswith("not found"):
                        keys.keep(f"capacity {todo[k]}", keys.capacity(todo[k]), [factor, note])
                    capacity_found(todo[k], factor, note)
            todo = keys.not_recorded(factors, keys.point, lambda f, found: point_found(f, HeadroomPoint(**found)))
            rate_points = _shared(runner, work, run_point, instance, todo, names, options, slo)
            with closing(rate_points):
                for k, point in rate_points:
                    if point.status == COMPLETE:
                        keys.keep(f"rate factor {todo[k]!r}", keys.point(todo[k]), asdict(point))
                    point_found(todo[k], point)
    except Stopped:
        if interrupt.requested() is None:
            raise
    if upper_note is None:  # interrupted before the bound
        upper, upper_note = None, "not computed: interrupted"
    if interrupt.requested() is not None:
        status = INTERRUPTED
    elif any(p.status != COMPLETE for p in points.values()) or any(n.startswith("not found") for n in notes.values()):
        status = TIME_LIMIT
    for s in names:
        if s not in caps:
            caps[s] = None
            notes.setdefault(s, "not found: interrupted" if status == INTERRUPTED else "not found: time limit")
    return HeadroomResult(objective, [points[f] for f in factors if f in points], names,
                          {s: caps[s] for s in names}, definition, rate, slo, time_limit,
                          round(time.perf_counter() - t0, 3), {s: notes[s] for s in names if s in notes}, upper, upper_note,
                          status, record.reused if record is not None else 0)


class _UnitKeys:
    """The keys of headroom's units in a `UnitRecord` (what determines each unit's result), and the record
    itself; without a record nothing is found or kept."""

    def __init__(self, record: UnitRecord | None, objective: str, slo: Slo | None, attainment: float, within: float,
                 names: list[str], options: SolveOptions):
        self.record = record
        self.base = {"objective": objective, "slo": str(slo) if slo is not None else None}
        self.target = {"attainment": attainment} if slo is not None else {"within": within}
        self.names = names
        self.solve = {k: repr(getattr(options, k)) for k in ("backend", "formulation", "warm_start", "horizon",
                                                            "constraints", "skip_proven")}

    def upper_bound(self) -> dict:
        return {"unit": "capacity bound", **self.base, **self.target}

    def capacity(self, name: str) -> dict:
        return {"unit": "capacity", "scheduler": name, **self.base, **self.target}

    def point(self, factor: float) -> dict:
        return {"unit": "rate point", "rate_factor": factor, "schedulers": self.names, **self.base, **self.solve}

    def recorded(self, settings: dict):
        return None if self.record is None else self.record.get(self.record.key(**settings))

    def not_recorded(self, items: list, settings: Callable, found: Callable) -> list:
        """The items whose unit (`settings(item)`) is not recorded; `found(item, result)` for the others."""
        todo = []
        for item in items:
            result = self.recorded(settings(item))
            if result is None:
                todo.append(item)
            else:
                found(item, result)
        return todo

    def keep(self, unit: str, settings: dict, result) -> None:
        if self.record is not None:
            self.record.put(unit, self.record.key(**settings), result)


def _shared(runner: UnitRunner, deadline: Deadline, fn: Callable, instance: Instance, keys: list, *rest):
    """`(index, fn(instance, keys[index], *rest, seconds))` as each unit ends, on `runner`: a unit's
    seconds are reckoned as it starts, the time left before `deadline` over the rounds of units not
    yet started (None without a limit), so time a unit leaves unused goes to the later ones."""
    def start(key, rounds: int) -> Callable:
        seconds = deadline.remaining() / rounds if math.isfinite(deadline.limit) else None
        return partial(fn, instance, key, *rest, seconds)

    return runner.run(_call, keys, start)


def _call(call: Callable):
    """A unit in a worker: its call, arguments bound."""
    return call()
