"""Identical requests under a tight KV limit (issue 37, the Figure 15 family): the exclusive-holders
bound (`kvbound.bounds.analytic.exclusive_holders_bound`, docs/formulation.md, "Bounds").

* The lemma behind it, on every schedule (heuristic ones and random ones with evictions): the
  members of the exclusive set take at least sum(O) batches less one per member evicted between
  its first and second token, and each such member works its refill's extra on top of the minimum
  work.
* The bound never exceeds the brute-force optimum (2-4 identical requests, sometimes a distinct
  one, arrivals, tight M, block sizes 1 and 2, evictions allowed), and a solve that proves an
  optimum proves the oracle's.
* On the Figure 15 family it meets the best heuristic schedule: every I from 4 to 1,024 is proven
  without a model.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kvbound import Instance, Request, Schedule, SystemConfig, load_case, validate
from kvbound.solvers.driver import solve
from kvbound.alone import minimum_work, refilled_token_work, token_work
from kvbound.bounds.analytic import analytic_bounds, exclusive_holders_bound
from kvbound.bounds.kv_items import exclusive_holders, min_batches
from kvbound.objective import Objective
from kvbound.schedule import ReplayState
from kvbound.schedulers import SCHEDULERS
from tests.oracle import brute_force
from tests.test_formulation import COSTS, heuristic_schedule, random_schedule

ROOT = Path(__file__).resolve().parents[1]


@st.composite
def identical_instances(draw, max_identical=4, max_prompt=6, max_output=4, oracle=False):
    """2-4 identical requests (same prompt, output and arrival), sometimes a distinct one, sometimes
    arriving later; M tight: from the largest peak up to two prompts and a block, so that the
    identical requests often cannot hold KV together past their first tokens. `oracle`: small
    enough for the brute-force search (4 identical only with I, O <= 2; 3 requests with I, O <= 3)."""
    k = draw(st.integers(2, max_identical))
    other = draw(st.booleans()) and (not oracle or k <= 2)
    if oracle:
        max_prompt, max_output = (2, 2) if k + other >= 4 else (3, 3)
    cost = COSTS[draw(st.sampled_from(sorted(COSTS)))]
    I, O = draw(st.integers(1, max_prompt)), draw(st.integers(2, max_output))
    late = draw(st.sampled_from([0, 0, 0, 1, 2])) * 0.5 * cost.intercept
    reqs = [Request(I, O, late) for _ in range(k)]
    if other:
        reqs.insert(draw(st.integers(0, k)), Request(draw(st.integers(1, max_prompt)), draw(st.integers(1, max_output)),
                                                     draw(st.sampled_from([0, 0, 1, 3])) * 0.5 * cost.intercept))
    b = draw(st.sampled_from([1, 2]))
    blocks = lambda t: -(-t // b) * b  # noqa: E731
    peak = max(blocks(r.peak_kv) for r in reqs)
    M = draw(st.integers(peak, max(peak, 2 * blocks(I) + b)))
    C = draw(st.integers(1, 2 * max_prompt))
    P = draw(st.integers(1, C))
    return Instance(tuple(reqs), SystemConfig(M, C, P, b), cost)


def lemma_parts(inst: Instance, schedule: Schedule) -> tuple[int, set[int], float]:
    """(processing batches, the members of the exclusive set evicted between their first and
    second token, work) of a valid schedule, replayed."""
    members = set(int(i) for i in exclusive_holders(inst))
    st_ = ReplayState(inst)
    refilled: set[int] = set()
    for bt in schedule.batches:
        refilled.update(i for i in bt.evict if i in members and st_.n[i] == 1)
        st_.apply(bt)
    replay = validate(inst, schedule)  # a batch's start is after any wait: its span is its time
    work = float((replay.batch_end - replay.batch_start).sum()) - inst.cost.intercept * replay.metrics.batches
    return replay.metrics.batches, refilled, work


def check_lemma(inst: Instance, schedule: Schedule) -> None:
    members = exclusive_holders(inst)
    batches, refilled, work = lemma_parts(inst, schedule)
    total = sum(inst.requests[i].output for i in members)
    assert batches >= total - len(refilled), (batches, total, refilled)
    cost = inst.cost
    extra = sum(max(0.0, float(refilled_token_work(inst.requests[i].prompt, 1, cost))
                    - float(token_work(inst.requests[i], cost)[1])) for i in refilled)
    assert work >= (minimum_work(inst) + extra) * (1 - 1e-9) - 1e-12
    event(f"exclusive set of {len(members)}, {len(refilled)} refilled after a first token")
    value = validate(inst, schedule).metrics.total_latency
    held = exclusive_holders_bound(inst)
    if held is not None:
        assert held[0] <= value * (1 + 1e-9) + 1e-12
        assert batches >= held[1] and held[1] >= min_batches(inst)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(inst=identical_instances(), scheduler=st.sampled_from(sorted(SCHEDULERS)))
def test_the_lemma_holds_for_every_heuristic_schedule(inst, scheduler):
    check_lemma(inst, heuristic_schedule(inst, scheduler))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(inst=identical_instances(), data=st.data())
def test_the_lemma_holds_for_random_schedules_with_evictions(inst, data):
    check_lemma(inst, random_schedule(data.draw, inst, allow_evict=True, max_steps=14))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(inst=identical_instances(oracle=True))
def test_the_bound_keeps_the_brute_force_optimum(inst):
    opt = brute_force(inst, "total_latency")
    check_lemma(inst, opt.schedule)
    for b in analytic_bounds(inst, Objective.TOTAL_LATENCY):
        assert b.value <= opt.value * (1 + 1e-9) + 1e-12, (b, opt.value)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(inst=identical_instances(oracle=True))
def test_a_solve_proves_only_the_brute_force_optimum(inst):  # ~3 s an example (a solve and the oracle)
    assume(exclusive_holders_bound(inst) is not None)
    opt = brute_force(inst, "total_latency")
    res = solve(inst, "total_latency", backend="highs", time_limit=5)
    # never a wrong answer: a schedule no better than the optimum, a bound no higher, and where proven, the optimum
    assert res.objective >= opt.value * (1 - 1e-6) - 1e-12
    assert res.lower_bound <= opt.value * (1 + 1e-6) + 1e-12
    if res.status == "optimal":
        assert res.objective == pytest.approx(opt.value, rel=1e-6, abs=1e-12)


def test_two_identical_requests_sharing_a_first_token_batch_need_a_refill():
    # I = 3, O = 2, M = 6: both prefills fit in one batch (3 + 3), but a decode holds 4, so the other
    # must be evicted first: 3 batches and a refill of 4 tokens, or 4 batches without
    cost = COSTS["unit"]
    inst = Instance((Request(3, 2), Request(3, 2)), SystemConfig(6, 8), cost)
    assert list(exclusive_holders(inst)) == [0, 1]
    value, batches, note = exclusive_holders_bound(inst)
    assert batches == 3 and value == 3.0  # unit batches: a refill costs nothing
    assert brute_force(inst, "total_latency").value == 3.0
    paid = Instance(inst.requests, inst.system, COSTS["round"])  # a refill of 4 tokens costs 0.4 + 0.016 more
    opt = brute_force(paid, "total_latency").value
    assert exclusive_holders_bound(paid)[0] == pytest.approx(opt)


def test_no_set_where_two_requests_can_decode_side_by_side():
    inst = Instance((Request(3, 2), Request(3, 2)), SystemConfig(7, 8), COSTS["unit"])  # 4 + 3 <= 7
    assert len(exclusive_holders(inst)) == 0 and exclusive_holders_bound(inst) is None
    one_token = Instance((Request(3, 1), Request(3, 1)), SystemConfig(6, 8), COSTS["unit"])  # nothing held after
    assert exclusive_holders_bound(one_token) is None


@pytest.mark.parametrize("I", [4, 8, 16, 32, 64, 128, 256, 512, 1024])
def test_the_figure_15_family_is_proven_without_a_model(I):
    inst = load_case(ROOT / "cases" / "fig15" / f"fig15_I{I}.toml")
    res = solve(inst, "total_latency", time_limit=10)
    assert res.status == "optimal" and res.skipped.startswith("the best heuristic schedule meets")
    held = exclusive_holders_bound(inst)
    assert held[0] == pytest.approx(res.objective, rel=1e-9)
    # 16 batches without evictions; up to I = 32 two refills after first tokens save two (14 batches)
    assert validate(inst, res.schedule).metrics.batches == (14 if I <= 32 else 16)
