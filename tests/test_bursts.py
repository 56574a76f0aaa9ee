"""Burst schedules (issue 33, item 4): the builder (`kvbound.schedulers.bursts`) and its search phase
(`kvbound.solvers.phases.bursts`).

* every schedule the builder returns passes the validator, meets the constraints it was given and is
  never below the brute-force optimum (tests/oracle.py) of its objective: a schedule cannot beat the
  optimum, so a value below the oracle's is a bug;
* without constraints the builder always finishes (first-tokens mode and peak reservation);
* the phase offers only validated schedules, its best never below the oracle's optimum;
* regression on the ground-truth set (bench/results/ground_truth.json): where today's search route
  was 9-17% above the exact optimum, the burst schedules are within 2% of it.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbound import load_case, validate
from kvbound.constraints import Constraints
from kvbound.deadline import Deadline
from kvbound.objective import Objective
from kvbound.schedulers.bursts import BurstParams, build_burst
from kvbound.solvers import solve
from kvbound.solvers.ledger import Ledger
from kvbound.solvers.options import SolveOptions
from kvbound.solvers.phases.bursts import Bursts
from tests.oracle import brute_force
from tests.test_formulation import instances

ROOT = Path(__file__).resolve().parents[1]
REL = 1e-9
MEAN = ("mean_latency", "mean_ttft")

params_st = st.builds(BurstParams, first_tokens=st.booleans(), group=st.sampled_from([None, 1, 2]),
                      wait=st.sampled_from([0.0, 0.5, 2.0]), refill=st.booleans(), fill=st.booleans(),
                      reserve=st.booleans(), shortest_left=st.booleans())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_requests=3), params=params_st, objective=st.sampled_from(MEAN),
       seed=st.integers(0, 2**16), no_evict=st.booleans(), no_chunk=st.booleans(), cap=st.sampled_from([None, 1, 2]))
def test_burst_schedules_are_valid_meet_constraints_and_never_beat_the_oracle(inst, params, objective, seed, no_evict,
                                                                              no_chunk, cap):
    cons = Constraints(no_evict=no_evict, no_chunk=no_chunk, max_batch_size=cap)
    keys = np.array(random.Random(seed).sample(range(len(inst)), len(inst)), dtype=float)
    schedule = build_burst(inst, keys, params, cons)
    if schedule is None:
        assert not (params.first_tokens or params.reserve) or no_evict or no_chunk or cap, \
            "without constraints the first-tokens mode and peak reservation always finish"
        return
    metrics = validate(inst, schedule).metrics  # raises on any broken rule
    assert cons.admit(inst, schedule)
    oracle = brute_force(inst, objective, allow_evict=not no_evict, max_batch_size=cap)
    value = Objective(objective).of(metrics)
    assert value >= oracle.value * (1 - REL) - 1e-12, (value, oracle.value, params)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_requests=4, arrivals=False), no_evict=st.booleans(), no_chunk=st.booleans(),
       cap=st.sampled_from([None, 1, 2]))
def test_the_ttft_bounds_groups_make_valid_schedules_between_the_bound_and_the_oracle(inst, no_evict, no_chunk, cap):
    from kvbound.bounds.analytic import first_prefill_batches, first_prefill_groups
    from kvbound.schedulers.bursts import build_prefill_groups

    cons = Constraints(no_evict=no_evict, no_chunk=no_chunk, max_batch_size=cap)
    _, groups = first_prefill_groups(inst)
    assert sorted(i for g in groups for i in g) == list(range(len(inst)))
    schedule = build_prefill_groups(inst, groups, cons)
    if schedule is None:
        assert no_evict or no_chunk, "without those constraints the groups always make a schedule"
        return
    ttft = validate(inst, schedule).metrics.mean_ttft  # raises on any broken rule
    assert cons.admit(inst, schedule)
    oracle = brute_force(inst, Objective.MEAN_TTFT, allow_evict=not no_evict, max_batch_size=cap)
    assert ttft >= oracle.value * (1 - REL) - 1e-12
    assert first_prefill_batches(inst) <= oracle.value * (1 + REL) + 1e-12


def test_a_group_whose_prompts_overfill_m_together_is_split_across_batches():
    # found by hypothesis in CI: M = 2 and the bound's second group, prompts 1 and 2 (C = P = 3 holds
    # both, M does not): the prompt of 2 waits for the next batch instead of no schedule at all
    from kvbound import CostModel, Instance, Request, SystemConfig
    from kvbound.bounds.analytic import first_prefill_groups
    from kvbound.schedulers.bursts import build_prefill_groups

    inst = Instance((Request(1, 1), Request(1, 1), Request(1, 1), Request(2, 1)), SystemConfig(2, 3, 3, 1),
                    CostModel(intercept=1.0, per_token=0.1, decode_kv=0.01, prefill_attention=0.001))
    _, groups = first_prefill_groups(inst)
    assert groups == [[0, 1], [2, 3]]
    schedule = build_prefill_groups(inst, groups)
    assert schedule is not None and [dict(b.tokens) for b in schedule.batches] == [{0: 1, 1: 1}, {2: 1}, {3: 2}]
    assert validate(inst, schedule).metrics.mean_ttft >= brute_force(inst, Objective.MEAN_TTFT).value * (1 - REL)


def test_where_every_group_fits_one_batch_the_groups_schedule_is_optimal():
    # prompts 4, 1, 2 at 0 (outputs 2, 3, 2), M = 7, C = P = 4: the bound's groups {1, 2} then {4} each
    # fit one batch (the first group's KV, 3 tokens, beside the second's 4), so the schedule meets the
    # bound: 7.25 / 3 s, the brute-force optimum
    from kvbound import CostModel, Instance, Request, SystemConfig
    from kvbound.bounds.analytic import first_prefill_batches, first_prefill_groups
    from kvbound.schedulers.bursts import build_prefill_groups

    inst = Instance((Request(4, 2), Request(1, 3), Request(2, 2)), SystemConfig(7, 4, 4, 1),
                    CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125))
    value, groups = first_prefill_groups(inst)
    assert groups == [[1, 2], [0]] and value == pytest.approx(7.25)
    ttft = validate(inst, build_prefill_groups(inst, groups)).metrics.mean_ttft
    assert ttft == pytest.approx(first_prefill_batches(inst)) == pytest.approx(brute_force(inst, Objective.MEAN_TTFT).value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_requests=3), objective=st.sampled_from(MEAN))
def test_the_phase_offers_validated_schedules_never_below_the_oracle(inst, objective):
    options = SolveOptions(objective, formulation="search", time_limit=0.5)
    ledger = Ledger(inst, options, Deadline(0.5))
    phase = Bursts()
    assert phase.applies(ledger)
    phase.run(ledger)
    phase.moves(ledger, 8)
    assert ledger.best is not None  # the first-tokens / peak-reservation starts always finish
    value = Objective(objective).of(validate(inst, ledger.best.schedule).metrics)
    assert value == pytest.approx(ledger.best.value, rel=1e-12)
    assert value >= brute_force(inst, objective).value * (1 - REL) - 1e-12


def test_the_phase_steps_aside_where_it_does_not_apply():
    inst = load_case(ROOT / "cases" / "ground_truth" / "gt_code_r0_n8_s200_tight_arr.toml")
    for options in (SolveOptions("total_latency"), SolveOptions("mean_latency", constraints=Constraints(no_hybrid=True)),
                    SolveOptions("mean_ttft", constraints=Constraints(admission_order=tuple(range(len(inst)))))):
        assert not Bursts().applies(Ledger(inst, options, Deadline(1.0)))


# ----------------------------------------------------------------------------- the ground-truth set

def _optimum(name: str, objective: str) -> float:
    data = json.loads((ROOT / "bench" / "results" / "ground_truth.json").read_text(encoding="utf-8"))
    o = data["cases"][name]["objectives"][objective]
    assert o["proven"]
    return o["optimum"]


@pytest.mark.parametrize("name,objective,params,before", [
    # today's search route (bench/results/ground_truth.md before issue 33 item 4): 109.29%, 115.11% and 116.37%
    ("gt_conv_r0_n8_s40_loose_t0", "mean_ttft", BurstParams(first_tokens=True), 1.0929),
    ("gt_code_r0_n8_s200_tight_arr", "mean_latency", BurstParams(wait=0.5), 1.1511),
    ("gt_conv_r0_n8_s40_tight_t0", "mean_ttft", BurstParams(first_tokens=True), 1.1637),
])
def test_burst_schedules_close_the_ground_truth_schedule_gap(name, objective, params, before):
    """Prompt-shortest-first burst schedules are within 2% of the proven optimum where the search route
    was 9-16% above it."""
    inst = load_case(ROOT / "cases" / "ground_truth" / f"{name}.toml")
    opt = _optimum(name, objective)
    keys = inst.prompts.astype(float) + 1e-9 * np.arange(len(inst))
    schedule = build_burst(inst, keys, params)
    value = Objective(objective).of(validate(inst, schedule).metrics)
    assert opt * (1 - 1e-9) <= value <= 1.02 * opt < before * opt, (value / opt, before)


def test_the_search_route_reaches_the_optimum_on_a_ground_truth_case():
    """The search route with the bursts phase: within 2% of the proven optimum in 3 s (today's route, 20 s: 116.68%)."""
    name, objective = "gt_arxiv_r100_n10_s200_tight_t0", "mean_ttft"
    inst = load_case(ROOT / "cases" / "ground_truth" / f"{name}.toml")
    opt = _optimum(name, objective)
    res = solve(inst, objective, "highs", 3.0, formulation="search")
    value = Objective(objective).of(validate(inst, res.schedule).metrics)
    assert value == res.objective
    assert opt * (1 - 1e-9) <= value <= 1.02 * opt, value / opt


def test_the_model_route_starts_from_burst_schedules():
    """The auto route (a model on 10 requests) with burst seeds before the model: within 2% of the proven
    optimum in 6 s, where the chain MIP alone ended at 116.68% after 20 s; its answer is validated."""
    name, objective = "gt_arxiv_r100_n10_s200_tight_t0", "mean_ttft"
    inst = load_case(ROOT / "cases" / "ground_truth" / f"{name}.toml")
    opt = _optimum(name, objective)
    res = solve(inst, objective, "auto", 6.0)
    assert res.formulation == "chain" and res.stats["warm_start"].startswith("burst")
    value = Objective(objective).of(validate(inst, res.schedule).metrics)
    assert value == pytest.approx(res.objective, rel=1e-12)
    assert opt * (1 - 1e-9) <= value <= 1.02 * opt, value / opt
