"""`kvbound.solvers.solve` against the brute-force oracle, on every backend.

On instances the oracle can check (2-3 requests, prompts <= 4, outputs <= 3) every backend
must return status "optimal" with exactly the brute-force optimum, a certified lower bound
that is not above it, and a schedule the validator accepts with exactly the reported
objective. Then: warm starts, time limits, horizons, and the hypothesis constraints.
"""
from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kvbound import CostModel, Instance, Request, Schedule, SystemConfig, load_case, validate
from kvbound.costs import PRESETS
from kvbound.errors import KvboundError
from kvbound.formulation.bigm import (OBJECTIVES, Constraints, build_bigm, first_token_prefix, horizon_for,
                                      stops_at_first_tokens)
from kvbound.schedulers import FAST_HEURISTICS, run_scheduler
from kvbound.solvers.api import FORMULATIONS, _batches_needed, _tick_for, heuristic_candidates, objective_value, satisfies, solve
from kvbound.solvers.backends import BACKENDS, solve_cpsat, solve_highs
from tests.conftest import REPO
from tests.oracle import brute_force

REL = 1e-6  # the optimum must be matched to this
BOUND_REL = 1e-9  # a lower bound may exceed the optimum by this much (rounding), no more
TIME_LIMIT = 60.0  # never reached on these instances; a solve that needs it fails the test (not optimal)

ROUND = CostModel(intercept=1.0, per_token=0.1, decode_kv=0.01, prefill_attention=0.001)
ALL_TERMS = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125, prefill_attention=0.0625, prefill_kv=0.5,
                      per_prefill_request=0.75)
A100 = PRESETS["llama2-7b-a100"]
UNIT = PRESETS["unit-batches"]
KV_HEAVY = CostModel(intercept=0.5, per_token=0.1, decode_kv=0.25, prefill_kv=0.2)  # evict-only batches can pay


def inst(requests, M, C, P=None, b=1, cost=ROUND) -> Instance:
    return Instance(tuple(Request(*r) for r in requests), SystemConfig(M, C, P, b), cost)


WORKED = inst([(3, 3), (2, 2), (2, 1, 1.5)], M=6, C=4)  # docs/semantics.md section 13, arrival moved to 1.5
FIG15 = inst([(2, 3), (2, 3)], M=4, C=64, cost=A100)  # Figure 15 family at I = 2, O = 3: evicting pays
BLOCKS2 = inst([(3, 2), (2, 2)], M=6, C=4, P=2, b=2)
PREFILL_LIMIT = inst([(4, 1), (2, 2), (1, 3)], M=8, C=5, P=3, cost=ALL_TERMS)
IDLE_GAP = inst([(2, 2), (1, 3, 0.5), (3, 1, 6.0)], M=5, C=3)  # the last request arrives after the others finish
TIGHT_C = inst([(3, 2), (2, 3)], M=5, C=2)
UNIT_ONLINE = inst([(2, 2), (1, 3), (2, 1, 1.0)], M=4, C=3, cost=UNIT)

#: (id, instance, objective, no_evict)
FIXED = [
    ("worked-total", WORKED, "total_latency", False),
    ("worked-ttft-no-evict", WORKED, "mean_ttft", True),
    ("fig15-total", FIG15, "total_latency", False),
    ("fig15-total-no-evict", FIG15, "total_latency", True),
    ("blocks2-mean", BLOCKS2, "mean_latency", False),
    ("prefill-limit-total-no-evict", PREFILL_LIMIT, "total_latency", True),
    ("idle-gap-total", IDLE_GAP, "total_latency", False),
    ("tight-c-ttft", TIGHT_C, "mean_ttft", False),
    ("unit-online-mean-no-evict", UNIT_ONLINE, "mean_latency", True),
]

CBC_ROUNDED_BOUND = pytest.mark.xfail(
    strict=True, reason="bug: solve_cbc sets the bound of an optimal solve to the objective of the point PuLP read back "
    "from CBC's solution file (about 10 significant digits), which on the seconds-scale A100 preset is above the exact "
    "optimum by ~2e-9 relative")


#: the formulations every test runs on ("auto" picks one of them)
FORMS = ("bigm", "network")


def fixed_params():
    out = []
    for name, instance, objective, no_evict in FIXED:
        for backend in BACKENDS:
            for form in FORMS:
                marks = [CBC_ROUNDED_BOUND] if (backend, name) == ("cbc", "fig15-total-no-evict") else []
                out.append(pytest.param(backend, form, instance, objective, no_evict, id=f"{backend}-{form}-{name}",
                                        marks=marks))
    return out


def check_optimal(instance, objective, backend, no_evict=False, constraints=None, expected=None, formulation="bigm",
                  **kwargs):
    """Solve and compare with the oracle; returns (result, oracle value)."""
    cons = constraints or Constraints(no_evict=no_evict)
    if expected is None:
        expected = brute_force(instance, objective, allow_evict=not cons.no_evict,
                               max_batch_size=cons.max_batch_size).value
    res = solve(instance, objective, backend, kwargs.pop("time_limit", TIME_LIMIT), constraints=cons,
                formulation=formulation, **kwargs)
    where = (backend, formulation, objective, cons, res.status, res.objective, res.lower_bound, expected, res.stats.get("horizon"))
    assert res.status == "optimal", where
    assert res.bound_certified, where
    assert res.objective_name == objective and res.solver == backend
    assert res.formulation == formulation if formulation != "auto" else res.formulation in FORMULATIONS
    assert res.objective == pytest.approx(expected, rel=REL), where
    assert res.lower_bound <= expected * (1 + BOUND_REL), where
    assert res.lower_bound <= res.objective * (1 + BOUND_REL), where
    assert res.gap is not None and 0 <= res.gap <= REL, where
    assert res.seconds > 0
    check_schedule(instance, res, objective, cons)
    return res, expected


def check_schedule(instance, res, objective, cons):
    """The schedule passes the validator (through its JSON form) with exactly the reported objective."""
    assert res.schedule is not None and res.metrics is not None
    again = Schedule.from_json(res.schedule.to_json())
    metrics = validate(instance, again).metrics
    assert objective_value(metrics, objective) == res.objective
    assert metrics.to_dict() == res.metrics.to_dict()
    assert satisfies(instance, again, Constraints(**{**cons.__dict__, "objective_cap": None}))
    if cons.no_evict:
        assert metrics.evictions == 0 and not any(bt.evict for bt in again.batches)
    if cons.objective_cap is not None:
        assert res.objective <= cons.objective_cap * (1 + 1e-12)


# ------------------------------------------------------------------------------ fixed instances

@pytest.mark.parametrize("backend, formulation, instance, objective, no_evict", fixed_params())
def test_fixed_instances_solve_to_the_brute_force_optimum(backend, formulation, instance, objective, no_evict):
    check_optimal(instance, objective, backend, no_evict, formulation=formulation)


def test_fixed_instances_are_what_they_claim():
    # the list covers what it should: evicting is strictly better on FIG15, IDLE_GAP idles, limits bind
    assert brute_force(FIG15, "total_latency").value < brute_force(FIG15, "total_latency", allow_evict=False).value
    assert brute_force(FIG15, "mean_latency").value < brute_force(FIG15, "mean_latency", allow_evict=False).value
    idle = validate(IDLE_GAP, brute_force(IDLE_GAP, "total_latency").schedule)
    assert (idle.batch_start[1:] > idle.batch_end[:-1] + 1e-9).any()
    assert brute_force(WORKED, "mean_ttft").value < brute_force(WORKED, "mean_ttft", allow_evict=False).value
    assert {i.system.block_size for _, i, _, _ in FIXED} == {1, 2}
    assert any(i.system.max_prefill_tokens < i.system.max_batch_tokens for _, i, _, _ in FIXED)
    assert {o for _, _, o, _ in FIXED} == set(OBJECTIVES)
    assert {n for _, _, _, n in FIXED} == {True, False}


# ------------------------------------------------------------------------------ property tests

@st.composite
def tiny(draw, costs=("round", "all-terms", "unit", "a100", "kv-heavy"), max_requests=3):
    """Instances the oracle checks in well under a second: 2-3 requests, I <= 4, O <= 3."""
    cost = {"round": ROUND, "all-terms": ALL_TERMS, "unit": UNIT, "a100": A100, "kv-heavy": KV_HEAVY}[
        draw(st.sampled_from(costs))]
    k = draw(st.integers(2, max_requests))
    online = draw(st.booleans())
    reqs = []
    for i in range(k):
        a = draw(st.sampled_from([0, 1, 2, 3, 6])) * 0.5 * cost.intercept if online and i > 0 else 0
        reqs.append(Request(draw(st.integers(1, 4)), draw(st.integers(1, 3)), float(a)))
    b = draw(st.sampled_from([1, 2]))
    blocks = [-(-r.peak_kv // b) * b for r in reqs]
    M = draw(st.integers(max(blocks), sum(blocks) + b))
    C = draw(st.integers(1, 8))
    P = draw(st.integers(1, C))
    return Instance(tuple(reqs), SystemConfig(M, C, P, b), cost)


def horizon(instance, objective, cons, formulation="bigm") -> int:
    """The batch horizon `solve` will use (as in kvbound.solvers.api.solve)."""
    cands = heuristic_candidates(instance, FAST_HEURISTICS, cons)
    best = min(cands, key=lambda c: objective_value(c.metrics, objective))
    J = horizon_for(instance, objective, objective_value(best.metrics, objective), allow_evict=not cons.no_evict,
                    evict_batches_implicit=formulation == "network")[0]
    prefix = best.schedule
    if stops_at_first_tokens(objective, cons):
        prefix = Schedule(instance.requests, first_token_prefix(instance, best.schedule.batches))
    return max(J, _batches_needed(prefix, formulation))


def small_enough(instance, objective, cons, limit, formulation="bigm"):
    """Keep the model small so that a proof takes seconds: J x requests <= limit."""
    J = horizon(instance, objective, cons, formulation)
    event(f"J x requests <= {5 * math.ceil(J * len(instance) / 5)}")
    assume(J * len(instance) <= limit)


PROPERTY = dict(deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@settings(max_examples=40, **PROPERTY)
@given(instance=tiny(), objective=st.sampled_from(OBJECTIVES), no_evict=st.booleans(), form=st.sampled_from(FORMS))
def test_highs_matches_the_oracle(instance, objective, no_evict, form):
    small_enough(instance, objective, Constraints(no_evict=no_evict), 24, form)
    check_optimal(instance, objective, "highs", no_evict, formulation=form)


@settings(max_examples=10, **PROPERTY)
@given(instance=tiny(), objective=st.sampled_from(OBJECTIVES), no_evict=st.booleans(), form=st.sampled_from(FORMS))
def test_cpsat_matches_the_oracle(instance, objective, no_evict, form):
    small_enough(instance, objective, Constraints(no_evict=no_evict), 15, form)
    check_optimal(instance, objective, "cpsat", no_evict, formulation=form)


@settings(max_examples=6, **PROPERTY)
@given(instance=tiny(costs=("round", "all-terms", "unit", "kv-heavy")), objective=st.sampled_from(OBJECTIVES),
       no_evict=st.booleans(), form=st.sampled_from(FORMS))
def test_cbc_matches_the_oracle(instance, objective, no_evict, form):
    # A100 left out here: see CBC_ROUNDED_BOUND
    small_enough(instance, objective, Constraints(no_evict=no_evict), 15, form)
    check_optimal(instance, objective, "cbc", no_evict, formulation=form)


# ------------------------------------------------------------------------------ warm starts

@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_warm_start_is_accepted(backend, form):
    res, _ = check_optimal(WORKED, "mean_latency", backend, formulation=form)
    assert res.stats["warm_start"] in set(FAST_HEURISTICS) | {"serial"}
    assert res.stats["warm_start_accepted"] is True


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_warm_start_still_solves(backend, form):
    res, _ = check_optimal(BLOCKS2, "total_latency", backend, warm_start=None, formulation=form)
    assert res.stats["warm_start"] is None
    assert res.stats["warm_start_accepted"] is None


@pytest.mark.parametrize("name", ["vllm", "sarathi", "mcsf"])
def test_warm_start_from_one_named_heuristic(name):
    res, _ = check_optimal(WORKED, "total_latency", "highs", warm_start=[name])
    assert res.stats["warm_start"] in (name, "serial")
    assert res.stats["warm_start_accepted"] is True


def test_cpsat_keeps_a_hint_it_is_forced_to():
    # fixing every variable to the hint leaves CP-SAT exactly one point: it must be feasible there
    sched = run_scheduler(PREFILL_LIMIT, "sarathi").schedule
    value = validate(PREFILL_LIMIT, sched).metrics.total_latency
    J = horizon_for(PREFILL_LIMIT, "total_latency", value)[0]
    form = build_bigm(PREFILL_LIMIT, "total_latency", J, tick=_tick_for(PREFILL_LIMIT, J))
    arrays = form.model.finalize()
    x = form.warm_start(sched)
    out = solve_cpsat(arrays, 20, x, fix_to_hint=True)
    assert out.status == "optimal" and out.warm_start_accepted is True
    assert out.objective / form.objective_scale() == pytest.approx(value, rel=1e-9)


def test_highs_keeps_the_warm_start_when_stopped_at_once():
    # with (almost) no time HiGHS can only return the start it was given: the incumbent is the warm start
    sched = run_scheduler(PREFILL_LIMIT, "sarathi").schedule
    value = validate(PREFILL_LIMIT, sched).metrics.mean_latency
    J = horizon_for(PREFILL_LIMIT, "mean_latency", value)[0]
    form = build_bigm(PREFILL_LIMIT, "mean_latency", J)
    arrays = form.model.finalize()
    out = solve_highs(arrays, 0.01, form.warm_start(sched))
    assert out.x is not None and out.warm_start_accepted is True
    assert out.objective <= value * (1 + 1e-9)
    assert validate(PREFILL_LIMIT, form.extract(out.x)).metrics.mean_latency <= value * (1 + 1e-9)


# ------------------------------------------------------------------------------ time limits and horizons

@pytest.mark.parametrize("form", ["auto", "bigm"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_time_limit_returns_in_time_with_a_valid_schedule(backend, form):
    # 4 requests, I = 16, O = 4, M = 32, A100 preset (cases/example.toml): not solvable in 0.5 s
    instance = load_case(REPO / "cases" / "example.toml")
    t0 = time.perf_counter()
    res = solve(instance, "total_latency", backend, 0.5, formulation=form)
    wall = time.perf_counter() - t0
    assert wall <= 0.5 + 6.0, wall
    assert res.status in ("optimal", "feasible")
    assert res.objective is not None and res.schedule is not None
    replay = validate(instance, Schedule.from_json(res.schedule.to_json()))
    assert replay.metrics.total_latency == res.objective
    assert res.lower_bound <= res.objective * (1 + BOUND_REL)
    assert res.gap is not None and res.gap >= 0
    assert res.bound_certified


@pytest.mark.parametrize("form", FORMS)
def test_short_horizon_gives_a_conditional_bound(form):
    objective = "mean_latency"
    J = horizon(WORKED, objective, Constraints(), form)
    assert J >= 3
    res = solve(WORKED, objective, "highs", TIME_LIMIT, horizon=2, formulation=form)
    assert res.bound_certified is False
    assert res.status == "feasible"  # never "optimal" without a certified bound
    assert "horizon J = " in res.stats["horizon_reason"]
    opt = brute_force(WORKED, objective).value
    # the reported lower bound is still a valid one (the analytic bound); the model's is only conditional
    assert res.lower_bound <= opt * (1 + BOUND_REL)
    assert res.lower_bound == res.stats["analytic_bound"]
    assert res.stats["conditional_bound"] is not None
    assert res.objective >= opt * (1 - REL)
    check_schedule(WORKED, res, objective, Constraints())
    # at (or above) the certified horizon the bound is certified again
    full = solve(WORKED, objective, "highs", TIME_LIMIT, horizon=J, formulation=form)
    assert full.bound_certified and full.status == "optimal"
    assert full.objective == pytest.approx(opt, rel=REL)


# ------------------------------------------------------------------------------ hypothesis constraints

@st.composite
def constraint_sets(draw, n: int):
    flags = {}
    for name in ("no_evict", "no_chunk", "no_hybrid"):
        if draw(st.booleans()):
            flags[name] = True
    if draw(st.booleans()):
        flags["max_batch_size"] = draw(st.integers(1, n))
    if draw(st.booleans()):
        flags["admission_order"] = tuple(draw(st.permutations(range(n))))
    return Constraints(**flags)


@settings(max_examples=30, **PROPERTY)
@given(instance=tiny(costs=("round", "all-terms", "unit")), objective=st.sampled_from(OBJECTIVES), data=st.data())
def test_constraints_hold_in_the_optimal_schedule(instance, objective, data):
    cons = data.draw(constraint_sets(len(instance)))
    P = min(instance.system.max_prefill_tokens, instance.system.max_batch_tokens)
    if cons.no_chunk:  # an unchunked prompt longer than P can never be served
        assume(max(r.prompt for r in instance.requests) <= P)
    form = "bigm" if cons.admission_order is not None else data.draw(st.sampled_from(FORMS), label="formulation")
    small_enough(instance, objective, cons, 20, form)
    res = solve(instance, objective, "highs", TIME_LIMIT, constraints=cons, formulation=form)
    assert res.status == "optimal" and res.bound_certified, (cons, res.status)
    check_schedule(instance, res, objective, cons)
    # never better than the unconstrained optimum; equal to it when an optimal schedule meets the constraints
    free = brute_force(instance, objective, allow_evict=not cons.no_evict, max_batch_size=cons.max_batch_size)
    assert res.objective >= free.value * (1 - REL)
    assert res.lower_bound <= res.objective * (1 + BOUND_REL)
    if satisfies(instance, free.schedule, cons):
        assert res.objective == pytest.approx(free.value, rel=REL)
    if cons == Constraints(no_evict=cons.no_evict, max_batch_size=cons.max_batch_size):
        # the oracle handles exactly these two: the optimum must match it
        assert res.objective == pytest.approx(free.value, rel=REL)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", ["highs", "cpsat"])
def test_max_batch_size_matches_the_oracle(backend, form):
    cons = Constraints(max_batch_size=1)
    check_optimal(WORKED, "mean_latency", backend, constraints=cons, formulation=form)


def test_admission_order_is_followed():
    # one request per batch: admitting the long request first costs mean latency
    instance = inst([(4, 3), (1, 1)], M=6, C=8)
    values = {}
    for order in ((0, 1), (1, 0)):
        cons = Constraints(admission_order=order, max_batch_size=1)
        res = solve(instance, "mean_latency", "highs", TIME_LIMIT, constraints=cons)
        assert res.status == "optimal"
        check_schedule(instance, res, "mean_latency", cons)
        first = {}
        for j, bt in enumerate(res.schedule.batches):
            for i in bt.tokens:
                first.setdefault(i, j)
        assert first[order[0]] < first[order[1]]
        values[order] = res.objective
    assert values[(0, 1)] > values[(1, 0)] * (1 + 1e-3)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_objective_cap_below_the_optimum_is_infeasible(backend, form):
    objective = "total_latency"
    opt = brute_force(FIG15, objective).value
    res = solve(FIG15, objective, backend, TIME_LIMIT, constraints=Constraints(objective_cap=opt * 0.97),
                formulation=form)
    assert res.status == "infeasible"
    assert res.bound_certified is True
    assert res.objective is None and res.schedule is None
    assert res.lower_bound > opt * 0.97


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", ["highs", "cpsat"])
def test_objective_cap_above_the_optimum_keeps_the_optimum(backend, form):
    objective = "mean_latency"
    opt = brute_force(WORKED, objective).value
    cons = Constraints(objective_cap=opt * 1.001)
    res, _ = check_optimal(WORKED, objective, backend, constraints=cons, expected=opt, formulation=form)
    assert res.objective <= opt * 1.001


def test_objective_cap_at_the_optimum_is_feasible():
    objective = "total_latency"
    opt = brute_force(WORKED, objective).value
    check_optimal(WORKED, objective, "highs", constraints=Constraints(objective_cap=opt), expected=opt)


def test_unsatisfiable_constraints_are_an_error_not_a_crash():
    # no chunking with a prompt longer than P: no heuristic schedule, no horizon to certify
    instance = inst([(4, 2), (1, 1)], M=6, C=4, P=2)
    with pytest.raises(KvboundError, match="horizon"):
        solve(instance, "total_latency", "highs", 5, constraints=Constraints(no_chunk=True))


def test_bad_arguments():
    with pytest.raises(KvboundError, match="solver"):
        solve(WORKED, "total_latency", "gurobi", 5)
    with pytest.raises(KvboundError, match="objective"):
        solve(WORKED, "p99_latency", "highs", 5)
    with pytest.raises(KvboundError, match="formulation"):
        solve(WORKED, "total_latency", "highs", 5, formulation="nonsense")


# ------------------------------------------------------------------------------ known bugs

@pytest.mark.xfail(strict=True, reason="bug: the CP-SAT model rounds an arrival like 3 * 0.1 = 0.30000000000000004 up "
                   "to a whole tick (bigm up_time uses math.ceil without the tolerance _tick_for accepted), so its "
                   "bound loses 1/tick per arrival and the status is 'feasible' instead of 'optimal'")
def test_cpsat_arrival_that_is_a_tick_multiple_only_up_to_rounding():
    instance = Instance((Request(1, 1), Request(1, 1), Request(1, 1, 3 * 0.1)), SystemConfig(1, 1),
                        CostModel(intercept=0.2, per_token=0.3, decode_kv=0.5, prefill_kv=0.4))
    check_optimal(instance, "mean_latency", "cpsat")
