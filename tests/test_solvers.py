"""`kvbound.solvers.solve` against the brute-force oracle, on every backend and formulation.

On instances the oracle can check (2-3 requests, prompts <= 4, outputs <= 3) every backend
must return status "optimal" with exactly the brute-force optimum, a certified lower bound
that is not above it, and a schedule the validator accepts with exactly the reported
objective. Then: warm starts, time limits, horizons, and the hypothesis constraints.

The Big-M model is slow with evictions allowed (its horizon doubles for evict-only batches),
so the instances here are kept to a few seconds per solve; the property tests skip models
larger than a few dozen request-batches.
"""
from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kvbound import CostModel, Instance, Request, SystemConfig, load_case, validate
from kvbound.costs import PRESETS
from kvbound.errors import KvboundError
from kvbound.formulation import FORMULATION_KINDS
from kvbound.backends import BACKENDS
from kvbound.backends.cpsat import solve_cpsat
from kvbound.backends.highs import solve_highs
from kvbound.constraints import Constraints
from kvbound.deadline import Deadline
from kvbound.formulation.bigm import build_bigm
from kvbound.formulation.horizon import horizon_for
from kvbound.formulation.network import build_network
from kvbound.formulation.units import tick_for
from kvbound.io.schedules import schedule_from_json
from kvbound.bounds.base import OPTIMAL_TOL
from kvbound.objective import Objective
from kvbound.schedulers import FAST_HEURISTICS, run_scheduler
from kvbound.solvers import SolveOptions, solve
from kvbound.solvers.options import FORMULATIONS
from kvbound.solvers.phases.heuristics import heuristic_candidates
from kvbound.solvers.route import route
from tests.conftest import REPO
from tests.oracle import brute_force

REL = 1e-6  # the optimum must be matched to this
BOUND_REL = 1e-9  # a lower bound may exceed the optimum by this much (rounding), no more
TIME_LIMIT = 60.0  # never reached on these instances; a solve that needs it fails the test (not optimal)
FORMS = ("bigm", "network", "chain")  # "auto" picks one of them
STATE_NETWORKS = ("network", "chain")

ROUND = CostModel(intercept=1.0, per_token=0.1, decode_kv=0.01, prefill_attention=0.001)
ALL_TERMS = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125, prefill_attention=0.0625, prefill_kv=0.5,
                      per_prefill_request=0.75)
A100 = PRESETS["llama2-7b-a100"]
UNIT = PRESETS["unit-batches"]
KV_HEAVY = CostModel(intercept=0.5, per_token=0.1, decode_kv=0.25, prefill_kv=0.2)  # evict-only batches can pay


def inst(requests, M, C, P=None, b=1, cost=ROUND) -> Instance:
    return Instance(tuple(Request(*r) for r in requests), SystemConfig(M, C, P, b), cost)


WORKED = inst([(3, 3), (2, 2), (2, 1, 1.5)], M=6, C=4)  # docs/semantics.md section 13, arrival moved to 1.5
FIG15 = inst([(2, 3), (2, 3)], M=4, C=64, cost=A100)  # Figure 15 family at I = 2, O = 3
FIG15_O2 = inst([(2, 2), (2, 2)], M=4, C=64, cost=A100)  # the same with O = 2: evicting pays
UNIT_PAIR = inst([(2, 2), (2, 2)], M=4, C=4, cost=UNIT)  # evicting saves a batch
BLOCKS2 = inst([(3, 2), (2, 2)], M=6, C=4, P=2, b=2)
PREFILL_LIMIT = inst([(4, 1), (1, 3)], M=6, C=5, P=3, cost=ALL_TERMS)
IDLE_GAP = inst([(2, 2), (2, 1, 4.0)], M=4, C=3)  # the second request arrives after the first finishes
LATE = inst([(3, 2), (2, 2, 1.0)], M=5, C=4)  # the second request arrives during the first

#: (id, instance, objective, no_evict): every objective with and without evictions, offline and online,
#: block sizes 1 and 2, P < C, all six cost terms, the A100 preset
FIXED = [
    ("fig15-total", FIG15_O2, Objective.TOTAL_LATENCY, False),
    ("fig15-total-no-evict", FIG15_O2, Objective.TOTAL_LATENCY, True),
    ("idle-gap-total", IDLE_GAP, Objective.TOTAL_LATENCY, False),
    ("prefill-limit-total-no-evict", PREFILL_LIMIT, Objective.TOTAL_LATENCY, True),
    ("unit-mean", UNIT_PAIR, Objective.MEAN_LATENCY, False),
    ("unit-mean-no-evict", UNIT_PAIR, Objective.MEAN_LATENCY, True),
    ("late-ttft", LATE, Objective.MEAN_TTFT, False),
    ("blocks2-ttft-no-evict", BLOCKS2, Objective.MEAN_TTFT, True),
]


def check_optimal(instance, objective, backend, no_evict=False, constraints=None, expected=None, formulation="bigm",
                  **kwargs):
    """Solve and compare with the oracle; returns (result, oracle value)."""
    cons = constraints or Constraints(no_evict=no_evict)
    if expected is None:
        expected = brute_force(instance, objective, allow_evict=not cons.no_evict,
                               max_batch_size=cons.max_batch_size).value
    # skip_proven=False: the backend runs even where a heuristic schedule already meets the analytic bound
    res = solve(instance, objective, backend, kwargs.pop("time_limit", TIME_LIMIT), constraints=cons,
                formulation=formulation, skip_proven=False, **kwargs)
    where = (backend, formulation, objective, cons, res.status, res.objective, res.lower_bound, expected,
             res.stats.get("horizon"))
    assert res.status == "optimal", where
    assert res.bound_certified, where
    assert res.objective_name == objective and res.solver == backend
    assert res.formulation == formulation if formulation != "auto" else res.formulation in FORMULATIONS
    assert res.objective == pytest.approx(expected, rel=REL), where
    assert res.lower_bound <= expected * (1 + BOUND_REL), where
    assert res.lower_bound <= res.objective * (1 + BOUND_REL), where
    assert res.gap is not None and 0 <= res.gap <= OPTIMAL_TOL, where  # the share within which it counts as optimal
    assert res.seconds > 0
    check_schedule(instance, res, objective, cons)
    return res, expected


def check_schedule(instance, res, objective, cons):
    """The schedule passes the validator (through its JSON form) with exactly the reported objective,
    and meets the constraints."""
    assert res.schedule is not None and res.metrics is not None
    again = schedule_from_json(res.schedule.to_json())
    metrics = validate(instance, again).metrics
    assert Objective(objective).of(metrics) == res.objective
    assert metrics.to_dict() == res.metrics.to_dict()
    assert cons.admit(instance, again), cons
    if cons.no_evict:
        assert metrics.evictions == 0 and not any(bt.evict for bt in again.batches)
    if cons.objective_cap is not None:
        assert res.objective <= cons.objective_cap * (1 + 1e-12)


# ------------------------------------------------------------------------------ fixed instances

def fixed_params():
    return [pytest.param(backend, form, instance, objective, no_evict, id=f"{backend}-{form}-{name}")
            for name, instance, objective, no_evict in FIXED for backend in BACKENDS for form in FORMS]


@pytest.mark.parametrize("backend, formulation, instance, objective, no_evict", fixed_params())
def test_fixed_instances_solve_to_the_brute_force_optimum(backend, formulation, instance, objective, no_evict):
    check_optimal(instance, objective, backend, no_evict, formulation=formulation)


def test_fixed_instances_are_what_they_claim():
    # the list covers what it should: evicting is strictly better where claimed, IDLE_GAP idles, limits bind
    for instance, objective in ((FIG15_O2, Objective.TOTAL_LATENCY), (UNIT_PAIR, Objective.MEAN_LATENCY), (LATE, Objective.MEAN_TTFT),
                                (FIG15, Objective.TOTAL_LATENCY)):
        assert brute_force(instance, objective).value < brute_force(instance, objective, allow_evict=False).value
    idle = validate(IDLE_GAP, brute_force(IDLE_GAP, Objective.TOTAL_LATENCY).schedule)
    assert (idle.batch_start[1:] > idle.batch_end[:-1] + 1e-9).any()
    assert {i.system.block_size for _, i, _, _ in FIXED} == {1, 2}
    assert any(i.system.max_prefill_tokens < i.system.max_batch_tokens for _, i, _, _ in FIXED)
    assert {(o, n) for _, _, o, n in FIXED} == {(o, n) for o in Objective for n in (True, False)}
    assert {i.offline for _, i, _, _ in FIXED} == {True, False}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_three_requests(backend, form):
    # docs/semantics.md section 13 (arrival at 1.5); its optimal makespan needs no eviction, so the Big-M
    # model (slow with evictions at this size) runs without them
    _, opt = check_optimal(WORKED, Objective.TOTAL_LATENCY, backend, no_evict=form == "bigm", formulation=form)
    assert opt == brute_force(WORKED, Objective.TOTAL_LATENCY).value


# ------------------------------------------------------------------------------ property tests

@st.composite
def tiny(draw, costs=("round", "all-terms", "unit", "a100", "kv-heavy")):
    """Instances the oracle checks in well under a second: 2-3 requests, I <= 4, O <= 3."""
    cost = {"round": ROUND, "all-terms": ALL_TERMS, "unit": UNIT, "a100": A100, "kv-heavy": KV_HEAVY}[
        draw(st.sampled_from(costs))]
    k = draw(st.integers(2, 3))
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
    """The batch horizon `solve` will use: its route once its heuristics have run."""
    options = SolveOptions(objective, formulation=formulation, constraints=cons)
    best = min(heuristic_candidates(instance, options), key=lambda c: c.value)
    return route(instance, options, BACKENDS, best.schedule, best.value).J


def small_enough(instance, objective, cons, formulation, limit):
    """Keep the model small so that a proof takes seconds: J x requests <= limit for Big-M, and
    J <= 2 x limit for the state-network models, J <= limit with a mean objective, whose Big-M
    product of batch time and unfinished count keeps the relaxation weak (three requests with J = 20
    to 26 took 10-35 s here, more than 60 s on CI: see test_hard_mean_latency_instances_keep_valid_bounds)."""
    J = horizon(instance, objective, cons, formulation)
    if formulation in STATE_NETWORKS:
        event(f"{formulation}: J <= {4 * math.ceil(J / 4)}")
        assume(J <= (2 * limit if objective == Objective.TOTAL_LATENCY else limit))
        return
    event(f"bigm: J x requests <= {4 * math.ceil(J * len(instance) / 4)}")
    assume(J * len(instance) <= limit)


PROPERTY = dict(deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@settings(max_examples=80, **PROPERTY)
@given(instance=tiny(), objective=st.sampled_from(list(Objective)), no_evict=st.booleans(), form=st.sampled_from(FORMS))
def test_highs_matches_the_oracle(instance, objective, no_evict, form):
    assume(form in STATE_NETWORKS or instance.cost != A100)  # see test_highs_bigm_optimum_on_the_a100_preset
    small_enough(instance, objective, Constraints(no_evict=no_evict), form, 16)
    check_optimal(instance, objective, "highs", no_evict, formulation=form)


#: found by the property above in a CI run: HiGHS proved the network model "optimal" at a schedule 1.4e-7
#: (relative) worse than the oracle's, its dual bound equal to that schedule's value: above the optimum,
#: within HiGHS's own tolerances (attention coefficients of ~5e-7 a model unit). Its bounds are lowered by
#: backends.highs.BOUND_MARGIN
TOLERANCE_CASE = Instance((Request(4, 1, 0.0), Request(4, 1, 0.0), Request(1, 1, 0.0)), SystemConfig(5, 3, 3, 1),
                          CostModel(intercept=0.00371976, per_token=6.52783e-05, decode_kv=3.7449142857142855e-07,
                                    prefill_attention=1.6804102564102565e-09))


def test_a_highs_bound_never_passes_the_optimum_through_its_tolerances():
    check_optimal(TOLERANCE_CASE, Objective.MEAN_LATENCY, "highs", formulation="network")


#: found by test_solves_with_a_batch_budget_far_above_the_requests_match_the_oracle in a fresh-clone CI run:
#: HiGHS's dual bound on the network model came back 7e-7 (relative) below the optimum, 0.7 s, and with
#: BOUND_MARGIN 1.2e-6 below: a solve at the optimum was "feasible, gap 0.00%" while a schedule counted as
#: optimal within 1e-6 (now bounds.base.OPTIMAL_TOL, 2e-6)
MARGIN_CASE = Instance((Request(1, 1), Request(1, 1)), SystemConfig(2, 64, 8, 1),
                       CostModel(intercept=0.5, per_token=0.1, decode_kv=0.25, prefill_kv=0.2))


def test_a_highs_bound_lowered_by_its_margin_still_proves_the_optimum():
    check_optimal(MARGIN_CASE, Objective.MEAN_LATENCY, "highs", formulation="network")


#: found by a hostile probe (issue 34): C = 4,096 beside prompts of 3 and 4 tokens made the models' Big-M
#: constants ~842,000 (the largest batch time at C tokens), and HiGHS's tolerance let a point 0.23 s below
#: the schedule it describes through: "optimal" 6.46 against the true 6.575 (the model's horizon 5)
LARGE_C = inst([(3, 2), (4, 3)], M=7, C=4096, P=465,
               cost=CostModel(intercept=1, per_token=0.2, decode_kv=0.01, prefill_attention=0.05, prefill_kv=0.02,
                              per_prefill_request=0.5))


def test_a_large_batch_budget_beside_small_requests_is_still_proven_optimal():
    check_optimal(LARGE_C, Objective.MEAN_LATENCY, "highs", formulation="auto")


@settings(max_examples=25, **PROPERTY)
@given(instance=tiny(costs=("round", "all-terms", "a100", "kv-heavy")), objective=st.sampled_from(list(Objective)),
       C=st.sampled_from([64, 512, 4096]), form=st.sampled_from(STATE_NETWORKS))
def test_solves_with_a_batch_budget_far_above_the_requests_match_the_oracle(instance, objective, C, form):
    # the models' constants scale with what the requests can process, not with C
    s = instance.system
    wide = Instance(instance.requests, SystemConfig(s.kv_capacity, C, min(C, 8 * s.max_prefill_tokens), s.block_size),
                    instance.cost)
    small_enough(wide, objective, Constraints(), form, 16)
    check_optimal(wide, objective, "highs", False, formulation=form)


@settings(max_examples=20, **PROPERTY)
@given(instance=tiny(), objective=st.sampled_from(list(Objective)), no_evict=st.booleans(), form=st.sampled_from(FORMS))
def test_cpsat_matches_the_oracle(instance, objective, no_evict, form):
    small_enough(instance, objective, Constraints(no_evict=no_evict), form, 10)
    check_optimal(instance, objective, "cpsat", no_evict, formulation=form)


@settings(max_examples=15, **PROPERTY)
@given(instance=tiny(costs=("round", "all-terms", "unit", "kv-heavy")), objective=st.sampled_from(list(Objective)),
       no_evict=st.booleans(), form=st.sampled_from(FORMS))
def test_cbc_matches_the_oracle(instance, objective, no_evict, form):
    # A100 left out here: see test_cbc_bound_is_not_above_the_optimum_on_the_a100_preset
    small_enough(instance, objective, Constraints(no_evict=no_evict), form, 10)
    check_optimal(instance, objective, "cbc", no_evict, formulation=form)


#: found by CI's hypothesis runs: three requests, mean_latency with evictions, proofs of 10-35 s here
HARD_MEAN = [
    ("kv-heavy-online", inst([(4, 3), (4, 1, 1.5), (3, 1, 1.5)], M=6, C=2, P=2, cost=KV_HEAVY), "chain"),
    ("all-terms", inst([(4, 3), (3, 3), (2, 3)], M=8, C=4, P=3, cost=ALL_TERMS), "network"),
]


@pytest.mark.parametrize("name, instance, form", HARD_MEAN, ids=[h[0] for h in HARD_MEAN])
def test_hard_mean_latency_instances_keep_valid_bounds(name, instance, form):
    # a short limit stops the proof; whatever is reported must still bracket the oracle's optimum
    opt = brute_force(instance, Objective.MEAN_LATENCY).value
    res = solve(instance, Objective.MEAN_LATENCY, "highs", 3.0, formulation=form)
    assert res.status in ("optimal", "feasible") and res.bound_certified
    assert res.lower_bound <= opt * (1 + BOUND_REL) and res.objective >= opt * (1 - REL)
    check_schedule(instance, res, Objective.MEAN_LATENCY, Constraints())


# ------------------------------------------------------------------------------ warm starts

@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_warm_start_is_accepted(backend, form):
    res, _ = check_optimal(UNIT_PAIR, Objective.MEAN_LATENCY, backend, formulation=form)
    assert res.stats["warm_start"] in set(FAST_HEURISTICS) | {"serial"}
    assert res.stats["warm_start_accepted"] is True


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_warm_start_still_solves(backend, form):
    res, _ = check_optimal(IDLE_GAP, Objective.TOTAL_LATENCY, backend, warm_start=None, formulation=form)
    assert res.stats["warm_start"] is None
    assert res.stats["warm_start_accepted"] is None


@pytest.mark.parametrize("name", ["vllm", "sarathi", "mcsf"])
def test_warm_start_from_one_named_heuristic(name):
    res, _ = check_optimal(IDLE_GAP, Objective.TOTAL_LATENCY, "highs", warm_start=[name])
    assert res.stats["warm_start"] in (name, "serial")
    assert res.stats["warm_start_accepted"] is True


def test_a_solve_whose_bounds_took_the_time_still_makes_one_schedule_and_no_more():
    # 1,000 requests at a 1-s limit: the analytic bounds took 1.05 s and no schedule came back; the first
    # heuristic now runs within half of what the promise allows past the limit, the others do not
    from kvbound.solvers.ledger import Ledger
    from kvbound.solvers.phases.heuristics import Heuristics

    deadline = Deadline(0.01)
    ledger = Ledger(IDLE_GAP, SolveOptions(Objective.MEAN_LATENCY), deadline)
    time.sleep(0.02)
    assert deadline.expired()
    Heuristics().run(ledger)
    assert [seed.name for seed in ledger.seeds] == [FAST_HEURISTICS[0]]
    validate(IDLE_GAP, ledger.seeds[0].schedule)
    assert deadline.with_grace().at == pytest.approx(deadline.at + 1.0)  # half of max(2 s, 10%)


def test_cpsat_keeps_a_hint_it_is_forced_to():
    # fixing every variable to the hint leaves CP-SAT exactly one point: it must be feasible there
    sched = run_scheduler(PREFILL_LIMIT, "sarathi").schedule
    value = validate(PREFILL_LIMIT, sched).metrics.total_latency
    J = horizon_for(PREFILL_LIMIT, Objective.TOTAL_LATENCY, value)[0]
    form = build_bigm(PREFILL_LIMIT, Objective.TOTAL_LATENCY, J, tick=tick_for(PREFILL_LIMIT, J))
    out = solve_cpsat(form.model.finalize(), Deadline(20), form.warm_start(sched), fix_to_hint=True)
    assert out.status == "optimal" and out.warm_start_accepted is True
    assert out.objective / form.objective_scale() == pytest.approx(value, rel=1e-9)


#: CP-SAT 9.15 with two workers and this hint certified 2.75 as optimal in 3 of 40 runs (the
#: optimum is 2.70): its presolve lost the optimum (google/or-tools#5293). Found by CI's hypothesis.
PRESOLVE_LOSES_OPTIMUM = Instance((Request(2, 2), Request(3, 2, 0.25)), SystemConfig(8, 7, 6, 1),
                                  CostModel(intercept=0.5, per_token=0.1, decode_kv=0.25, prefill_kv=0.2))


def test_cpsat_presolve_does_not_lose_the_optimum():
    # 30 runs: with the default presolve, at least one of them went wrong in each of 6 tries on an
    # idle 2-core machine (a race between CP-SAT's workers: a loaded machine shows it less often)
    instance, objective = PRESOLVE_LOSES_OPTIMUM, Objective.TOTAL_LATENCY
    opt = brute_force(instance, objective).value
    hint = run_scheduler(instance, "sarathi-pc")  # the hint (3.45 s) of the runs that went wrong
    J = horizon_for(instance, objective, hint.replay.metrics.total_latency, evict_batches_implicit=True)[0]
    form = build_network(instance, objective, J, tick=tick_for(instance, J))
    arrays, warm = form.model.finalize(), form.warm_start(hint.schedule)
    claimed = [solve_cpsat(arrays, Deadline(60), warm, workers=2) for _ in range(30)]
    assert {out.status for out in claimed} == {"optimal"}
    assert [out.bound / form.objective_scale() for out in claimed] == pytest.approx([opt] * len(claimed), rel=1e-9)


#: found by CI's hypothesis: with the two workers of a 2-core machine CP-SAT found the optimum
#: at once but its bound stayed 10% below it for the whole 60 s (every formulation); its
#: 8-worker portfolio (max_lp) proves it at the root
NEEDS_LP_WORKERS = Instance(
    (Request(1, 3), Request(1, 1, 0.00557964), Request(1, 1, 0.00557964)), SystemConfig(5, 3, 2, 1),
    CostModel(intercept=0.00371976, per_token=6.52783e-05, decode_kv=3.7449142857142855e-07,
              prefill_attention=1.6804102564102565e-09))


@pytest.mark.parametrize("form", FORMS)
def test_cpsat_runs_its_lp_workers_on_few_cores(form):
    check_optimal(NEEDS_LP_WORKERS, Objective.MEAN_LATENCY, "cpsat", formulation=form, time_limit=20)


def test_cpsat_that_overruns_its_limit_is_killed():
    # no grace and a 1 ms limit: CP-SAT cannot answer within 1.1 ms of starting, so it is killed
    instance = load_case(REPO / "cases" / "example.toml")
    sched = run_scheduler(instance, "sarathi").schedule
    J = horizon_for(instance, Objective.TOTAL_LATENCY, validate(instance, sched).metrics.total_latency)[0]
    form = build_bigm(instance, Objective.TOTAL_LATENCY, J, tick=tick_for(instance, J))
    out = solve_cpsat(form.model.finalize(), Deadline(0.001), form.warm_start(sched), grace=0.0)
    assert out.status == "unknown" and out.x is None and out.bound == -math.inf
    assert out.stats["model_status"] == "KILLED" and "did not return" in out.stats["killed"]


def test_highs_keeps_the_warm_start_when_stopped_at_once():
    # with (almost) no time HiGHS can only return the start it was given (or better)
    sched = run_scheduler(PREFILL_LIMIT, "sarathi").schedule
    value = validate(PREFILL_LIMIT, sched).metrics.mean_latency
    J = horizon_for(PREFILL_LIMIT, Objective.MEAN_LATENCY, value)[0]
    form = build_bigm(PREFILL_LIMIT, Objective.MEAN_LATENCY, J)
    out = solve_highs(form.model.finalize(), Deadline(0.01), form.warm_start(sched))
    assert out.x is not None and out.warm_start_accepted is True
    assert out.objective / form.objective_scale() <= value * (1 + 1e-9)
    assert validate(PREFILL_LIMIT, form.extract(out.x)).metrics.mean_latency <= value * (1 + 1e-9)


# ------------------------------------------------------------------------------ time limits and horizons

@pytest.mark.parametrize("backend, form", [(b, "auto") for b in BACKENDS] + [("highs", "bigm")])
def test_tiny_time_limit_returns_in_time_with_a_valid_schedule(backend, form):
    # 4 requests, I = 16, O = 4, M = 32, A100 preset (cases/example.toml): not solvable in 0.5 s
    instance = load_case(REPO / "cases" / "example.toml")
    t0 = time.perf_counter()
    res = solve(instance, Objective.TOTAL_LATENCY, backend, 0.5, formulation=form)
    wall = time.perf_counter() - t0
    assert wall <= 0.5 + 6.0, wall
    assert res.status in ("optimal", "feasible")
    assert res.objective is not None and res.schedule is not None
    replay = validate(instance, schedule_from_json(res.schedule.to_json()))
    assert replay.metrics.total_latency == res.objective
    assert res.lower_bound <= res.objective * (1 + BOUND_REL)
    assert res.gap is not None and res.gap >= 0
    assert res.bound_certified


@pytest.mark.parametrize("form", FORMS)
def test_short_horizon_gives_a_conditional_bound(form):
    objective = Objective.MEAN_LATENCY
    J = horizon(FIG15_O2, objective, Constraints(), form)
    assert J >= 3
    res = solve(FIG15_O2, objective, "highs", 3.0, horizon=2, formulation=form)
    assert res.bound_certified is False
    assert res.status == "feasible"  # never "optimal" without a certified bound
    assert "horizon J = " in res.stats["horizon_reason"]
    opt = brute_force(FIG15_O2, objective).value
    # the reported lower bound is still a valid one (analytic, or the search's after the model: not
    # proven, the solve goes on until its limit); the model's is only conditional
    assert res.stats["analytic_bound"] <= res.lower_bound <= opt * (1 + BOUND_REL)
    assert res.stats["conditional_bound"] is not None
    assert res.seconds >= 2.5 and res.stats["search"].startswith("after the model")
    assert res.objective >= opt * (1 - REL)
    check_schedule(FIG15_O2, res, objective, Constraints())
    # at (or above) the certified horizon the bound is certified again
    full = solve(FIG15_O2, objective, "highs", TIME_LIMIT, horizon=J, formulation=form)
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
    if draw(st.integers(0, 3)) == 0:
        flags["admission_order"] = tuple(draw(st.permutations(range(n))))
    return Constraints(**flags)


@settings(max_examples=50, **PROPERTY)
@given(instance=tiny(costs=("round", "all-terms", "unit")), objective=st.sampled_from(list(Objective)), data=st.data())
def test_constraints_hold_in_the_optimal_schedule(instance, objective, data):
    cons = data.draw(constraint_sets(len(instance)), label="constraints")
    if objective == Objective.MEAN_TTFT and not cons.no_evict:
        cons = Constraints(**{**cons.__dict__, "no_evict": True})  # see test_mean_ttft_completion_meets_the_constraints
    P = min(instance.system.max_prefill_tokens, instance.system.max_batch_tokens)
    if cons.no_chunk:  # an unchunked prompt longer than P can never be served
        assume(max(r.prompt for r in instance.requests) <= P)
    # the state-network models cannot fix an admission order
    form = "bigm" if cons.admission_order is not None else data.draw(st.sampled_from(FORMS), label="formulation")
    small_enough(instance, objective, cons, form, 10)
    res = solve(instance, objective, "highs", TIME_LIMIT, constraints=cons, formulation=form)
    assert res.status == "optimal" and res.bound_certified, (cons, res.status)
    check_schedule(instance, res, objective, cons)
    # never better than the unconstrained optimum; equal to it when an optimal schedule meets the constraints
    free = brute_force(instance, objective, allow_evict=not cons.no_evict, max_batch_size=cons.max_batch_size)
    assert res.objective >= free.value * (1 - REL)
    assert res.lower_bound <= res.objective * (1 + BOUND_REL)
    if cons.admit(instance, free.schedule):
        assert res.objective == pytest.approx(free.value, rel=REL)
    if cons == Constraints(no_evict=cons.no_evict, max_batch_size=cons.max_batch_size):
        # the oracle handles exactly these two: the optimum must match it
        assert res.objective == pytest.approx(free.value, rel=REL)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", ["highs", "cpsat"])
def test_max_batch_size_matches_the_oracle(backend, form):
    check_optimal(UNIT_PAIR, Objective.MEAN_LATENCY, backend, constraints=Constraints(max_batch_size=1), formulation=form)


def test_admission_order_is_followed():
    # one request per batch: admitting the long request first costs mean latency
    instance = inst([(3, 2), (1, 1)], M=4, C=8)
    values = {}
    for order in ((0, 1), (1, 0)):
        cons = Constraints(admission_order=order, max_batch_size=1)
        res = solve(instance, Objective.MEAN_LATENCY, "highs", TIME_LIMIT, constraints=cons)
        assert res.status == "optimal"
        check_schedule(instance, res, Objective.MEAN_LATENCY, cons)
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
    objective = Objective.TOTAL_LATENCY
    opt = brute_force(FIG15_O2, objective).value
    res = solve(FIG15_O2, objective, backend, TIME_LIMIT, constraints=Constraints(objective_cap=opt * 0.97),
                formulation=form)
    assert res.status == "infeasible"
    assert res.bound_certified is True
    assert res.objective is None and res.schedule is None
    assert res.lower_bound > opt * 0.97


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", ["highs", "cpsat"])
def test_objective_cap_above_the_optimum_keeps_the_optimum(backend, form):
    objective = Objective.MEAN_LATENCY
    opt = brute_force(UNIT_PAIR, objective).value
    cons = Constraints(objective_cap=opt * 1.001)
    res, _ = check_optimal(UNIT_PAIR, objective, backend, constraints=cons, expected=opt, formulation=form)
    assert res.objective <= opt * 1.001


def test_objective_cap_at_the_optimum_is_feasible():
    objective = Objective.TOTAL_LATENCY
    opt = brute_force(IDLE_GAP, objective).value
    check_optimal(IDLE_GAP, objective, "highs", constraints=Constraints(objective_cap=opt), expected=opt)


def test_unsatisfiable_constraints_are_proven_infeasible_with_their_cause():
    # no chunking with a prompt longer than P: no schedule at all, and the case alone says why
    instance = inst([(4, 2), (1, 1)], M=6, C=4, P=2)
    res = solve(instance, Objective.TOTAL_LATENCY, "highs", 5, constraints=Constraints(no_chunk=True))
    assert res.status == "infeasible" and res.success and res.schedule is None and res.lower_bound == math.inf
    assert "request 0's prompt of 4 tokens exceeds P = 2" in res.message and res.seconds < 5


def test_bad_arguments():
    with pytest.raises(KvboundError, match="solver"):
        solve(WORKED, Objective.TOTAL_LATENCY, "gurobi", 5)
    with pytest.raises(KvboundError, match="objective"):
        solve(WORKED, "p99_latency", "highs", 5)
    with pytest.raises(KvboundError, match="formulation"):
        solve(WORKED, Objective.TOTAL_LATENCY, "highs", 5, formulation="nonsense")


# ------------------------------------------------------------------------------ regressions

TTFT_CASE = inst([(1, 1), (1, 2), (1, 2)], M=3, C=2, P=1)


@pytest.mark.parametrize("cons, form", [
    pytest.param(Constraints(no_hybrid=True), "bigm", id="no_hybrid-bigm"),
    pytest.param(Constraints(no_hybrid=True), "network", id="no_hybrid-network"),
    pytest.param(Constraints(no_chunk=True), "bigm", id="no_chunk-bigm"),
    pytest.param(Constraints(no_chunk=True), "network", id="no_chunk-network"),
    pytest.param(Constraints(max_batch_size=1), "network", id="max_batch_size-network"),
    pytest.param(Constraints(no_hybrid=True), "chain", id="no_hybrid-chain"),
    pytest.param(Constraints(no_chunk=True), "chain", id="no_chunk-chain"),
    pytest.param(Constraints(max_batch_size=1), "chain", id="max_batch_size-chain"),
])
def test_mean_ttft_completion_meets_the_constraints(cons, form):
    # for mean_ttft with evictions the model stops at the first tokens; the completion after them
    # must meet the constraints too
    res = solve(TTFT_CASE, Objective.MEAN_TTFT, "highs", TIME_LIMIT, constraints=cons, formulation=form)
    assert res.status == "optimal"
    check_schedule(TTFT_CASE, res, Objective.MEAN_TTFT, cons)


@pytest.mark.parametrize("form", FORMS)
def test_cbc_bound_is_not_above_the_optimum_on_the_a100_preset(form):
    # CBC's point comes back through a text file with ~10 significant digits; in seconds (4 ms
    # batches) its bound came out above the exact optimum
    check_optimal(FIG15, Objective.TOTAL_LATENCY, "cbc", no_evict=True, formulation=form)


def test_highs_bigm_optimum_on_the_a100_preset():
    # in seconds, HiGHS's absolute tolerances (~1e-7) let it stop at a schedule 5e-5 worse than the
    # optimum with a bound above the optimum; the model's clock in intercepts fixes that
    check_optimal(FIG15_O2, Objective.TOTAL_LATENCY, "highs", warm_start=["mcsf"], formulation="bigm")


def test_cpsat_arrival_that_is_a_tick_multiple_only_up_to_rounding():
    # 3 * 0.1 = 0.30000000000000004 is 3 ticks of 0.1 s; rounding it up to 4 ticks lost a tick of bound
    instance = Instance((Request(1, 1), Request(1, 1), Request(1, 1, 3 * 0.1)), SystemConfig(1, 1),
                        CostModel(intercept=0.2, per_token=0.3, decode_kv=0.5, prefill_kv=0.4))
    check_optimal(instance, Objective.MEAN_LATENCY, "cpsat", formulation="bigm")


def test_highs_presolve_that_cuts_off_the_optimum_is_caught():
    # HiGHS 1.13-1.15's MIP presolve reports "optimal" 0.0189 on this network model, above a feasible
    # MIP start worth 0.0170 (the optimum); solve_highs repeats such a solve without presolve
    instance = inst([(3, 1), (3, 2)], M=4, C=2, P=1, cost=A100)
    opt = brute_force(instance, Objective.MEAN_TTFT)
    res, _ = check_optimal(instance, Objective.MEAN_TTFT, "highs", formulation="network", expected=opt.value)
    J = horizon(instance, Objective.MEAN_TTFT, Constraints(), "network")
    form = build_network(instance, Objective.MEAN_TTFT, J)
    arrays = form.model.finalize()
    warm = form.warm_start(opt.schedule)
    assert arrays.check(warm) == []
    out = solve_highs(arrays, Deadline(TIME_LIMIT), warm)
    assert out.status == "optimal"
    assert out.bound / form.objective_scale() <= opt.value * (1 + BOUND_REL)


@pytest.mark.parametrize("form", ["network", "chain"])
def test_highs_presolve_that_cuts_off_the_optimum_below_a_worse_warm_start_is_caught(form):
    # HiGHS 1.16's MIP presolve reports "optimal" 0.016103 s (bound alike) on this arrival case, whose
    # optimum idles until the second request arrives (0.016071 s); found by test_highs_matches_the_oracle.
    # No warm start is better than the cut-off answer, so solve_highs confirms a quick proof without presolve
    instance = Instance((Request(3, 2), Request(2, 1, 0.00185988)), SystemConfig(6, 2, 1, 1),
                        CostModel(intercept=0.00371976, per_token=6.52783e-05, decode_kv=3.7449142857142855e-07,
                                  prefill_attention=1.6804102564102565e-09))
    check_optimal(instance, Objective.MEAN_LATENCY, "highs", formulation=form)  # the oracle's optimum, bound not above it


def test_highs_answer_whose_objective_is_not_its_solution_is_solved_again():
    # HiGHS 1.16 with presolve hands back the MIP start (8 s here) as "optimal" with objective and
    # bound 5.9375, below the optimum, 7 s (found by test_constraints_hold_in_the_optimal_schedule);
    # solve_highs checks the objective against its solution's and solves again without presolve
    instance = inst([(3, 1), (1, 3)], M=5, C=4, P=3, cost=ALL_TERMS)
    cons = Constraints(no_evict=True, no_chunk=True)
    res, opt = check_optimal(instance, Objective.TOTAL_LATENCY, "highs", constraints=cons)
    form = build_bigm(instance, Objective.TOTAL_LATENCY, res.stats["horizon"], cons)
    arrays = form.model.finalize()
    warm = form.warm_start(run_scheduler(instance, "vllm").schedule)
    assert arrays.check(warm) == []
    out = solve_highs(arrays, Deadline(TIME_LIMIT), warm)
    assert out.objective == pytest.approx(float(arrays.objective @ out.x + arrays.objective_offset), rel=1e-9)
    assert out.status == "optimal" and out.objective == pytest.approx(opt, rel=REL)
    assert out.bound <= opt * (1 + BOUND_REL)


@pytest.mark.parametrize("M", [2, 3])
@pytest.mark.parametrize("form", FORMS)
def test_cpsat_with_a_non_decimal_preset_and_arrivals(form, M):
    # With the A100 preset no power of ten makes the coefficients integers; a tick that put batch
    # times near 2^40 units let CP-SAT "prove" a bound 9% above this model's feasible optimum
    # (found by test_cpsat_matches_the_oracle). The tick now keeps the model's magnitudes moderate.
    instance = Instance((Request(1, 1), Request(1, 1), Request(1, M, 0.00557964)), SystemConfig(M, 1, 1), A100)
    res, _ = check_optimal(instance, Objective.TOTAL_LATENCY, "cpsat", formulation=form)
    assert res.stats["bound_discarded"] is None


def test_a_schedule_that_meets_the_analytic_bound_is_returned_without_a_model():
    # UNIT_PAIR, mean latency: a heuristic reaches the analytic bound, so no model is built (real traces
    # had such cases run their whole time limit and 1.8 GB); skip_proven=False still runs the backend
    res = solve(UNIT_PAIR, Objective.MEAN_LATENCY, "highs", 30)
    assert res.status == "optimal" and res.success and res.objective == res.lower_bound == res.analytic_bound
    assert "meets the analytic bound" in res.backend_stats["skipped"] and res.build_seconds == 0
    assert res.objective == brute_force(UNIT_PAIR, Objective.MEAN_LATENCY).value
    forced = solve(UNIT_PAIR, Objective.MEAN_LATENCY, "highs", 30, skip_proven=False)
    assert forced.status == "optimal" and "skipped" not in forced.backend_stats and forced.build_seconds > 0
    # a case a heuristic does not prove still builds its model
    assert "skipped" not in solve(FIG15_O2, Objective.MEAN_LATENCY, "highs", 30).backend_stats


@pytest.mark.parametrize("busy_checks", [3, math.inf])
def test_highs_waits_for_an_abandoned_solve_in_the_same_process(monkeypatch, busy_checks):
    # highspy allows one solve per process at a time: after a solve kvbound had to abandon (it did not
    # stop when asked), the next one raised HighsError("Solver is already running.") in a notebook, a
    # sweep's worker or a bound's many pricings. It now waits for it, within its own deadline
    import highspy

    checks = {"n": 0}
    real = highspy.Highs.is_solver_running

    def running(self):
        checks["n"] += 1
        return True if checks["n"] <= busy_checks else real(self)

    monkeypatch.setattr(highspy.Highs, "is_solver_running", running)
    arrays = build_bigm(UNIT_PAIR, Objective.TOTAL_LATENCY, 6).model.finalize()
    t0 = time.monotonic()
    out = solve_highs(arrays, Deadline(1.0), None)
    if busy_checks == math.inf:
        assert out.status == "unknown" and out.x is None and out.bound == -math.inf
        assert "abandoned, was still running" in out.stats["abandoned"] and time.monotonic() - t0 < 3
    else:
        assert out.status == "optimal" and out.objective == pytest.approx(brute_force(UNIT_PAIR).value)
