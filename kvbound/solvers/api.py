"""`solve(instance, objective, backend, ...) -> Result`: the best schedule and a stated lower bound.

Flow: heuristic schedules (valid under the semantics and the hypothesis constraints) give
an upper bound and the warm start; the upper bound fixes a horizon J that provably admits
an optimal schedule; the formulation is solved; the solver's schedule is re-evaluated by
the validator, and that exact latency is what is reported.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..deadline import Deadline
from ..errors import KvboundError, SchedulerRefused, SchedulerStuck
from ..formulation.bigm import (OBJECTIVES, Constraints, build_bigm, first_token_prefix, horizon_for,
                               stops_at_first_tokens)
from ..formulation.chain import build_chain, chain_size
from ..formulation.network import build_network, network_size
from ..schedule import Batch, Metrics, ReplayState, Schedule, validate
from ..schedulers import FAST_HEURISTICS, run_scheduler
from ..workload import Instance
from .backends import BACKENDS, BackendOutcome, bound_above, solve_cbc, solve_cpsat, solve_highs
from .bounds import analytic_bounds
from .options import DEFAULT_TIME_LIMIT, SolveOptions

FORMULATIONS = ("auto", "chain", "network", "bigm")
BUILDERS = {"chain": build_chain, "network": build_network, "bigm": build_bigm}
#: state networks fold evict-only batches into the next batch (docs/formulation.md)
STATE_NETWORKS = ("chain", "network")
REL_TOL = 1e-6
#: larger models are not built (memory on a 24 GiB machine); `solve` then reports the best heuristic
#: schedule with the analytic bounds, and "auto" picks the chain model only below it
MODEL_LIMIT = 1_500_000


@dataclass
class Result:
    status: str  # optimal | feasible | infeasible | unknown
    objective_name: str
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
    stats: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "status": self.status,
            "objective_name": self.objective_name,
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
        }


def _finite_or_none(v: float):
    return v if v is not None and math.isfinite(v) else (None if v is None or v != math.inf else "inf")


def objective_value(metrics: Metrics, objective: str) -> float:
    return float(getattr(metrics, objective))


# ------------------------------------------------------------------------- schedules meeting constraints

def serial_schedule(instance: Instance, order=None, chunked: bool = True) -> Schedule | None:
    """Serve requests one at a time (in `order`): valid for every hypothesis constraint, no eviction."""
    sys_ = instance.system
    P = min(sys_.max_prefill_tokens, sys_.max_batch_tokens)
    batches = []
    st = ReplayState(instance)
    for i in (order if order is not None else sorted(range(len(instance)), key=lambda k: (instance.requests[k].arrival, k))):
        r = instance.requests[i]
        if r.prompt > P and not chunked:
            return None
        while not st.finished[i]:
            S = r.prompt + st.n[i]
            c = min(S - st.m[i], P) if st.n[i] == 0 else 1
            bt = Batch({i: c}, (), r.arrival if r.arrival > st.now else None)
            st.apply(bt)
            batches.append(bt)
    return Schedule(instance.requests, batches)


def satisfies(instance: Instance, schedule: Schedule, constraints: Constraints) -> bool:
    """Whether a valid schedule also meets the hypothesis constraints."""
    st = ReplayState(instance)
    first_seen: dict[int, int] = {}
    for j, bt in enumerate(schedule.batches):
        if constraints.no_evict and bt.evict:
            return False
        if constraints.max_batch_size is not None and len(bt.tokens) > constraints.max_batch_size:
            return False
        kinds = set()
        for i, c in bt.tokens.items():
            S, m = st.prompt[i] + st.n[i], (0 if i in bt.evict else st.m[i])
            decode = st.n[i] >= 1 and S - m == 1
            kinds.add(decode)
            if constraints.no_chunk and not decode and c != S - m:
                return False
            first_seen.setdefault(i, j)
        if constraints.no_hybrid and len(kinds) > 1:
            return False
        st.apply(bt)
    if constraints.admission_order is not None:
        starts = [first_seen[i] for i in constraints.admission_order]
        if any(b < a for a, b in zip(starts, starts[1:])):
            return False
    return True


@dataclass
class Candidate:
    name: str
    schedule: Schedule
    metrics: Metrics


def heuristic_candidates(instance: Instance, names, constraints: Constraints) -> list[Candidate]:
    """Valid schedules from the named heuristics (and the serial schedule), meeting the constraints."""
    out = []
    for name in names:
        try:
            res = run_scheduler(instance, name)
        except (SchedulerRefused, SchedulerStuck):
            continue
        if satisfies(instance, res.schedule, constraints):
            out.append(Candidate(name, res.schedule, res.replay.metrics))
    order = list(constraints.admission_order) if constraints.admission_order is not None else None
    serial = serial_schedule(instance, order, chunked=not constraints.no_chunk)
    if serial is not None and satisfies(instance, serial, constraints):
        out.append(Candidate("serial", serial, validate(instance, serial).metrics))
    return out


# ------------------------------------------------------------------------- solve

def solve(instance: Instance, objective: str = "total_latency", backend: str = "highs", time_limit: float = DEFAULT_TIME_LIMIT,
          warm_start=FAST_HEURISTICS, formulation: str = "auto", constraints: Constraints = Constraints(),
          horizon: int | None = None, verbose: bool = False, export: str | None = None, *,
          deadline: Deadline | None = None) -> Result:
    """`solve_with` for callers that name the options one by one (a notebook, a test)."""
    options = SolveOptions(objective, backend, formulation, time_limit, warm_start, horizon, constraints, verbose, export)
    return solve_with(instance, options, deadline)


def solve_with(instance: Instance, options: SolveOptions, deadline: Deadline | None = None) -> Result:
    """Best schedule and lower bound for `options.objective`; see the module docstring.

    `options.warm_start` names heuristics (the best valid one seeds the solver), or None.
    `options.horizon` overrides the batch count J; the bound is then certified only if J is at
    least the derived one. `deadline` (default: `options.time_limit` from now) bounds the whole call.
    """
    objective, backend, formulation = options.objective, options.backend, options.formulation
    constraints, horizon, warm_start = options.constraints, options.horizon, options.warm_start
    verbose, export = options.verbose, options.export
    deadline = deadline if deadline is not None else Deadline(options.time_limit)
    if backend not in BACKENDS:
        raise KvboundError(f"unknown solver {backend!r}; choose from {', '.join(BACKENDS)}")
    if formulation not in FORMULATIONS:
        raise KvboundError(f"unknown formulation {formulation!r}; choose from {', '.join(FORMULATIONS)}")
    t_start = time.perf_counter()
    requested = formulation
    cands = heuristic_candidates(instance, list(warm_start or ()), constraints)
    cap = constraints.objective_cap
    best = min(cands, key=lambda c: objective_value(c.metrics, objective)) if cands else None
    # the horizon comes from the best schedule of all candidates (they meet the constraints)
    ub = objective_value(best.metrics, objective) if best else None
    if formulation == "auto":
        # size the chain model with the horizon it would get (bigm's is at most twice that)
        j_net = horizon or (horizon_for(instance, objective, ub, not constraints.no_evict, True)[0] if ub is not None else 64)
        small = chain_size(instance, j_net) <= MODEL_LIMIT
        formulation = "chain" if small and constraints.admission_order is None else "bigm"
    if ub is not None:
        j_cert, certified, why = horizon_for(instance, objective, ub, allow_evict=not constraints.no_evict,
                                             evict_batches_implicit=formulation in STATE_NETWORKS)
    else:
        j_cert, certified, why = None, False, "no schedule meets the constraints to derive a horizon from"
    if horizon is not None:
        J = int(horizon)
        certified = certified and j_cert is not None and J >= j_cert
        why = f"horizon J = {J} given" + ("" if certified else f" (a certified horizon needs J >= {j_cert})" if j_cert else "")
    else:
        if j_cert is None:
            raise KvboundError("cannot derive a horizon: no heuristic schedule meets the constraints; give --horizon")
        J = j_cert
    if best is not None:
        prefix = best.schedule
        if stops_at_first_tokens(objective, constraints):
            prefix = Schedule(instance.requests, first_token_prefix(instance, best.schedule.batches))
        J = max(J, _batches_needed(prefix, formulation))
    tick = _tick_for(instance, J) if backend == "cpsat" else None
    size = model_size(instance, formulation, J)
    warm_x = None
    warm_name = None
    build_seconds = 0.0
    form = None
    if size > MODEL_LIMIT and not export:
        # no solver could take it here: the best heuristic schedule and the analytic bounds stand
        out = BackendOutcome("unknown", None, None, -math.inf, 0.0, None,
                             {"skipped": f"the {formulation} model would have ~{size:,} variables (limit {MODEL_LIMIT:,})"})
        scale = 1.0
    else:
        t_build = time.perf_counter()
        form = BUILDERS[formulation](instance, objective, J, constraints, tick=tick)
        arrays = form.model.finalize()
        build_seconds = time.perf_counter() - t_build
        if export:
            export_model(arrays, form, export)
        warm_within_cap = best is not None and (cap is None or ub <= cap * (1 + 1e-12))
        if best is not None and warm_within_cap and warm_start:
            warm_x = form.warm_start(best.schedule)
            warm_name = best.name
            bad = arrays.check(warm_x)
            if bad:  # a formulation bug: say so instead of silently starting cold
                raise RuntimeError(f"warm start from {best.name} violates the {form.name} model: {bad[0]}")
        remaining = max(0.5, deadline.remaining())
        if backend == "highs":
            out = solve_highs(arrays, remaining, warm_x, verbose=verbose)
        elif backend == "cpsat":
            out = solve_cpsat(arrays, remaining, warm_x, verbose=verbose)
        else:
            out = solve_cbc(arrays, remaining, warm_x, verbose=verbose)
        scale = form.objective_scale()
    # the solver's schedule, re-evaluated exactly
    options: list[Candidate] = []
    if out.x is not None:
        sched = form.extract(out.x)  # None: a first-token prefix that cannot be completed without evicting
        if sched is not None:
            options.append(Candidate("solver", sched, validate(instance, sched).metrics))
    options += [c for c in cands if cap is None or objective_value(c.metrics, objective) <= cap * (1 + 1e-12)]
    chosen = min(options, key=lambda c: objective_value(c.metrics, objective)) if options else None
    solver_bound = out.bound / scale if math.isfinite(out.bound) else out.bound
    analytic = max(b.value for b in analytic_bounds(instance, objective))
    value = objective_value(chosen.metrics, objective) if chosen else None
    discarded = None
    if value is not None and bound_above(solver_bound, value, REL_TOL):
        # a validated schedule beats the solver's "lower bound": a solver or formulation bug. Never
        # report it; fall back to the analytic bound and say so.
        discarded = f"the {backend} bound {solver_bound:.9g} is above a validated schedule's {value:.9g}; discarded"
        warnings.warn(discarded, RuntimeWarning, stacklevel=2)
        solver_bound = -math.inf
    lower = max(solver_bound, analytic) if certified else analytic
    conditional_bound = solver_bound if not certified else None
    if out.status == "infeasible" and certified and discarded is None:
        status = "infeasible"
    elif value is not None and certified and value - lower <= REL_TOL * max(abs(value), 1e-12):
        status = "optimal"
    elif value is not None:
        status = "feasible"
    else:
        status = "unknown"
    gap = None
    if value is not None and math.isfinite(lower) and value > 0:
        gap = max(0.0, (value - lower) / value)
    stats = {
        "horizon": J, "horizon_reason": why, "backend_status": out.status, "backend_seconds": out.seconds,
        "build_seconds": build_seconds, "warm_start": warm_name, "warm_start_accepted": out.warm_start_accepted,
        "solver_bound": _finite_or_none(solver_bound), "analytic_bound": _finite_or_none(analytic),
        "conditional_bound": _finite_or_none(conditional_bound) if conditional_bound is not None else None,
        "bound_discarded": discarded, "model": form.info if form else {"variables": size}, "tick": tick, "constraints": constraints.describe(), "formulation_requested": requested,
        **out.stats,
    }
    return Result(status, objective, value, lower, certified, gap, backend, formulation,
                  time.perf_counter() - t_start, chosen.schedule if chosen else None,
                  chosen.metrics if chosen else None, chosen.name if chosen else "", stats)


def model_size(instance: Instance, formulation: str, horizon: int) -> int:
    """About how many variables the formulation has at this horizon."""
    if formulation == "chain":
        return chain_size(instance, horizon)
    if formulation == "network":
        return network_size(instance, horizon)
    bits = max(1, int(math.ceil(math.log2(instance.system.max_batch_tokens + 1))))
    return horizon * len(instance) * (16 + 2 * bits)


def _batches_needed(schedule: Schedule, formulation: str) -> int:
    """Batches the warm-start schedule occupies in the model (state networks fold evict-only batches)."""
    if formulation in STATE_NETWORKS:
        return sum(1 for b in schedule.batches if b.tokens) + (1 if schedule.batches and not schedule.batches[-1].tokens else 0)
    return sum(1 for b in schedule.batches if b.tokens or b.evict)


CPSAT_MAGNITUDE_BITS = 36


def _tick_for(instance: Instance, horizon: int) -> float:
    """Time units per second for the integer (CP-SAT) model.

    Cost coefficients are floored to integers in these units, which keeps the bound valid.
    If a power of ten makes every coefficient and arrival an exact integer, that one is used
    (then nothing is lost); otherwise the smallest non-zero coefficient becomes >= 10^5
    units. Either way horizon * (largest batch time) must stay below 2^36 units: with larger
    values CP-SAT's floating-point relaxation was seen proving a wrong optimum (a bound 9% above a
    feasible point of the same model, tests/test_solvers.py::test_cpsat_with_a_non_decimal_preset_and_arrivals).
    """
    cost, s = instance.cost, instance.system
    t_max = (cost.intercept + cost.per_token * s.max_batch_tokens + cost.decode_kv * s.kv_capacity
             + cost.prefill_attention * (s.max_batch_tokens ** 2 + 2.0 * s.kv_capacity * s.max_batch_tokens)
             + cost.prefill_kv * s.kv_capacity + cost.per_prefill_request * len(instance))
    span = ((horizon + 1) * t_max + float(instance.arrivals.max()) + 1.0) * max(1, len(instance))
    limit = 2.0 ** CPSAT_MAGNITUDE_BITS / span
    values = [v for v in list(cost.coefficients) + list(instance.arrivals) if v > 0]
    for k in range(0, 13):
        tick = 10.0 ** k
        if tick > limit:
            break
        if all(abs(v * tick - round(v * tick)) <= 1e-9 * max(1.0, v * tick) for v in values):
            return tick
    return min(1e5 / min(c for c in cost.coefficients if c > 0), limit)


def export_model(arrays, form, path: str) -> None:
    """Write the model as MPS or LP (by suffix) through PuLP, with readable variable names."""
    prob, _ = _pulp_with_names(arrays, form)
    if path.endswith(".lp"):
        prob.writeLP(path)
    else:
        prob.writeMPS(path)


def _pulp_with_names(arrays, form):
    from .backends import build_pulp

    names = [""] * arrays.n_cols
    for block, idx in form.model.blocks.items():
        flat = np.asarray(idx).reshape(-1)
        for pos, k in zip(np.ndindex(*np.shape(idx)), flat):
            names[k] = block + "_" + "_".join(map(str, pos))
    return build_pulp(arrays, names)
