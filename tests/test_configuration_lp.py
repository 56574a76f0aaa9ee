"""The configuration (Gilmore-Gomory) LP's batch bound (kvbound.solvers.configuration_lp): its LP value
on cases worked by hand, never above an oracle optimum or a validated schedule's batch count, at least
the KV area and every dual-feasible bound, and in the search's and `kvbound bound`'s answers."""
from __future__ import annotations

import math
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings

from kvbound import CostModel, Instance, Request, SystemConfig, validate
from kvbound.deadline import Deadline
from kvbound.bounds.kv_items import dff_batches, kv_items, kv_room, min_batches, ramp_capacities
from kvbound.alone import minimum_work
from kvbound.objective import OBJECTIVES, Objective
from kvbound.schedulers import FAST_HEURISTICS, run_scheduler
from kvbound.solvers import lower_bounds, solve
from kvbound.bounds import configuration_lp
from kvbound.bounds.configuration_lp import configuration_batches
from kvbound.solvers.options import SolveOptions
from tests.oracle import brute_force, tiny_instances
from tests.test_lagrangian import conv_like

UNIT = CostModel(intercept=1.0)


def items_instance(prompts, M, b=1) -> Instance:
    """One output token each: the KV items are the (block-rounded) prompts."""
    return Instance(tuple(Request(p, 1) for p in prompts), SystemConfig(M, 64, 64, b), UNIT)


@pytest.mark.parametrize("prompts, M, b, lp, batches", [
    ((4, 4, 4), 10, 1, 1.5, 2),            # two fit together: 3 / 2
    ((4,) * 5, 10, 1, 2.5, 3),
    ((6, 5, 5, 4, 4, 3, 3), 10, 1, 3.0, 3),  # {6 4} {5 5} {4 3 3}: the area (3.0) is met
    ((5, 4, 4), 12, 2, 1.5, 2),            # blocks of 2: 6, 4, 4 against 12
])
def test_the_lp_value_on_cases_worked_by_hand(prompts, M, b, lp, batches):
    out = configuration_batches(items_instance(prompts, M, b), Deadline(30))
    assert out.lp == pytest.approx(lp, abs=1e-9)
    assert out.batches == batches


def test_it_counts_batches_the_area_and_the_dual_feasible_functions_miss():
    # no two of 8, 8 and 5 fit in 12: three batches; the area says 21 / 12 -> 2, and the dual-feasible
    # functions weigh the 5 (5 / 12 of M) at most 1/2
    inst = items_instance((8, 8, 5), 12)
    out = configuration_batches(inst, Deadline(30))
    assert out.lp == pytest.approx(3.0) and out.batches == 3
    assert min_batches(inst) == 2
    assert out.batches <= min(len(run_scheduler(inst, s).schedule.batches) for s in FAST_HEURISTICS)


def test_a_huge_kv_capacity_is_priced_in_coarser_units_with_the_same_answer():
    # M = 10^7 tokens in blocks of 1: the knapsack table would have 6 x 10^7 cells, so sizes go in
    # units of 4 blocks, rounded down (a relaxation); no two of the 6e6 items share a batch, and
    # each 5e6 one pairs with a 4.5e6 one: 4 batches either way (C = M: no prefill ramp)
    inst = Instance(tuple(Request(p, 2) for p in (6_000_000, 5_000_000, 4_500_000)),
                    SystemConfig(10_000_000, 10_000_000, 10_000_000, 1), UNIT)
    out = configuration_batches(inst, Deadline(30))
    assert out.unit == 4 and out.lp == pytest.approx(4.0) and out.batches == 4


@settings(max_examples=150, deadline=None)
@given(instance=tiny_instances(arrivals=None))
def test_the_bound_is_never_above_the_oracle_optimum(instance):
    # total latency >= batches x intercept + minimum work, with arrivals, evictions and block sizes
    out = configuration_batches(instance, Deadline(30))
    opt = brute_force(instance, "total_latency")
    assert out.batches * instance.cost.intercept + minimum_work(instance) <= opt.value * (1 + 1e-9)
    assert out.batches <= len(validate(instance, opt.schedule).batch_kv)
    # and it is at least the KV area (block-rounded) and every dual-feasible function's count
    items, _ = kv_items(instance)
    assert out.batches >= dff_batches(instance)
    assert out.batches >= math.ceil(items.sum() / kv_room(instance.system) - 1e-9)
    # in coarse units (a relaxation: sizes and M rounded down) the LP is weaker, and the bound holds
    # (with the prefill ramp its count depends on the duals it meets, so it may come out higher)
    with patch.object(configuration_lp, "KNAPSACK_CELLS", 8):
        coarse = configuration_batches(instance, Deadline(30))
    assert coarse.lp <= out.lp * (1 + 1e-9)
    assert coarse.batches * instance.cost.intercept + minimum_work(instance) <= opt.value * (1 + 1e-9)
    assert coarse.batches <= len(validate(instance, opt.schedule).batch_kv)


def test_a_run_cut_short_still_gives_a_bound_below_the_converged_one():
    inst = conv_like(30)
    full = configuration_batches(inst, Deadline(30))
    assert full.lp is not None
    cut = configuration_batches(inst, Deadline(0))
    assert cut.lp is None and cut.columns == len(np.unique(kv_items(inst)[0]))  # no column priced
    assert 0 <= cut.batches <= full.batches
    for name in FAST_HEURISTICS:  # and neither is above any schedule's batch count
        assert full.batches <= len(run_scheduler(inst, name).schedule.batches)


def test_the_search_reports_it_for_total_latency_and_bound_lists_it():
    inst = conv_like(30)
    res = solve(inst, "total_latency", time_limit=4.0, formulation="lagrangian")
    config = res.stats["configuration_lp"]
    assert config["bound"] == pytest.approx(config["batches"] * inst.cost.intercept + minimum_work(inst))
    assert res.bound_certified and res.lower_bound >= config["bound"] * (1 - 1e-12)
    assert res.lower_bound <= res.objective * (1 + 1e-9)
    if config["lp"] is not None:  # converged (it is cut where the machine is slow): the area's and DFFs' count
        assert config["batches"] >= dff_batches(inst)
    # `kvbound bound` lists it (its count depends on the duals the column generation meets, so another
    # run may end a batch apart; never above a schedule), and the result's bounds are the same rows
    bounds, again = lower_bounds(inst, SolveOptions("total_latency", time_limit=4.0, formulation="lagrangian"))
    listed = [b for b in bounds if b.name.startswith("batches (configuration LP")]
    assert len(listed) == 1 and listed[0].certified
    assert -math.inf < listed[0].value <= min(res.objective, again.objective) * (1 + 1e-12)
    assert listed[0].value == again.stats["configuration_lp"]["bound"]
    assert [b.name for b in res.bounds if b.name.startswith("batches (configuration LP")] == [listed[0].name]


@pytest.mark.parametrize("objective", [o for o in OBJECTIVES if o != "total_latency"])
def test_the_mean_objectives_do_not_compute_it(objective):
    res = solve(conv_like(), objective, time_limit=2.0, formulation="lagrangian")
    assert "configuration_lp" not in res.stats


# ------------------------------------------------------------------------------ the prefill's items

def test_the_batches_of_a_prefill_hold_kv_items_too():
    # 10 tokens prefilled at most 4 a batch (blocks of 2): before the batch generating its first token
    # (10 held) its prefill batches held at least 6 and 2; a 3-token prompt needs no earlier batch
    inst = Instance((Request(10, 3), Request(3, 2)), SystemConfig(64, 4, 4, 2), UNIT)
    items, owner = kv_items(inst)
    assert sorted(items[owner == 0]) == [2, 6, 10, 12, 12] and sorted(items[owner == 1]) == [4, 4]
    first, first_owner = kv_items(inst, Objective.MEAN_TTFT)
    assert sorted(first[first_owner == 0]) == [2, 6, 10]
    # two 3-token prompts at most 2 a batch, M = 4, C = 3: without these items every count says 3
    # batches; with them 4, the brute-force optimum
    inst = Instance((Request(3, 1), Request(3, 2)), SystemConfig(4, 3, 2, 1), UNIT)
    assert min_batches(inst) == 4
    opt = brute_force(inst, "total_latency")
    assert validate(inst, opt.schedule).metrics.batches == 4
    assert configuration_batches(inst, Deadline(30)).batches <= 4


# ------------------------------------------------------------------------------ the prefill ramp

def test_ramp_capacities_on_a_case_worked_by_hand():
    # C = P = 4, blocks of 2, prompts 3 and 5, M = 16: after t batches at most 4t tokens are cached;
    # the smallest items are 3 and 1 (the 5-token prompt's batch before its last holds 5 - 4), which
    # fit in 4 together: both requests may hold an item from the first batch on (+1 of rounding each)
    inst = Instance((Request(3, 4), Request(5, 4)), SystemConfig(16, 4, 4, 2), UNIT)
    assert list(ramp_capacities(inst)) == [6, 10, 14, 16]
    # prompts 3 and 4: the smallest items are 3 and 4, only one fits in 4
    inst = Instance((Request(3, 4), Request(4, 4)), SystemConfig(16, 4, 4, 2), UNIT)
    assert list(ramp_capacities(inst)) == [5, 10, 14, 16]
    assert list(ramp_capacities(items_instance((3, 5), 16, 2))) == [16]  # C = 64: full from the first batch


def test_the_ramp_counts_a_batch_the_area_tokens_and_dual_feasible_functions_miss():
    # three requests of 4 + 5 tokens, M = 20, C = P = 4: the area needs 5 batches, the tokens 6, but the
    # first batches hold at most 4, 8, 12 and 16 tokens of KV, so 7; the brute-force optimum has 8
    inst = Instance(tuple(Request(4, 5) for _ in range(3)), SystemConfig(20, 4, 4, 1), UNIT)
    items, _ = kv_items(inst)
    assert math.ceil(items.sum() / 20) == 5 and dff_batches(inst) <= 6
    assert min_batches(inst) == 7
    out = configuration_batches(inst, Deadline(30))
    assert out.lp <= 6 and out.batches >= 7  # the LP alone (bins of M) says 6
    opt = brute_force(inst, "total_latency")
    assert max(out.batches, min_batches(inst)) <= validate(inst, opt.schedule).metrics.batches  # measured: 8
    assert 7 * inst.cost.intercept + minimum_work(inst) <= opt.value * (1 + 1e-9)


def test_the_ramp_raises_the_batch_bound_where_m_holds_many_prompts(shared_data):
    from tests.test_packing import loose_conversation

    inst = loose_conversation(300)  # M = 100,000 takes ~49 batches of C = 2,048 to fill
    items, _ = kv_items(inst)
    area = math.ceil(items.sum() / kv_room(inst.system) - 1e-9)
    assert min_batches(inst) >= area + 20  # measured: 853 -> 876
    out = configuration_batches(inst, Deadline(60))
    assert out.batches >= area + 20
    for name in ("sjf-mc", "sarathi-pc-mc"):  # and neither is above a schedule's batch count
        assert max(out.batches, min_batches(inst)) <= validate(inst, run_scheduler(inst, name).schedule).metrics.batches
