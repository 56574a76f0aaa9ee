"""The block bound (issue 33, item 2): blocks of requests priced together, pairs across blocks.

* Never above the brute-force optimum, for mean latency and mean TTFT, with arrivals, block
  rounding, tight M and evictions: with random blocks each priced exactly (the oracle on the block
  alone at 0) or below that, with their completion-order bounds (the due-date value), under the
  LP's weights and under random feasible weights; the due-date value alone is below each block's
  least sum under its own arrivals.
* One block of every request, all at 0 and priced exactly: the bound is the optimum.
* Without blocks it is the pairwise bound (`analytic.pairwise_work_waits`) exactly.
* The default pricing (analytic, Lagrangian, completion master) is never above the block's optimum,
  and the restricted schedule it starts from is valid (the validator replays it).
* `kvbound bound` and the solve's ledger list it by name on an instance large enough for blocks,
  certified and below every validated schedule; in a solve each rise is certified as it comes.
"""
from __future__ import annotations

import importlib.util
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbound import CostModel, Instance, Request, SystemConfig, validate
from kvbound.bounds.analytic import completion_order_bounds, pairwise_work_waits
from kvbound.bounds.blocks import (NAME, BlockFamily, SearchBlocks, at_zero, block_bound, candidate_blocks,
                                   due_date_value, price_block, restricted)
from kvbound.alone import time_alone
from kvbound.deadline import Deadline
from kvbound.objective import Objective
from kvbound.schedulers import run_scheduler
from kvbound.schedulers.serial import serial_schedule
from kvbound.solvers import lower_bounds, solve
from kvbound.solvers.options import SolveOptions
from tests.oracle import brute_force
from tests.test_formulation import instances

MEAN = (Objective.MEAN_LATENCY, Objective.MEAN_TTFT)
TOL = 1e-9


def exact_sum(inst: Instance, members, objective: Objective) -> float:
    """The least sum of latencies (first-token times) of `members` alone, every arrival at 0."""
    sub = at_zero(inst, members)
    return len(sub) * brute_force(sub, objective.value).value


@st.composite
def families(draw, max_requests=4):
    inst = draw(instances(min_requests=2, max_requests=max_requests, max_prompt=3, max_output=3))
    n = len(inst)
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        size = draw(st.integers(2, n))
        blocks.append(tuple(sorted(draw(st.permutations(range(n)))[:size])))
    below = [draw(st.sampled_from((1.0, 1.0, 0.9, 0.5))) for _ in blocks]  # a bound below the optimum is a bound
    return inst, blocks, below


@settings(max_examples=60, deadline=None)
@given(drawn=families(), objective=st.sampled_from(MEAN), seed=st.integers(0, 2 ** 16))
def test_block_bound_never_exceeds_the_brute_force_optimum(drawn, objective, seed):
    inst, blocks, below = drawn
    opt = brute_force(inst, objective.value).value
    family = BlockFamily(inst, objective)
    assert family.value <= opt * (1 + TOL) + 1e-12  # no blocks: the pairwise bound
    for members, share in zip(blocks, below):
        sub = at_zero(inst, members)
        family.add(members, share * exact_sum(inst, members, objective), completions=completion_order_bounds(sub, objective))
        assert family.value <= opt * (1 + TOL) + 1e-12
    # any weights with every request's weights adding up to at most 1 give a bound
    rng = np.random.default_rng(seed)
    for _ in range(3):
        y = rng.uniform(0.0, 1.0, len(family.blocks))
        load = np.zeros(len(inst))
        for (m, _, _), w in zip(family.blocks, y):
            load[list(m)] += w
        family.weights = y / max(1.0, float(load.max()))
        assert family.value <= opt * (1 + TOL) + 1e-12


@settings(max_examples=40, deadline=None)
@given(inst=instances(min_requests=2, max_requests=4, max_prompt=3, max_output=3, arrivals=True),
       objective=st.sampled_from(MEAN))
def test_due_date_value_never_exceeds_the_block_optimum_under_its_arrivals(inst, objective):
    # the whole instance as the block: V_S bounds its own optimum (the map removes nothing)
    a = inst.arrivals
    value = due_date_value(completion_order_bounds(at_zero(inst, range(len(inst))), objective),
                           time_alone(inst, objective), a - a.min())
    assert value / len(inst) <= brute_force(inst, objective.value).value * (1 + TOL) + 1e-12


@settings(max_examples=40, deadline=None)
@given(inst=instances(min_requests=1, max_requests=4, max_prompt=3, max_output=3, arrivals=False),
       objective=st.sampled_from(MEAN))
def test_one_block_of_every_request_priced_exactly_is_the_optimum(inst, objective):
    opt = brute_force(inst, objective.value).value
    family = BlockFamily(inst, objective)
    family.add(range(len(inst)), exact_sum(inst, range(len(inst)), objective))
    assert math.isclose(family.value, opt, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(inst=instances(min_requests=1, max_requests=6, max_prompt=6, max_output=5), objective=st.sampled_from(MEAN))
def test_without_blocks_it_is_the_pairwise_bound(inst, objective):
    family = BlockFamily(inst, objective)
    pairwise = float(time_alone(inst, objective).sum() + pairwise_work_waits(inst, objective)) / len(inst)
    assert math.isclose(family.value, pairwise, rel_tol=1e-12, abs_tol=1e-15)
    assert np.allclose(family.pairs, family.pairs.T) and (family.pairs >= 0).all() and (family.extra >= 0).all()


@settings(max_examples=40, deadline=None)
@given(inst=instances(min_requests=2, max_requests=4, max_prompt=3, max_output=3), objective=st.sampled_from(MEAN),
       data=st.data())
def test_default_pricing_never_exceeds_the_block_optimum(inst, objective, data):
    members = tuple(sorted(data.draw(st.permutations(range(len(inst))))[:data.draw(st.integers(1, len(inst)))]))
    sub = at_zero(inst, members)
    schedule = serial_schedule(inst, None, chunked=True)
    block_schedule = restricted(schedule, members, sub)
    validate(sub, block_schedule)  # raises if the restriction were not a valid schedule of the block
    priced = price_block(sub, objective, Deadline(2.0), block_schedule)
    assert priced <= exact_sum(inst, members, objective) * (1 + TOL) + 1e-12


def test_block_bound_is_anytime_and_below_a_schedule():
    """A partial family is a bound: the bound after each block rises and stays below a validated
    schedule; every candidate block's arrival spread is at most its requests' time alone."""
    cost = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125)
    reqs = tuple(Request(1 + i % 3, 2 + i % 4, float(i // 4)) for i in range(14))
    inst = Instance(reqs, SystemConfig(12, 8, 8, 1), cost)
    objective = Objective.MEAN_LATENCY
    schedule = run_scheduler(inst, "vllm").schedule
    best = objective.of(validate(inst, schedule).metrics)
    seen = []
    value, family = block_bound(inst, objective, Deadline(20.0), schedule, on_value=seen.append)
    assert seen == sorted(seen) and (not seen or seen[-1] == value)
    assert family.base / len(inst) <= value <= best * (1 + TOL)
    own = time_alone(inst, objective)
    for members in candidate_blocks(inst, objective):
        a = inst.arrivals[list(members)]
        assert (a - a.min()).sum() <= own[list(members)].sum()


def test_listed_beside_the_other_bounds():
    cost = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125)
    reqs = tuple(Request(1 + i % 3, 2 + i % 3, 0.0) for i in range(12))
    inst = Instance(reqs, SystemConfig(14, 8, 8, 1), cost)
    bounds, result = lower_bounds(inst, SolveOptions("mean_latency", formulation="search", time_limit=8.0))
    rows = {b.name: b for b in bounds}
    assert NAME in rows, list(rows)
    row = rows[NAME]
    assert row.certified and row.found and row.value <= result.objective * (1 + TOL)
    assert "blocks priced" in row.note
    assert result.lower_bound >= row.value * (1 - TOL)


def test_each_rise_is_certified_as_it_comes():
    """In a solve the method hands every rise to the ledger at once (anytime), the last one being
    the bound it returns; in a solve with arrivals the row is there, below the best schedule."""
    cost = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125)
    reqs = tuple(Request(1 + i % 3, 2 + i % 4, float(i // 4)) for i in range(14))
    inst = Instance(reqs, SystemConfig(12, 8, 8, 1), cost)
    objective = Objective.MEAN_LATENCY
    schedule = run_scheduler(inst, "vllm").schedule

    class Known:
        instance, constraints, options = inst, None, SolveOptions("mean_latency")
        best_schedule = schedule
        certified: list = []

        def __init__(self):
            self.objective = objective

        def certify(self, bound):
            self.certified.append(bound.value)
            return bound

    known = Known()
    method = SearchBlocks()
    assert method.skip_reason(known) is None
    (row,) = method.compute(known, Deadline(10.0))
    assert len(known.certified) >= 2 and known.certified == sorted(known.certified)
    assert known.certified[-1] == row.value and row.name == NAME and row.certified
    result = solve(inst, "mean_latency", formulation="search", time_limit=6.0)
    rows = {b.name: b for b in result.bounds}
    assert NAME in rows and rows[NAME].value <= result.objective * (1 + TOL)
    assert result.lower_bound >= rows[NAME].value * (1 - TOL)


def test_blocks_priced_here_on_every_core_and_on_ray_give_one_bound(monkeypatch):
    """The blocks are independent units: priced in this process, on a pool of 2 and on a local Ray of 2
    workers (with a pass budget, so that no value depends on the machine's speed), the bound is the
    same, and so is each block's value; the analytic first pricing is chunked across the workers too."""
    import pytest

    from kvbound.bounds import blocks as blocks_module
    from kvbound.units import UnitRunner

    cost = CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125)
    reqs = tuple(Request(1 + i % 3, 2 + i % 4, float(i // 4)) for i in range(14))
    inst = Instance(reqs, SystemConfig(12, 8, 8, 1), cost)
    objective = Objective.MEAN_LATENCY
    schedule = run_scheduler(inst, "vllm").schedule
    monkeypatch.setattr(blocks_module, "POOL_FROM", 4)  # the chunked analytic pricing, on few blocks
    monkeypatch.setattr(blocks_module, "CHUNK", 5)  # in more chunks than workers
    runners = [UnitRunner(workers=1), UnitRunner(workers=2)]
    if importlib.util.find_spec("ray") is not None:
        runners.append(UnitRunner("ray", 2))
    results = [block_bound(inst, objective, Deadline(None), schedule, runner=r, passes=3) for r in runners]
    value, family = results[0]
    assert family.base / len(inst) < value <= objective.of(validate(inst, schedule).metrics) * (1 + TOL)
    for other, other_family in results[1:]:
        assert other == pytest.approx(value, rel=1e-12)
        assert [(m, pytest.approx(v, rel=1e-12)) for m, v, _ in other_family.blocks] == \
            [(m, v) for m, v, _ in family.blocks]
