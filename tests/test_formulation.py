"""The Big-M formulation against the exact semantics, without a MIP solver.

* Warm starts: every valid schedule (heuristic schedules on random tiny instances, with
  and without arrivals, block sizes 1 and 2, every objective, and hypothesis constraints the
  schedule meets) maps to a point that satisfies every row, bound and integrality of the
  model; its model objective is the validator's exact objective (float model) or at most it
  (integer CP-SAT model with floored coefficients); and `extract` turns the point back into
  a schedule the validator accepts with the same metrics.
* Horizons: `horizon_for(value of a schedule)` admits that schedule.
* Bounds: the analytic bounds, `minimum_work` and the per-request lower bounds never exceed
  what a valid schedule achieves, and never exceed the brute-force optimum.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvbound import Batch, CostModel, Instance, Request, Schedule, ScheduleError, SystemConfig, validate
from kvbound.costs import PRESETS
from kvbound.errors import SchedulerRefused, SchedulerStuck
from kvbound.alone import minimum_work, time_alone
from kvbound.bounds.analytic import analytic_bounds, completion_order_bounds
from kvbound.bounds.kv_items import dff_batches, min_batches
from kvbound.bounds.lp_relaxation import lp_bound
from kvbound.constraints import Constraints
from kvbound.deadline import Deadline
from kvbound.formulation.bigm import build_bigm
from kvbound.formulation.chain import build_chain
from kvbound.formulation.horizon import horizon_for
from kvbound.formulation.model import Model
from kvbound.formulation.network import build_network
from kvbound.formulation.units import tick_for
from kvbound.objective import Objective
from kvbound.schedule import ReplayState
from kvbound.schedulers import SCHEDULERS, run_scheduler
from kvbound.schedulers.rewrite import first_token_prefix
from tests.oracle import brute_force

#: cost models: round decimals; all six terms (dyadic); every batch 1 s; the shipped A100 preset;
#: KV terms dearer than tokens (so evict-only batches can pay); attention only; a per-token slope bending at 2 and 5
COSTS = {
    "round": CostModel(intercept=1.0, per_token=0.1, decode_kv=0.01, prefill_attention=0.001),
    "all-terms": CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125, prefill_attention=0.0625,
                           prefill_kv=0.5, per_prefill_request=0.75),
    "unit": PRESETS["unit-batches"],
    "llama2-7b-a100": PRESETS["llama2-7b-a100"],
    "kv-heavy": CostModel(intercept=0.2, per_token=0.3, decode_kv=0.5, prefill_kv=0.4),
    "attention": CostModel(intercept=0.5, prefill_attention=0.07),
    "kinked": CostModel(intercept=0.5, per_token=0.1, decode_kv=0.01, prefill_attention=0.001, token_knees=(2, 5),
                        per_token_above=(0.2, 0.3)),
}


@st.composite
def instances(draw, min_requests=1, max_requests=3, max_prompt=5, max_output=4, block_sizes=(1, 2),
              arrivals=None, costs=tuple(COSTS)):
    """Small valid instances; arrivals are small multiples of the intercept (None: either way)."""
    k = draw(st.integers(min_requests, max_requests))
    cost = COSTS[draw(st.sampled_from(list(costs)))]
    online = draw(st.booleans()) if arrivals is None else arrivals
    reqs = []
    for i in range(k):
        a = draw(st.sampled_from([0, 0, 1, 2, 3, 8])) * 0.5 * cost.intercept if online and i > 0 else 0.0
        reqs.append(Request(draw(st.integers(1, max_prompt)), draw(st.integers(1, max_output)), float(a)))
    b = draw(st.sampled_from(list(block_sizes)))
    blocks = [-(-r.peak_kv // b) * b for r in reqs]
    M = draw(st.integers(max(blocks), sum(blocks) + b))
    C = draw(st.integers(1, 2 * max_prompt))
    P = draw(st.integers(1, C))
    return Instance(tuple(reqs), SystemConfig(M, C, P, b), cost)


def first_seen_order(schedule: Schedule) -> tuple[int, ...]:
    first: dict[int, int] = {}
    for j, bt in enumerate(schedule.batches):
        for i in bt.tokens:
            first.setdefault(i, j)
    return tuple(sorted(first, key=lambda i: (first[i], i)))


def met_constraints(draw, instance: Instance, schedule: Schedule, objective: str, value: float) -> Constraints:
    """Hypothesis constraints drawn among those the (valid) schedule meets."""
    flags = {}
    for name in ("no_evict", "no_chunk", "no_hybrid"):
        if draw(st.booleans()) and Constraints(**{name: True}).admit(instance, schedule):
            flags[name] = True
    if draw(st.booleans()):
        flags["max_batch_size"] = max((len(bt.tokens) for bt in schedule.batches), default=1) + draw(st.integers(0, 1))
    if draw(st.booleans()):
        flags["admission_order"] = first_seen_order(schedule)
    if draw(st.booleans()):
        flags["objective_cap"] = value * draw(st.sampled_from([1.0, 1.5]))
    cons = Constraints(**flags)
    assert cons.admit(instance, schedule), cons
    return cons


def heuristic_schedule(instance: Instance, name: str) -> Schedule:
    try:
        res = run_scheduler(instance, name)
    except (SchedulerRefused, SchedulerStuck):
        assume(False)
    return res.schedule


def model_objective(form, arrays, x) -> float:
    return float(arrays.objective @ x + arrays.objective_offset) / form.objective_scale()


def processing_batches(instance, schedule, objective, constraints) -> list[Batch]:
    """The batches the model has to hold: up to the last first token when it stops there."""
    batches = schedule.batches
    if constraints.stops_at_first_tokens(objective):
        batches = first_token_prefix(instance, batches)
    return batches


SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                            HealthCheck.too_slow])


# ------------------------------------------------------------------------------ warm starts

def check_warm_start(inst: Instance, schedule: Schedule, objective: str, cons: Constraints) -> None:
    """The warm-start point of a valid schedule meeting `cons`: feasible, exact objective, extracts back."""
    replay = validate(inst, schedule)
    value = Objective(objective).of(replay.metrics)
    J, certified, _ = horizon_for(inst, objective, value, allow_evict=not cons.no_evict)
    assert certified
    # the horizon derived from a schedule's own value admits that schedule
    kept = processing_batches(inst, schedule, objective, cons)
    assert J >= sum(1 for bt in kept if bt.tokens), (J, len(kept))

    # float model: exact
    form = build_bigm(inst, objective, J, cons)
    arrays = form.model.finalize()
    x = form.warm_start(schedule)
    assert x.shape == (arrays.n_cols,)
    assert arrays.check(x) == []
    assert model_objective(form, arrays, x) == pytest.approx(value, rel=1e-9, abs=1e-12)

    # the point describes the schedule: extract gives it back (re-timed by the arrivals), valid, same metrics
    back = form.extract(x)
    again = validate(inst, back)
    assert Objective(objective).of(again.metrics) == pytest.approx(value, rel=1e-9, abs=1e-12)
    if not form.free_end:
        got, want = again.metrics.to_dict(), replay.metrics.to_dict()
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert [bt.tokens for bt in back.batches if bt.tokens] == [bt.tokens for bt in schedule.batches if bt.tokens]
    else:  # the model holds the first-token prefix; extract completes it
        assert again.first_token == pytest.approx(replay.first_token, rel=1e-9, abs=1e-12)
    # the part the model holds meets the constraints (the completion after the first tokens does not
    # always: test_solvers.py::test_mean_ttft_completion_meets_the_constraints)
    held = Schedule(inst.requests, processing_batches(inst, back, objective, cons))
    assert cons.admit(inst, held)

    # integer (CP-SAT) model: coefficients floored in ticks, so the objective is at most the exact one
    tick = tick_for(inst, J)
    iform = build_bigm(inst, objective, J, cons, tick=tick)
    iarrays = iform.model.finalize()
    xi = iform.warm_start(schedule)
    assert iarrays.check(xi) == []
    assert np.all(np.abs(xi[iarrays.integrality] - np.rint(xi[iarrays.integrality])) < 1e-9)
    assert np.all(np.abs(iarrays.vals - np.rint(iarrays.vals)) < 1e-9), "CP-SAT needs integer coefficients"
    assert np.all(np.abs(iarrays.objective - np.rint(iarrays.objective)) < 1e-9)
    scaled = model_objective(iform, iarrays, xi)
    assert scaled <= value * (1 + 1e-12) + 1e-12
    # ... and not far below: each coefficient loses < 1 tick, i.e. at most 1e-5 of itself
    slack = (len(inst) + len(kept) + 2) / tick * (1 + len(inst))
    assert scaled >= value * (1 - 2e-5) - slack, (scaled, value, tick)
    # when the tick makes every coefficient and arrival an exact integer, nothing is lost
    # (see test_solvers.py for arrivals that are integers only up to rounding, like 3 * 0.1)
    if all(v * tick == round(v * tick) for v in list(inst.cost.coefficients) + list(inst.arrivals)):
        assert scaled == pytest.approx(value, rel=1e-9, abs=1e-9)


def random_schedule(draw, inst: Instance, allow_evict: bool, max_steps: int = 10) -> Schedule:
    """A random valid schedule: random evictions (evict-only batches too), random chunks, idle jumps to
    arrivals, then completed one request at a time."""
    state = ReplayState(inst)
    s = inst.system
    k = len(inst)
    batches: list[Batch] = []
    for _ in range(max_steps):
        if not state.unfinished:
            break
        live = [i for i in range(k) if not state.finished[i]]
        evict = tuple(i for i in live if allow_evict and state.m[i] > 0 and draw(st.integers(0, 3)) == 0)
        horizon_time = state.now if any(state.arrival[i] <= state.now for i in live) else \
            min(state.arrival[i] for i in live)
        tokens: dict[int, int] = {}
        for i in draw(st.permutations(live)):
            if i in evict or state.arrival[i] > horizon_time or draw(st.integers(0, 3)) == 0:
                continue
            m = 0 if i in evict else state.m[i]
            c = draw(st.integers(1, state.prompt[i] + state.n[i] - m))
            tokens[i] = c
        start = max((state.arrival[i] for i in tokens), default=0.0)
        bt = Batch(tokens, evict, start if start > state.now else None)
        if not tokens and not evict:
            continue
        try:
            state.apply(bt)  # checks everything before it changes the state
        except ScheduleError:
            continue
        batches.append(bt)
    # finish: serve the unfinished requests one at a time, earliest arrival first, evicting the others
    # if memory runs short (without evictions a stuck state is skipped)
    P = min(s.max_prefill_tokens, s.max_batch_tokens)
    for i in sorted((i for i in range(k) if not state.finished[i]), key=lambda i: (state.arrival[i], i)):
        while not state.finished[i]:
            S = state.prompt[i] + state.n[i]
            decode = state.n[i] >= 1 and S - state.m[i] == 1
            c = 1 if decode else min(S - state.m[i], P)
            start = state.arrival[i] if state.arrival[i] > state.now else None
            bt = Batch({i: c}, (), start)
            try:
                state.apply(bt)
            except ScheduleError:
                others = tuple(q for q in range(k) if q != i and not state.finished[q] and state.m[q] > 0)
                assume(allow_evict and others)
                bt = Batch({i: c}, others, start)
                state.apply(bt)
            batches.append(bt)
    return Schedule(inst.requests, batches)


@SETTINGS
@given(inst=instances(), scheduler=st.sampled_from(sorted(SCHEDULERS)), objective=st.sampled_from(list(Objective)),
       data=st.data())
def test_warm_start_of_heuristic_schedules(inst, scheduler, objective, data):
    schedule = heuristic_schedule(inst, scheduler)
    value = Objective(objective).of(validate(inst, schedule).metrics)
    check_warm_start(inst, schedule, objective, met_constraints(data.draw, inst, schedule, objective, value))


@SETTINGS
@given(inst=instances(), objective=st.sampled_from(list(Objective)), allow_evict=st.booleans(), data=st.data())
def test_warm_start_of_random_schedules(inst, objective, allow_evict, data):
    schedule = random_schedule(data.draw, inst, allow_evict)
    value = Objective(objective).of(validate(inst, schedule).metrics)
    check_warm_start(inst, schedule, objective, met_constraints(data.draw, inst, schedule, objective, value))


@pytest.mark.parametrize("objective", list(Objective))
def test_warm_start_of_the_worked_example(objective):
    # docs/semantics.md section 13: evictions, a chunk, a decode, an idle jump to an arrival
    inst = Instance((Request(3, 3), Request(2, 2), Request(2, 1, 6.0)), SystemConfig(6, 4),
                    CostModel(intercept=1.0, per_token=0.1, decode_kv=0.01, prefill_attention=0.001))
    sched = Schedule(inst.requests, [Batch({0: 3, 1: 1}), Batch({0: 1, 1: 1}), Batch({0: 1}, (1,)),
                                     Batch({1: 3}), Batch({2: 2}, (), 6.0)])
    expected = {Objective.TOTAL_LATENCY: 7.204, Objective.MEAN_LATENCY: 10.079 / 3, Objective.MEAN_TTFT: 5.257 / 3}[objective]
    for J in (5, 9):
        form = build_bigm(inst, objective, J)
        arrays = form.model.finalize()
        x = form.warm_start(sched)
        assert arrays.check(x) == []
        assert model_objective(form, arrays, x) == pytest.approx(expected, rel=1e-12)
        B = form.blocks
        assert x[B["e"]][1, 2] == 1 and x[B["e"]].sum() == 1
        assert list(x[B["c"]][:, 0]) == [3, 1, 0]
        assert x[B["idle"]][4] == pytest.approx(6.0 - 5.092)
    with pytest.raises(ValueError, match="horizon"):
        build_bigm(inst, objective, 3).warm_start(sched)


def test_a_point_off_the_schedule_breaks_a_row():
    # the check is not vacuous: changing a token count, a batch time or a finish flag breaks the model
    inst = Instance((Request(3, 3), Request(2, 2)), SystemConfig(6, 4),
                    CostModel(intercept=1.0, per_token=0.1, decode_kv=0.01, prefill_attention=0.001))
    sched = run_scheduler(inst, "sarathi").schedule
    form = build_bigm(inst, Objective.TOTAL_LATENCY, 8)
    arrays = form.model.finalize()
    x = form.warm_start(sched)
    assert arrays.check(x) == []
    for block, index, delta in (("c", (0, 0), 1), ("T", (0,), 0.01), ("f", (0, 8), -1), ("m", (1, 1), 1)):
        y = x.copy()
        y[form.blocks[block][index]] += delta
        assert arrays.check(y), block


@pytest.mark.parametrize("builder", [build_bigm, build_network, build_chain])
def test_warm_start_keeps_an_idle_jump_written_as_an_empty_batch(builder):
    # docs/semantics.md section 7: "An empty batch with a start still moves the clock"
    inst = Instance((Request(2, 1), Request(2, 1, 5.0)), SystemConfig(4, 4), PRESETS["unit-batches"])
    sched = Schedule(inst.requests, [Batch({0: 2}), Batch({}, (), 5.0), Batch({1: 2})])
    assert validate(inst, sched).metrics.total_latency == 6.0
    form = builder(inst, Objective.TOTAL_LATENCY, 3)
    arrays = form.model.finalize()
    x = form.warm_start(sched)
    assert arrays.check(x) == []
    assert model_objective(form, arrays, x) == 6.0
    assert validate(inst, form.extract(x)).metrics.total_latency == 6.0


def test_repeated_entries_of_a_row_are_summed():
    # HiGHS's presolve loops forever on a matrix with a repeated (row, column) entry
    md = Model()
    v = md.add_vars("v", 3, 0, 10)
    md.add_rows("r", 1, [(v[None, :], [[1.0, 2.0, 3.0]]), (v[None, :1], -1.0), (v[None, 2:], 0.5)], hi=4)
    arrays = md.finalize()
    assert sorted(zip(*(a.tolist() for a in arrays.triplets()))) == [(0, 1, 2.0), (0, 2, 3.5)]
    assert arrays.check(np.array([10.0, 2.0, 0.0])) == []
    assert arrays.check(np.array([0.0, 2.0, 0.1]))


# ------------------------------------------------------------------------------ horizons

@settings(max_examples=100, deadline=None)
@given(inst=instances(max_requests=3, max_prompt=4, max_output=3), objective=st.sampled_from(list(Objective)),
       allow_evict=st.booleans())
def test_horizon_admits_an_optimal_schedule(inst, objective, allow_evict):
    # J from the optimum itself must hold the (an) optimal schedule
    opt = brute_force(inst, objective, allow_evict=allow_evict)
    cons = Constraints(no_evict=not allow_evict)
    J, certified, _ = horizon_for(inst, objective, opt.value, allow_evict=allow_evict)
    assert certified
    kept = processing_batches(inst, opt.schedule, objective, cons)
    assert J >= sum(1 for bt in kept if bt.tokens)
    form = build_bigm(inst, objective, max(J, sum(1 for bt in kept if bt.tokens or bt.evict)), cons)
    arrays = form.model.finalize()
    x = form.warm_start(opt.schedule)
    assert arrays.check(x) == []
    assert model_objective(form, arrays, x) == pytest.approx(opt.value, rel=1e-9, abs=1e-12)


def test_horizon_grows_with_the_upper_bound():
    inst = Instance((Request(3, 3), Request(2, 2)), SystemConfig(6, 4), PRESETS["unit-batches"])
    for objective in Objective:
        js = [horizon_for(inst, objective, ub)[0] for ub in (3.0, 5.0, 8.0, 13.0)]
        assert js == sorted(js) and js[-1] > js[0]
    # every batch costs 1 s: a total latency of 6 s allows 6 processing batches (12 with evict-only batches)
    assert horizon_for(inst, Objective.TOTAL_LATENCY, 6.0, allow_evict=False)[0] == 6
    assert horizon_for(inst, Objective.TOTAL_LATENCY, 6.0, allow_evict=True)[0] >= 6


# ------------------------------------------------------------------------------ bounds

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(inst=instances(), scheduler=st.sampled_from(sorted(SCHEDULERS)))
def test_work_and_per_request_bounds_hold_for_every_schedule(inst, scheduler):
    schedule = heuristic_schedule(inst, scheduler)
    replay = validate(inst, schedule)
    durations = replay.batch_end - replay.batch_start
    # every processing batch costs the intercept, and the rest adds up to at least minimum_work
    work = float(durations.sum()) - inst.cost.intercept * replay.metrics.batches
    assert work >= minimum_work(inst) * (1 - 1e-9) - 1e-12
    assert replay.metrics.batches >= min_batches(inst)
    for i in range(len(inst)):
        latency = replay.completion[i] - replay.arrivals[i]
        ttft = replay.first_token[i] - replay.arrivals[i]
        assert latency >= time_alone(inst, Objective.TOTAL_LATENCY)[i] * (1 - 1e-9) - 1e-12
        assert ttft >= time_alone(inst, Objective.MEAN_TTFT)[i] * (1 - 1e-9) - 1e-12
    for objective in Objective:
        value = Objective(objective).of(replay.metrics)
        for b in analytic_bounds(inst, objective):
            assert b.certified and b.value <= value * (1 + 1e-9) + 1e-12, (objective, b)


@settings(max_examples=80, deadline=None)
@given(inst=instances(min_requests=1, max_requests=3, max_prompt=4, max_output=3),
       objective=st.sampled_from(list(Objective)))
def test_analytic_bounds_never_exceed_the_brute_force_optimum(inst, objective):
    opt = brute_force(inst, objective)
    bounds = analytic_bounds(inst, objective)
    assert bounds and all(b.name and b.seconds >= 0 for b in bounds)
    for b in bounds:
        assert b.value <= opt.value * (1 + 1e-9) + 1e-12, (b, opt.value)
    if objective == Objective.TOTAL_LATENCY:
        assert min_batches(inst) * inst.cost.intercept + minimum_work(inst) <= opt.value * (1 + 1e-9) + 1e-12
        assert validate(inst, opt.schedule).metrics.batches >= min_batches(inst)
    per_request = [time_alone(inst, Objective.MEAN_TTFT if objective == Objective.MEAN_TTFT else Objective.TOTAL_LATENCY)[i] for i in range(len(inst))]
    if objective != Objective.TOTAL_LATENCY:
        assert sum(per_request) / len(inst) <= opt.value * (1 + 1e-9) + 1e-12
    else:
        assert max(r.arrival + t for r, t in zip(inst.requests, per_request)) <= opt.value * (1 + 1e-9) + 1e-12


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(inst=instances(max_requests=6, max_prompt=8, max_output=5), scheduler=st.sampled_from(sorted(SCHEDULERS)),
       objective=st.sampled_from([Objective.MEAN_LATENCY, Objective.MEAN_TTFT]))
def test_kth_completion_bounds_hold_for_every_schedules_kth_completion(inst, scheduler, objective):
    """`completion_order_bounds`, k by k (its "by length" part with the batches the tokens and KV need
    included), against the k-th smallest completion (first-token) time of every scheduler's schedule
    and of the oracle's: tight M, evictions, chunks, arrivals."""
    schedules = [heuristic_schedule(inst, scheduler)]
    if len(inst) <= 3:
        schedules.append(brute_force(inst, objective).schedule)
    bound = completion_order_bounds(inst, objective)
    for schedule in schedules:
        replay = validate(inst, schedule)
        times = np.sort(replay.first_token if objective.first_token else replay.completion)
        assert (bound <= times * (1 + 1e-9) + 1e-12).all(), (list(bound), list(times))


@settings(max_examples=50, deadline=None)
@given(inst=instances(min_requests=1, max_requests=2, max_prompt=3, max_output=3, costs=("round", "all-terms", "unit")),
       objective=st.sampled_from(list(Objective)))
def test_lp_relaxation_never_exceeds_the_brute_force_optimum(inst, objective):
    opt = brute_force(inst, objective)
    b = lp_bound(inst, objective, opt.value, Deadline(20))
    assert b.certified
    assert math.isfinite(b.value)
    assert b.value <= opt.value * (1 + 1e-7) + 1e-9, (b, opt.value)


@pytest.mark.parametrize("I", [3, 8, 64])
def test_dual_feasible_batch_count_on_the_figure_15_family(I):
    # 4 requests, O = 4, M = 2I: each first token is generated with I = M/2 cached (weight 1/2 under
    # u^(1)), each later token with more than M/2 (weight 1: no two share a batch), so 4/2 + 4 x 3 = 14
    # batches, where the KV area gives only ceil(4 (4I + 6) / 2I)
    inst = Instance(tuple(Request(I, 4) for _ in range(4)), SystemConfig(2 * I, 64), CostModel(intercept=1.0, per_token=0.1))
    area = math.ceil(4 * (4 * I + 6) / (2 * I))
    assert area < 14 and dff_batches(inst) == 14 == min_batches(inst)
    for name in ("sarathi", "evict-short", "rank-i", "mcsf-pc"):
        assert validate(inst, run_scheduler(inst, name).schedule).metrics.batches >= 14


@settings(max_examples=30, deadline=None)
@given(inst=instances(min_requests=1, max_requests=5, max_prompt=9, max_output=5), objective=st.sampled_from(list(Objective)))
def test_kv_weights_are_each_items_dual_feasible_weights_summed_by_request(inst, objective):
    # kv_weights prices each distinct item size once and sums exact numerators through (request, size)
    # counts: the same as the definition, item by item
    from kvbound.bounds.kv_items import DFF_FUNCTIONS, dual_feasible_weights, kv_items, kv_weights

    items, owner = kv_items(inst, objective)
    M, n = inst.system.kv_capacity, len(inst)
    by_item = np.stack([np.bincount(owner, dual_feasible_weights(items, M, k), n) for k in range(1, DFF_FUNCTIONS + 1)],
                       axis=1)
    assert np.allclose(kv_weights(inst, objective, (items, owner)), by_item, rtol=1e-12, atol=0)


@settings(max_examples=30, deadline=None)
@given(inst=instances(min_requests=1, max_requests=4, max_prompt=6, max_output=4, arrivals=True),
       objective=st.sampled_from(list(Objective)))
def test_analytic_bounds_cut_by_their_deadline_are_the_first_of_the_full_list(inst, objective):
    # with a deadline that has passed, the cheapest bound alone (the k-th completion / one-machine loops
    # stop too, at values that are still bounds: a maximum over part of their release times or multipliers)
    from kvbound.bounds.analytic import one_machine_completions

    full = analytic_bounds(inst, objective)
    cut = analytic_bounds(inst, objective, Deadline(0.0))
    assert [b.name for b in cut] == [b.name for b in full[:1]] and cut[0].value == full[0].value
    if objective.is_mean:
        spans = np.sort(inst.arrivals + time_alone(inst, objective))
        partial = completion_order_bounds(inst, objective, deadline=Deadline(0.0))
        assert (spans <= partial).all() and (partial <= completion_order_bounds(inst, objective) + 1e-12).all()
        assert one_machine_completions(inst, objective, deadline=Deadline(0.0)) <= one_machine_completions(inst, objective) + 1e-12


# ------------------------------------------------------------------------------ the release bound

def test_release_bound_counts_the_batches_of_a_late_burst():
    # one request at 0, then three at t = 10 that each fill M = 4 alone: whatever runs before 10,
    # the burst needs three batches after it (13 s); the other bounds see 10 + 1 s or 4 batches
    from kvbound.bounds.analytic import release_bound

    reqs = (Request(1, 1),) + (Request(4, 1, 10.0),) * 3
    inst = Instance(reqs, SystemConfig(4, 64, 64, 1), CostModel(intercept=1.0))
    assert release_bound(inst) == (13.0, 10.0)
    bounds = {b.name: b.value for b in analytic_bounds(inst, Objective.TOTAL_LATENCY)}
    assert max(bounds.values()) == 13.0 and sorted(bounds.values())[-2] < 13.0
    assert brute_force(inst, Objective.TOTAL_LATENCY).value == 13.0
    # offline, the release bound is the batch bound itself: it is not listed
    offline = Instance(tuple(Request(r.prompt, r.output) for r in reqs), inst.system, inst.cost)
    assert len(analytic_bounds(offline, Objective.TOTAL_LATENCY)) == 2


def test_completion_order_bound_counts_a_late_burst_from_its_arrival():
    # the same late burst, mean latency: r0 done at 1 s, the burst at 11, 12, 13 s; latencies 1, 1, 2, 3.
    # From t = 0 the shares put the burst's completions at 2-4 s (below its arrival); from t = 10
    # they give 11, 12, 13 s, and the bound is the optimum
    reqs = (Request(1, 1),) + (Request(4, 1, 10.0),) * 3
    inst = Instance(reqs, SystemConfig(4, 64, 64, 1), CostModel(intercept=1.0))
    opt = brute_force(inst, Objective.MEAN_LATENCY).value
    assert opt == pytest.approx(1.75)
    assert max(b.value for b in analytic_bounds(inst, Objective.MEAN_LATENCY)) == pytest.approx(opt)


def test_pairwise_work_waits_see_a_prefill_arriving_during_another():
    # r0 (4 prompt tokens) at 0, r1 and r2 (1 each) at 2; 1 s intercept, 1 s a token: alone they
    # take 5, 2 and 2 s. Of r0 and a late one, whichever finishes last waits for the other's work
    # still to do: the late one for at least 4 - 2 s of r0's, or r0 for its 1 s; of r1 and r2, one
    # waits 1 s for the other. Mean >= (9 + 3) / 3 = 4, where the other bounds stay below
    from kvbound.bounds.analytic import pairwise_work_waits

    reqs = (Request(4, 1), Request(1, 1, 2.0), Request(1, 1, 2.0))
    inst = Instance(reqs, SystemConfig(64, 8, 8, 1), CostModel(intercept=1.0, per_token=1.0))
    assert pairwise_work_waits(inst, Objective.MEAN_LATENCY) == pytest.approx(3.0)
    bounds = {b.name: b.value for b in analytic_bounds(inst, Objective.MEAN_LATENCY)}
    assert bounds["each request alone + pairwise work waits"] == pytest.approx(4.0)
    # the queue of work on one machine sees it too (SRPT: 3, 4 and 6 s, flow 9 s, beside 3 intercepts)
    machine = "each request's own intercepts + one machine of every request's work, shortest remaining first"
    assert bounds.pop(machine) == pytest.approx(4.0)
    assert max(v for name, v in bounds.items() if "pairwise" not in name) < 3.9
    assert brute_force(inst, Objective.MEAN_LATENCY).value >= 4.0
    # the first prefills are the whole work here: the same for TTFT
    ttft = {b.name: b.value for b in analytic_bounds(inst, Objective.MEAN_TTFT)}
    assert ttft["each first prefill alone + pairwise prefill waits"] == pytest.approx(4.0)


def test_pairwise_work_waits_count_the_tokens_a_request_cannot_have_reached():
    # r0 (1 prompt token, 4 to generate) at 0: alone its tokens come at 1.25, 2.75, 4.5 and 6.5 s
    # (1 s intercept, 0.25 s a token, 0.25 s a cached token read). r1 (4 prompt tokens, work 1 s)
    # arrives at 2.75 s, when r0 has at most 2 tokens: token 4's batch (work 0.25 + 3 x 0.25 = 1 s)
    # starts later. W_r0 - 2.75 s is below 0, but r1 waits for that 1 s or r0 for r1's 1 s
    from kvbound.bounds.analytic import pairwise_work_waits

    cost = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.25)
    inst = Instance((Request(1, 4), Request(4, 1, 2.75)), SystemConfig(64, 8, 8, 1), cost)
    assert pairwise_work_waits(inst, Objective.MEAN_LATENCY) == pytest.approx(1.0)
    bounds = {b.name: b.value for b in analytic_bounds(inst, Objective.MEAN_LATENCY)}
    assert bounds["each request alone + pairwise work waits"] == pytest.approx((6.5 + 2.0 + 1.0) / 2)
    assert brute_force(inst, Objective.MEAN_LATENCY).value >= 4.75


def test_pairwise_work_waits_count_the_intercepts_a_later_request_skips():
    # r0 (1 prompt token, 3 to generate) at 0: alone its tokens come at 1.25, 2.75 and 4.5 s (1 s
    # intercept, 0.25 s a token, 0.25 s a cached token read); r1 (4 prompt tokens, 2 to generate)
    # arrives at 2.5 s, when r0 has at most 1 token. If r1 finishes last it waits for r0's work
    # still to come (0.75 s of token 3) and for token 3's batch: without r1 in it that is 1 s of
    # intercept; with r1 in it, r1 is a batch closer to done only by its whole prefill (1 s of work,
    # which r0 waits for). If r0 finishes last it waits for r1's 2.25 s. So the pair adds
    # min(0.75 + 1, 2.25) = 1.75 s, not the 0.75 s of the work alone
    from kvbound.bounds.analytic import pairwise_work_waits

    cost = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.25)
    inst = Instance((Request(1, 3), Request(4, 2, 2.5)), SystemConfig(64, 8, 8, 1), cost)
    assert [time_alone(inst, Objective.TOTAL_LATENCY)[i] for i in range(2)] == [4.5, 4.25]
    assert pairwise_work_waits(inst, Objective.MEAN_LATENCY) == pytest.approx(1.75)
    bounds = {b.name: b.value for b in analytic_bounds(inst, Objective.MEAN_LATENCY)}
    pairwise = bounds.pop("each request alone + pairwise work waits")
    assert pairwise == pytest.approx((4.5 + 4.25 + 1.75) / 2)
    assert pairwise > max(bounds.values()) + 0.8
    assert pairwise <= brute_force(inst, Objective.MEAN_LATENCY).value == pytest.approx(5.375)


def _pairwise_by_remaining_time(inst) -> float:
    """The pair terms with W_r - (a_q - a_r) alone: what the token count adds to is at least this."""
    from kvbound.alone import least_work

    work = [least_work(r, inst.cost) for r in inst.requests]
    total = 0.0
    for r, q in itertools.permutations(range(len(inst)), 2):
        a_r, a_q = inst.requests[r].arrival, inst.requests[q].arrival
        if (a_r, r) < (a_q, q):
            total += min(max(0.0, work[r] - (a_q - a_r)), work[q])
    return total


@settings(max_examples=150, deadline=None)
@given(inst=instances(min_requests=2, max_requests=3, max_prompt=3, max_output=4, arrivals=True))
def test_pairwise_work_waits_with_arrivals_never_exceed_the_brute_force_optimum(inst):
    from kvbound.bounds.analytic import pairwise_work_waits

    waits = pairwise_work_waits(inst, Objective.MEAN_LATENCY)
    assert waits >= _pairwise_by_remaining_time(inst) * (1 - 1e-12) - 1e-12
    alone = sum(time_alone(inst, Objective.TOTAL_LATENCY)[i] for i in range(len(inst)))
    assert (alone + waits) / len(inst) <= brute_force(inst, Objective.MEAN_LATENCY).value * (1 + 1e-9) + 1e-12


@settings(max_examples=80, deadline=None)
@given(inst=instances(min_requests=3, max_requests=4, max_prompt=2, max_output=3))
def test_intercept_parts_from_several_partners_never_exceed_the_brute_force_optimum(inst):
    """Each request's intercept part now comes from all its earlier partners at once (`_intercept_parts`):
    with 3-4 requests arriving close together or all at 0 (several partners each), the bound stays below
    the optimum."""
    from kvbound.bounds.analytic import pair_terms, pairwise_work_waits

    order, rows, extra = pair_terms(inst, Objective.MEAN_LATENCY)
    waits = pairwise_work_waits(inst, Objective.MEAN_LATENCY)
    assert waits == pytest.approx(sum(float(p.sum()) for _, p in rows) + float(extra.sum()))
    alone = sum(time_alone(inst, Objective.TOTAL_LATENCY)[i] for i in range(len(inst)))
    assert (alone + waits) / len(inst) <= brute_force(inst, Objective.MEAN_LATENCY).value * (1 + 1e-9) + 1e-12


def test_intercept_parts_charge_every_partner_the_work_done_in_its_batches():
    # r0 and r1 (1 prompt token, 3 to generate) at 0, q (4 prompt tokens, 1 to generate: 1 s of
    # work) at 2.5 s (1 s intercept, 0.25 s a token, 0.25 s a cached token read). At 2.5 s each of
    # r0, r1 has at least its third token's batch to come (0.75 s of work left). q either waits for
    # a batch it is not in (1 s of intercept besides the 0.75 s of each partner's work: 1 s over the
    # pairs' 1.5 s), or finishes no earlier than a partner, which then waits for all of q's 1 s: with
    # both, 2 s, 0.5 s over the pairs. One partner at a time saw 1 s against 0.75 s: 0.25 s.
    from kvbound.bounds.analytic import _intercept_parts, _progress_work, pair_terms

    cost = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.25)
    inst = Instance((Request(1, 3), Request(1, 3), Request(4, 1, 2.5)), SystemConfig(64, 8, 8, 1), cost)
    order, rows, extra = pair_terms(inst, Objective.MEAN_LATENCY)
    assert [float(p[-1]) for _, p in rows] == [0.75, 0.75]
    assert extra[2] == pytest.approx(0.5)
    one = np.array([[0.75, 1, 0.75]])
    assert _intercept_parts(one, _progress_work(inst, 2, np.array([1.0])), 1.0, 1.0) == pytest.approx(0.25)
    bound = (sum(time_alone(inst, Objective.TOTAL_LATENCY)) + sum(float(p.sum()) for _, p in rows) + extra.sum()) / 3
    assert bound <= brute_force(inst, Objective.MEAN_LATENCY).value * (1 + 1e-9)


def test_one_machine_bound_takes_each_request_s_own_time_too():
    # M = 6 holds r0 (I = 4, O = 3) or r2 (I = 2, O = 2) with one more token, r1 (I = 4, O = 2)
    # arrives at 3 s; 1 s intercept, 0.25 s a token. The machine's k-th completion (SRPT on the
    # shares) and the k-th smallest arrival + own time (2.75, 4.5, 6.25 s) are each below what the
    # k-th request needs; their larger one, paired in order, gives 17.5 s where either gives at most
    # 16, and the bound is the largest one, still below the brute-force optimum
    from kvbound.bounds.analytic import one_machine_completions

    inst = Instance((Request(4, 3), Request(4, 2, 3.0), Request(2, 2)), SystemConfig(6, 8, 8, 1),
                    CostModel(intercept=1.0, per_token=0.25))
    own = np.array([time_alone(inst, Objective.TOTAL_LATENCY)[i] for i in range(3)])
    assert (inst.arrivals + own).tolist() == [4.5, 6.25, 2.75]
    assert one_machine_completions(inst, Objective.MEAN_LATENCY, own=np.full(3, -np.inf)) == pytest.approx(16.0)
    assert one_machine_completions(inst, Objective.MEAN_LATENCY) == pytest.approx(17.5)
    bounds = {b.name: b.value for b in analytic_bounds(inst, Objective.MEAN_LATENCY)}
    machine = bounds.pop("one machine, shortest remaining share first, and each request alone")
    assert machine == pytest.approx((17.5 - 3.0) / 3)
    # the k-th completion bound comes nearest: 2.75, 5 and 9 s (its "by length" part: the KV items of
    # r2 and r1 take 3 batches of M = 6, all three requests' take 5)
    assert bounds["k-th completion >= k smallest capacity shares + work"] == pytest.approx((16.75 - 3.0) / 3)
    assert machine > max(bounds.values()) + 0.2
    assert machine <= brute_force(inst, Objective.MEAN_LATENCY).value


def test_own_intercepts_beside_one_machine_of_work():
    # r0 (3 prompt tokens, 2 to generate) at 0, r1 (2, 2) and r3 (5, 1) at 0.5 s, r2 (2, 2) at 3 s;
    # 1 s intercept, 0.25 s a token and a cached token read. Own batches 2 + 2 + 2 + 1 (7 s of
    # intercepts); least work 1.75, 1.25, 1.25, 1.25 s, which one machine, shortest remaining first,
    # finishes at 1.75, 3, 4.25 and 5.5 s: flow 10.5 s. (7 + 10.5) / 4 = 4.375 s, above every other
    # analytic bound (a burst's work queued, each request's intercepts in full), below the optimum
    from kvbound.bounds.analytic import own_intercepts_and_work_machine

    reqs = (Request(3, 2), Request(2, 2, 0.5), Request(2, 2, 3.0), Request(5, 1, 0.5))
    inst = Instance(reqs, SystemConfig(14, 8, 8, 1), CostModel(intercept=1.0, per_token=0.25, decode_kv=0.25))
    assert own_intercepts_and_work_machine(inst, Objective.MEAN_LATENCY) == pytest.approx(17.5)
    bounds = {b.name: b.value for b in analytic_bounds(inst, Objective.MEAN_LATENCY)}
    new = bounds.pop("each request's own intercepts + one machine of every request's work, shortest remaining first")
    assert new == pytest.approx(4.375)
    assert new > max(bounds.values()) + 0.2
    assert new <= brute_force(inst, Objective.MEAN_LATENCY).value == pytest.approx(5.6875)


@settings(max_examples=120, deadline=None)
@given(inst=instances(min_requests=2, max_requests=4, max_prompt=3, max_output=3, arrivals=True),
       objective=st.sampled_from([Objective.MEAN_LATENCY, Objective.MEAN_TTFT]))
def test_own_intercepts_beside_one_machine_of_work_never_exceed_the_brute_force_optimum(inst, objective):
    """The machine's flow is at least each request's own work, so the bound is at least the mean of
    each request alone, and never above the optimum (arrivals, evictions, tight M)."""
    from kvbound.bounds.analytic import own_intercepts_and_work_machine

    bound = own_intercepts_and_work_machine(inst, objective) / len(inst)
    alone = float(time_alone(inst, objective).sum()) / len(inst)
    assert bound >= alone * (1 - 1e-12) - 1e-12
    assert bound <= brute_force(inst, objective).value * (1 + 1e-9) + 1e-12


def test_first_prefills_in_batches_is_the_optimum_where_decodes_wait():
    # three prompts 4, 1, 2 at 0, 1 s intercept, 0.25 s a token: shortest first, the first two together
    # (1.75 s each) then the third (3.75 s) is the best grouping (7.25 s); every other analytic bound
    # prices the intercepts one request at a time. With outputs of 2-3 and M = 7, C = P = 4 the
    # optimum keeps its first tokens (the decodes come after), and so does the bound
    from kvbound.bounds.analytic import first_prefill_batches

    cost = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125)
    for outputs, system in (((1, 1, 1), SystemConfig(16, 8, 8, 1)), ((2, 3, 2), SystemConfig(7, 4, 4, 1))):
        inst = Instance(tuple(Request(i, o) for i, o in zip((4, 1, 2), outputs)), system, cost)
        assert first_prefill_batches(inst) == pytest.approx(7.25 / 3)
        assert brute_force(inst, Objective.MEAN_TTFT).value == pytest.approx(7.25 / 3)
        bounds = {b.name: b.value for b in analytic_bounds(inst, Objective.MEAN_TTFT)}
        new = bounds.pop("first prefills in batches, shortest first, each batch waited for by every request "
                         "without its first token")
        # the k-th first token bound comes nearest: 1.25, 1.75 s and, for the third, the batches its
        # prompts need (1 at P = 8: 2.75 s; 2 at P = 4: 3.75 s, the optimum's own third)
        third = 2.75 if system.max_prefill_tokens == 8 else 3.75
        assert bounds["k-th first token >= k smallest capacity shares + prefill work"] == pytest.approx((3.0 + third) / 3)
        assert new == pytest.approx(7.25 / 3) and new > max(bounds.values()) + 0.15
    assert "first prefills in batches" not in " ".join(
        b.name for b in analytic_bounds(Instance((Request(1, 1), Request(1, 1, 1.0)), SystemConfig(4, 4, 4, 1), cost),
                                        Objective.MEAN_TTFT))  # only where every request arrives together


@settings(max_examples=150, deadline=None)
@given(inst=instances(min_requests=1, max_requests=4, max_prompt=5, max_output=3, arrivals=False),
       shift=st.sampled_from([0.0, 0.0, 1.5]))
def test_first_prefills_in_batches_never_exceed_the_brute_force_optimum(inst, shift):
    """Tight M, blocks, C and P below the prompts (chunks), every cost model, all at 0 or all at one later time."""
    from kvbound.bounds.analytic import first_prefill_batches

    inst = Instance(tuple(Request(r.prompt, r.output, shift) for r in inst.requests), inst.system, inst.cost)
    bound = first_prefill_batches(inst)
    alone = float(time_alone(inst, Objective.MEAN_TTFT).mean())
    assert bound >= alone * (1 - 1e-12) - 1e-12
    assert bound <= brute_force(inst, Objective.MEAN_TTFT).value * (1 + 1e-9) + 1e-12


def test_shortest_remaining_time_first_on_one_machine():
    from kvbound.bounds.analytic import srpt_completions

    # A (10 s) at 0 is preempted by B (2 s) at 1: B done at 3, A at 12; a job never waits idle
    assert srpt_completions(np.array([0.0, 1.0]), np.array([10.0, 2.0])).tolist() == [3.0, 12.0]
    assert srpt_completions(np.array([0.0, 5.0]), np.array([1.0, 1.0])).tolist() == [1.0, 6.0]
    assert srpt_completions(np.array([0.0, 0.0, 0.0]), np.array([3.0, 1.0, 2.0])).tolist() == [1.0, 3.0, 6.0]


def test_one_machine_bound_counts_the_backlog_of_a_burst():
    # three 4-token prompts in M = 7 (no two fit together once one has its first token), the first
    # with two tokens to generate: 1 s intercept, 0.25 s a token. Their shares keep one machine busy
    # past the later arrivals, which the shares from each arrival time alone do not count; found by
    # a random search over such cases and checked against the brute-force optimum
    reqs = (Request(4, 2), Request(4, 1, 2.0), Request(4, 1, 1.0))
    inst = Instance(reqs, SystemConfig(7, 8, 8, 1), CostModel(intercept=1.0, per_token=0.25))
    bounds = {b.name: b.value for b in analytic_bounds(inst, Objective.MEAN_LATENCY)}
    machine = bounds.pop("one machine, shortest remaining share first, and each request alone")
    assert machine == pytest.approx(49 / 12)
    assert machine > max(bounds.values()) + 0.3
    assert machine <= brute_force(inst, Objective.MEAN_LATENCY).value == pytest.approx(4.25)
    offline = Instance(tuple(Request(r.prompt, r.output) for r in reqs), inst.system, inst.cost)
    assert not any(b.name.startswith("one machine") for b in analytic_bounds(offline, Objective.MEAN_LATENCY))


def test_a_first_token_prefix_the_greedy_completion_cannot_finish_is_finished_one_at_a_time():
    # found by test_warm_start_of_heuristic_schedules: after larry's first tokens under no_chunk both long
    # requests hold M; the greedy completion decoded the one that could still be refilled past P (S = 7 > 6)
    # and then could evict neither, so extract gave no schedule. Evicting it while it can be refilled works
    inst = Instance((Request(5, 3), Request(5, 3), Request(1, 1)), SystemConfig(12, 6, 6, 2),
                    CostModel(1.0, 0.1, 0.01, 0.001))
    cons = Constraints(no_chunk=True)
    check_warm_start(inst, run_scheduler(inst, "larry").schedule, Objective.MEAN_TTFT, cons)
