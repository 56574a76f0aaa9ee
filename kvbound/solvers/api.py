"""`solve(instance, objective, backend, ...) -> Result`: the best schedule and a stated lower bound.

Flow: heuristic schedules (valid under the semantics and the hypothesis constraints) give
an upper bound and the warm start; the upper bound fixes a horizon J that provably admits
an optimal schedule; the formulation is solved; the solver's schedule is re-evaluated by
the validator, and that exact latency is what is reported.
"""
from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..accounting import is_decode_type, largest_batch_time
from .. import interrupt, progress
from ..deadline import Deadline
from ..interrupt import Stopped
from ..errors import InputError, KvboundError, SchedulerRefused, SchedulerStuck
from ..formulation import FORMULATION_KINDS, FormulationKind
from ..formulation.base import Constraints, first_token_prefix, horizon_for, stops_at_first_tokens
from ..formulation.bounds import analytic_bounds
from ..objective import Objective
from ..schedule import Batch, Metrics, ReplayState, Schedule, validate
from ..schedulers import FAST_HEURISTICS, run_scheduler
from ..workload import Instance
from .backends import BACKENDS, BackendOutcome, bound_above
from .decompose import Trajectory, search
from .options import DEFAULT_TIME_LIMIT, SolveOptions

#: the names `--formulation` takes: "auto" picks chain or bigm by size, and the Lagrangian search
#: (`decompose.search`) where neither model fits (AUTO_BIGM_LIMIT)
SEARCH = "lagrangian"
FORMULATIONS = ("auto", *FORMULATION_KINDS, SEARCH)
REL_TOL = 1e-6
#: larger models are not built (memory on a 24 GiB machine); `solve` then reports the best heuristic
#: schedule with the analytic bounds, and "auto" picks the chain model only below it
MODEL_LIMIT = 1_500_000
#: "auto" builds Big-M only below this size: on the real-trace cases, Big-M models of 275k-791k
#: variables returned the warm start and bounds of 0-5% of the optimum in 120 s (bench/results/real.md),
#: where the search improves both
AUTO_BIGM_LIMIT = 100_000


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
    backend_stats: dict = field(default_factory=dict)  # whatever the backend reports (nodes, status text, ...)
    trajectory: list = field(default_factory=list)  # {"seconds", "best", "bound"} at each improvement

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
        }


def _finite_or_none(v: float):
    return v if v is not None and math.isfinite(v) else (None if v is None or v != math.inf else "inf")


def objective_value(metrics: Metrics, objective: str | Objective) -> float:
    return Objective.parse(objective).of(metrics)


# ------------------------------------------------------------------------- schedules meeting constraints

def serial_schedule(instance: Instance, order=None, chunked: bool = True) -> Schedule | None:
    """Serve requests one at a time (in `order`): valid for every hypothesis constraint, no eviction."""
    sys_ = instance.system
    P = sys_.prefill_per_batch
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
            decode = is_decode_type(st.n[i], S - m)
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


def heuristic_candidates(instance: Instance, names, constraints: Constraints, deadline: Deadline | None = None,
                         fallback: Deadline | None = None) -> list[Candidate]:
    """Valid schedules from the named heuristics (and the serial schedule), meeting the constraints.

    With a `deadline`, each runs while time is left; one cut short by it or by an interrupt is
    left out, the rest are kept. If none is made by then, the serial schedule still gets until
    `fallback` (a later deadline): the solver needs a schedule to derive its horizon from."""
    deadline = deadline if deadline is not None else Deadline(None)
    out = []
    try:
        for name in names:
            with deadline.enforced():
                try:
                    res = run_scheduler(instance, name)
                except (SchedulerRefused, SchedulerStuck):
                    continue
                if satisfies(instance, res.schedule, constraints):
                    out.append(Candidate(name, res.schedule, res.replay.metrics))
    except Stopped:
        pass
    serial_deadline = deadline if out or fallback is None or interrupt.requested() is not None else fallback
    try:
        with serial_deadline.enforced():
            order = list(constraints.admission_order) if constraints.admission_order is not None else None
            serial = serial_schedule(instance, order, chunked=not constraints.no_chunk)
            if serial is not None and satisfies(instance, serial, constraints):
                out.append(Candidate("serial", serial, validate(instance, serial).metrics))
    except Stopped:
        pass
    return out


# ------------------------------------------------------------------------- solve

def solve(instance: Instance, objective: str = "total_latency", backend: str = "highs", time_limit: float = DEFAULT_TIME_LIMIT,
          warm_start=FAST_HEURISTICS, formulation: str = "auto", constraints: Constraints = Constraints(),
          horizon: int | None = None, verbose: bool = False, export: str | None = None, *,
          skip_proven: bool = True, deadline: Deadline | None = None) -> Result:
    """`solve_with` for callers that name the options one by one (a notebook, a test)."""
    options = SolveOptions(objective, backend, formulation, time_limit, warm_start, horizon, constraints, verbose, export,
                           skip_proven)
    return solve_with(instance, options, deadline)


def solve_with(instance: Instance, options: SolveOptions, deadline: Deadline | None = None,
               analytic: float | None = None, model_deadline: Deadline | None = None) -> Result:
    """Best schedule and lower bound for `options.objective`; see the module docstring.

    `options.warm_start` names heuristics (the best valid one seeds the solver), or None.
    `options.horizon` overrides the batch count J; the bound is then certified only if J is at
    least the derived one. `deadline` (default: `options.time_limit` from now) bounds the whole call.
    `analytic`: the largest of `analytic_bounds(instance, options.objective)` where the caller has
    it already (computed here otherwise). `model_deadline` (earlier than `deadline`): where the
    heuristics' share and a model's solve end, for a caller that runs more after a model
    (`lower_bounds`: the LP relaxation); the search, after which nothing runs, uses all of `deadline`.
    """
    deadline = deadline if deadline is not None else Deadline(options.time_limit)
    budget = model_deadline if model_deadline is not None else deadline
    objective = options.objective
    backend = _lookup(BACKENDS, options.backend, "solver")
    if options.formulation not in ("auto", SEARCH):
        _lookup(FORMULATION_KINDS, options.formulation, "formulation")
    if analytic is None:
        analytic = max(b.value for b in analytic_bounds(instance, objective))
    progress.report(phase="heuristics", analytic=analytic)
    # the heuristics get half of the time at most: the solver needs the rest
    cands = heuristic_candidates(instance, list(options.warm_start or ()), options.constraints,
                                 budget.share(HEURISTIC_SHARE), budget)
    best = min(cands, key=lambda c: objective.of(c.metrics)) if cands else None
    # the horizon comes from the best schedule of all candidates (they meet the constraints)
    ub = objective.of(best.metrics) if best else None
    progress.report(best=ub)
    trajectory = Trajectory(deadline)
    trajectory.record(best=ub, bound=analytic)
    kind = _pick_formulation(instance, options, ub)
    if best is None and budget.expired():  # stopped before any schedule: the analytic bound stands
        return _stopped_result(instance, options, backend, kind, analytic, deadline)
    plan = _plan(instance, options, backend, kind, best)
    cap = options.constraints.objective_cap
    proven = ub is not None and cap is None and ub - analytic <= REL_TOL * max(abs(ub), 1e-12)
    if proven and options.skip_proven and not options.export:
        # a heuristic schedule meets a certified analytic bound (valid under any constraints): it is
        # optimal, and a model could add nothing but time and memory
        attempt = _Attempt.without_model(skipped="the best heuristic schedule meets the analytic bound: optimal without a model")
    elif best is not None and not options.export and (options.formulation == SEARCH or (
            options.formulation == "auto" and (plan.size > MODEL_LIMIT or (kind.name == "bigm" and plan.size > AUTO_BIGM_LIMIT)))):
        attempt = _search(instance, options, plan, best, cands, analytic, deadline, trajectory)
        cands = cands + attempt.found
    elif plan.size > MODEL_LIMIT and not options.export:
        # no solver could take it here: the best heuristic schedule and the analytic bounds stand
        attempt = _Attempt.without_model(skipped=f"the {kind.name} model would have ~{plan.size:,} variables (limit {MODEL_LIMIT:,})")
    else:
        attempt = _solve_model(instance, options, backend, plan, best, budget)
    with interrupt.deferred():  # what is known is reported, whatever comes now
        # the Lagrangian bound holds at any horizon, as the analytic ones do
        result = _result(instance, options, backend, plan, attempt, cands, max(analytic, attempt.lagrangian), deadline)
        result.analytic_bound = analytic
        trajectory.record(best=result.objective, bound=result.lower_bound)
        result.trajectory = trajectory.points
        if "search" in attempt.out.stats:
            result.formulation = SEARCH
        return result


#: the part of the time limit the warm-start heuristics may use (they stop at it; the solver gets the rest)
HEURISTIC_SHARE = 0.5
#: how many of the best heuristic schedules seed the admission-pattern search
SEARCH_SEEDS = 3


@dataclass
class _Plan:
    """The model a solve would build: its kind, horizon (and whether the bound is certified at
    it, and why that horizon), CP-SAT's time tick and its size in variables."""

    kind: FormulationKind
    J: int
    certified: bool
    why: str
    tick: float | None
    size: int


def _plan(instance: Instance, options: SolveOptions, backend, kind: FormulationKind, best: Candidate | None) -> _Plan:
    ub = options.objective.of(best.metrics) if best else None
    J, certified, why = _horizon(instance, options, kind, ub)
    if best is not None:
        prefix = best.schedule
        if stops_at_first_tokens(options.objective, options.constraints):
            prefix = Schedule(instance.requests, first_token_prefix(instance, best.schedule.batches))
        J = max(J, kind.batches_needed(prefix))
    tick = _tick_for(instance, J) if backend.integer_ticks else None
    return _Plan(kind, J, certified, why, tick, kind.size(instance, J))


@dataclass
class _Attempt:
    """What the model (or the search instead of one) produced: the backend's outcome, the model
    and its objective scale, the warm start it took, and the search's schedules and bound."""

    out: BackendOutcome
    form: object = None
    scale: float = 1.0
    warm_name: str | None = None
    build_seconds: float = 0.0
    lagrangian: float = -math.inf
    found: list = field(default_factory=list)

    @classmethod
    def without_model(cls, **stats) -> "_Attempt":
        return cls(_no_outcome(**stats))


def _no_outcome(**stats) -> BackendOutcome:
    """No backend ran (or none finished): no solution, no bound; `stats` say why."""
    return BackendOutcome("unknown", None, None, -math.inf, 0.0, None, stats)


def _search(instance, options, plan: _Plan, best: Candidate, cands, analytic: float, deadline: Deadline,
            trajectory: Trajectory) -> _Attempt:
    """No model (too large, or not asked for): the Lagrangian bound and the pattern search use the time."""
    objective, cap = options.objective, options.constraints.objective_cap
    progress.report(phase=SEARCH)
    # the runners-up (by value, other heuristics) seed the search's patterns too
    others = tuple(c.schedule for c in sorted(cands, key=lambda c: objective.of(c.metrics)) if c is not best)
    found = search(instance, objective, options.constraints, best.schedule, objective.of(best.metrics), deadline,
                   trajectory, satisfies, known_bound=analytic if cap is None else -math.inf,
                   others=others[:SEARCH_SEEDS - 1])
    extra = [Candidate(found.name, found.schedule, found.metrics)] if found.schedule is not None else []
    if bound_above(found.bound, min(objective.of(c.metrics) for c in cands + extra), REL_TOL):
        # above a validated schedule: a bug in the bound; never report it
        warnings.warn(f"the Lagrangian bound {found.bound:.9g} is above a validated schedule; discarded",
                      RuntimeWarning, stacklevel=3)
        found.bound = -math.inf
        found.stats["lagrangian_note"] = "none kept: it was above a validated schedule (discarded)"
    kind, size = plan.kind, plan.size
    why_not = "" if options.formulation == SEARCH else \
        f"the {kind.name} model would have ~{size:,} variables (auto's limit {min(MODEL_LIMIT, AUTO_BIGM_LIMIT) if kind.name == 'bigm' else MODEL_LIMIT:,}); "
    # total latency: the configuration LP's batch bound (certified), where the search computed it
    config = found.stats.get("configuration_lp", {}).get("bound", -math.inf)
    if bound_above(config, min(objective.of(c.metrics) for c in cands + extra), REL_TOL):
        warnings.warn(f"the configuration LP bound {config:.9g} is above a validated schedule; discarded",
                      RuntimeWarning, stacklevel=3)
        config, found.stats["configuration_lp"]["bound"] = -math.inf, None
    what = "packing, " if "packing" in found.stats else ""
    attempt = _Attempt.without_model(search=why_not + what + "Lagrangian bound and admission-pattern search", **found.stats,
                                     lagrangian_bound=found.bound if math.isfinite(found.bound) else None)
    attempt.lagrangian, attempt.found = max(found.bound, config), extra
    return attempt


def _solve_model(instance, options, backend, plan: _Plan, best: Candidate | None, deadline: Deadline) -> _Attempt:
    """Build the model, warm-start it from the best heuristic schedule and run the backend."""
    objective, cap = options.objective, options.constraints.objective_cap
    attempt = _Attempt(_no_outcome())
    t_build = time.perf_counter()
    try:
        progress.report(phase="model")
        with deadline.enforced():  # building cannot ask the deadline: it is cut short when it passes
            attempt.form = form = plan.kind.build(instance, objective, plan.J, options.constraints, tick=plan.tick)
            arrays = form.model.finalize()
        attempt.build_seconds = time.perf_counter() - t_build
        if options.export:
            export_model(arrays, form, options.export)
        warm_x = None
        if best is not None and options.warm_start and (cap is None or objective.of(best.metrics) <= cap * (1 + 1e-12)):
            warm_x, attempt.warm_name = form.warm_start(best.schedule), best.name
            bad = arrays.check(warm_x)
            if bad:  # a formulation bug: say so instead of silently starting cold
                raise RuntimeError(f"warm start from {best.name} violates the {form.name} model: {bad[0]}")
        attempt.scale = form.objective_scale()
        progress.report(phase=backend.name, scale=attempt.scale, bound_certified=plan.certified)
        attempt.out = backend.run(arrays, max(0.5, deadline.remaining()), warm_x, verbose=options.verbose)
    except Stopped as stop:  # the model build (or the CBC model) was cut short: the heuristics stand
        if attempt.form is None:
            attempt.build_seconds = time.perf_counter() - t_build
        attempt.out = _no_outcome(stopped=f"{stop.reason} before the solver ran")
    return attempt


def _result(instance, options, backend, plan: _Plan, attempt: _Attempt, cands, analytic: float,
            deadline: Deadline) -> Result:
    """The solver's schedule, re-evaluated exactly, against the heuristics'; the certified bound; the status."""
    objective, constraints, cap = options.objective, options.constraints, options.constraints.objective_cap
    out, form, certified = attempt.out, attempt.form, plan.certified
    schedules: list[Candidate] = []
    if out.x is not None:
        sched = form.extract(out.x)  # None: a first-token prefix that cannot be completed without evicting
        if sched is not None:
            schedules.append(Candidate("solver", sched, validate(instance, sched).metrics))
    schedules += [c for c in cands if cap is None or objective.of(c.metrics) <= cap * (1 + 1e-12)]
    chosen = min(schedules, key=lambda c: objective.of(c.metrics)) if schedules else None
    value = objective.of(chosen.metrics) if chosen else None
    solver_bound = out.bound / attempt.scale if math.isfinite(out.bound) else out.bound
    discarded = None
    if value is not None and bound_above(solver_bound, value, REL_TOL):
        # a validated schedule beats the solver's "lower bound": a solver or formulation bug. Never
        # report it; fall back to the analytic bound and say so.
        discarded = f"the {backend.name} bound {solver_bound:.9g} is above a validated schedule's {value:.9g}; discarded"
        warnings.warn(discarded, RuntimeWarning, stacklevel=3)
        solver_bound = -math.inf
    lower = max(solver_bound, analytic) if certified else analytic
    if out.status == "infeasible" and certified and discarded is None:
        status = "infeasible"
    elif value is not None and certified and value - lower <= REL_TOL * max(abs(value), 1e-12):
        status = "optimal"
    elif value is not None:
        status = "feasible"
    else:
        status = "unknown"
    gap = max(0.0, (value - lower) / value) if value is not None and math.isfinite(lower) and value > 0 else None
    message = _message(status, value, lower, gap, certified, out)
    status, message = _if_interrupted(status, message)
    return Result(
        status, objective, value, lower, certified, gap, backend.name, plan.kind.name, deadline.elapsed(),
        chosen.schedule if chosen else None, chosen.metrics if chosen else None, chosen.name if chosen else "",
        message=message,
        horizon=plan.J, horizon_reason=plan.why, warm_start=attempt.warm_name, warm_start_accepted=out.warm_start_accepted,
        build_seconds=attempt.build_seconds, backend_seconds=out.seconds, backend_status=out.status,
        solver_bound=solver_bound, analytic_bound=analytic,
        conditional_bound=None if certified else solver_bound, bound_discarded=discarded,
        model=form.info if form else {"variables": plan.size}, tick=plan.tick, constraints=tuple(constraints.describe()),
        formulation_requested=options.formulation, backend_stats=dict(out.stats))


def _if_interrupted(status: str, message: str) -> tuple[str, str]:
    """An interrupted call says so (status "interrupted"); what it knew is kept. A library caller
    (no signal handler installed) may solve again: the interrupt is then forgotten."""
    if interrupt.requested() is None:
        return status, message
    if not interrupt.installed():
        interrupt.reset()
    return "interrupted", f"interrupted ({status}): {message}"


def _stopped_result(instance, options, backend, kind, analytic: float, deadline: Deadline) -> Result:
    """Stopped (time limit or interrupt) before any schedule was known: only the analytic bound."""
    status, message = _if_interrupted("unknown", "stopped before any schedule was found; the bound is analytic")
    return Result(status, options.objective, None, analytic, True, None, backend.name, kind.name, deadline.elapsed(),
                  None, message=message, horizon_reason="no schedule to derive a horizon from",
                  analytic_bound=analytic, constraints=tuple(options.constraints.describe()),
                  formulation_requested=options.formulation, backend_stats={"stopped": "before any schedule was found"})


def _lookup(table: dict, name: str, what: str):
    if name not in table:
        raise KvboundError(f"unknown {what} {name!r}; choose from {', '.join(table)}")
    return table[name]


def _pick_formulation(instance: Instance, options: SolveOptions, upper_bound: float | None) -> FormulationKind:
    """The named formulation, or for "auto" the chain model while it stays below MODEL_LIMIT at the
    horizon it would get (and can express the constraints), else Big-M."""
    if options.formulation not in ("auto", SEARCH):
        return FORMULATION_KINDS[options.formulation]
    chain = FORMULATION_KINDS["chain"]
    if options.horizon:
        J = options.horizon
    elif upper_bound is not None:
        J = horizon_for(instance, options.objective, upper_bound, not options.constraints.no_evict, chain.folds_evict_only)[0]
    else:
        J = 64
    small = chain.size(instance, J) <= MODEL_LIMIT
    return chain if small and options.constraints.admission_order is None else FORMULATION_KINDS["bigm"]


def _horizon(instance: Instance, options: SolveOptions, kind: FormulationKind,
             upper_bound: float | None) -> tuple[int, bool, str]:
    """(J, certified, reason): the derived horizon, or the given one (certified only if >= the derived)."""
    if upper_bound is not None:
        j_cert, certified, why = horizon_for(instance, options.objective, upper_bound,
                                             allow_evict=not options.constraints.no_evict,
                                             evict_batches_implicit=kind.folds_evict_only)
    else:
        j_cert, certified, why = None, False, "no schedule meets the constraints to derive a horizon from"
    if options.horizon is None:
        if j_cert is None:
            # named by the field, so the CLI says `--horizon` only where the command has that flag
            raise InputError("", "horizon", "cannot be derived: no heuristic schedule meets the constraints; give one")
        return j_cert, certified, why
    J = int(options.horizon)
    certified = certified and j_cert is not None and J >= j_cert
    why = f"horizon J = {J} given" + ("" if certified else f" (a certified horizon needs J >= {j_cert})" if j_cert else "")
    return J, certified, why


def _message(status: str, value, lower: float, gap, certified: bool, out: BackendOutcome) -> str:
    """One sentence for people: what was found and what is known about it."""
    if status == "optimal":
        return f"optimal: {value:.9g} s, proven by a certified bound"
    if status == "infeasible":
        return "infeasible: no schedule meets the constraints within the certified horizon"
    if value is None:
        return "no schedule found" + (f"; {out.stats['skipped']}" if "skipped" in out.stats else "")
    what = "certified" if certified else "analytic (the solver's bound is conditional on the horizon)"
    gap_text = f", gap {gap:.2%}" if gap is not None else ""
    return f"best schedule {value:.9g} s, {what} lower bound {lower:.9g} s{gap_text}" + \
        (f"; {out.stats['skipped']}" if "skipped" in out.stats else "")


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
    t_max = largest_batch_time(s, cost, len(instance))
    span = ((horizon + 1) * t_max + float(instance.arrivals.max()) + 1.0) * max(1, len(instance))
    limit = 2.0 ** CPSAT_MAGNITUDE_BITS / span
    values = [v for v in list(cost.coefficients) + list(cost.per_token_above) + list(instance.arrivals) if v > 0]
    for k in range(0, 13):
        tick = 10.0 ** k
        if tick > limit:
            break
        if all(abs(v * tick - round(v * tick)) <= 1e-9 * max(1.0, v * tick) for v in values):
            return tick
    return min(1e5 / min(c for c in cost.coefficients if c > 0), limit)


def export_model(arrays, form, path: str) -> None:
    """Write the model as MPS or LP (by suffix) through PuLP, with readable variable names."""
    import os
    import tempfile

    from ..fileio import write_user_file

    prob, _ = _pulp_with_names(arrays, form)
    suffix = ".lp" if path.endswith(".lp") else ".mps"
    with tempfile.TemporaryDirectory(prefix="kvbound-export-") as tmp:  # PuLP writes in place: then one atomic write
        staged = os.path.join(tmp, "model" + suffix)
        prob.writeLP(staged) if suffix == ".lp" else prob.writeMPS(staged)
        with open(staged, "rb") as handle:
            write_user_file(path, handle.read())


def _pulp_with_names(arrays, form):
    from .backends import build_pulp

    names = [""] * arrays.n_cols
    for block, idx in form.model.blocks.items():
        flat = np.asarray(idx).reshape(-1)
        for pos, k in zip(np.ndindex(*np.shape(idx)), flat):
            names[k] = block + "_" + "_".join(map(str, pos))
    return build_pulp(arrays, names, _lp_names(arrays.row_names()))


def _lp_names(labels: list[str]) -> list[str]:
    """Row labels as LP/MPS names (letters, digits and _; unique): `kv_capacity[j=7]` -> `kv_capacity_j7`."""
    out, seen = [], set()
    for label in labels:
        name = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", label.replace("=", ""))).strip("_")
        base, k = name, 1
        while name in seen:
            k += 1
            name = f"{base}_{k}"
        seen.add(name)
        out.append(name)
    return out
