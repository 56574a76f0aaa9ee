"""The brute-force oracle (tests/oracle.py): optima worked by hand, and a cross-check with the validator.

The oracle re-implements the semantics independently of `kvbound.schedule`; every schedule
it returns is replayed by `kvbound.validate`, which must reproduce the oracle's value.
"""
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings

from kvbound import CostModel, Instance, Request, SystemConfig, validate
from kvbound.costs import PRESETS
from kvbound.io.schedules import schedule_from_json
from tests.oracle import OBJECTIVES, brute_force, tiny_instances

UNIT = PRESETS["unit-batches"]


def case(requests, M, C=64, P=None, b=1, cost=UNIT):
    return Instance(tuple(Request(*r) for r in requests), SystemConfig(M, C, P, b), cost)


def replayed(instance, result, objective):
    """The oracle's schedule replayed by the validator; its metric must equal the oracle's value."""
    metrics = validate(instance, result.schedule).metrics
    assert math.isclose(getattr(metrics, objective), result.value, rel_tol=1e-9, abs_tol=1e-12), \
        (objective, getattr(metrics, objective), result.value)
    return metrics


# ------------------------------------------------------------------ optima worked by hand

@pytest.mark.parametrize("prompt", [1, 2, 4])
@pytest.mark.parametrize("output", [1, 2, 3])
def test_one_request_takes_O_batches(prompt, output):
    # one request, no limits in the way: one prefill batch (the first token), then O - 1 decodes;
    # it processes I + O - 1 tokens, and with every batch costing 1 s everything is counted in batches
    inst = case([(prompt, output)], M=prompt + output - 1)
    expected = {"total_latency": output, "mean_latency": output, "mean_ttft": 1}
    for objective in OBJECTIVES:
        res = brute_force(inst, objective)
        assert res.value == expected[objective]
        metrics = replayed(inst, res, objective)
        assert sum(sum(b.tokens.values()) for b in res.schedule.batches) == prompt + output - 1
        assert metrics.batches == output


@pytest.mark.parametrize("P, expected", [(1, 4 + 1), (2, 2 + 1), (3, 2 + 1), (4, 1 + 1)])
def test_prefill_limit_chunks_the_prompt(P, expected):
    # I = 4, O = 2: the prompt needs ceil(4 / P) batches (P caps prefill-type tokens), then one
    # decode (decode-type, not capped by P)
    inst = case([(4, 2)], M=5, C=4, P=P)
    res = brute_force(inst, "total_latency")
    assert res.value == expected
    replayed(inst, res, "total_latency")


def test_linear_cost_worked_by_hand():
    # I = 2, O = 2, T = 1 + 0.5 sum c + 0.125 sum_decode m + 0.25 sum_prefill (c^2 + 2mc)
    #   whole prompt:  1 + 0.5 * 2 + 0.25 * 4            = 3.0, then decode (m = 2): 1 + 0.5 + 0.125 * 2 = 1.75
    #   chunks of 1:   1 + 0.5 + 0.25 * 1 = 1.75, then 1 + 0.5 + 0.25 * (1 + 2 * 1) = 2.25, then decode 1.75
    # so the optimum is 3.0 + 1.75 = 4.75 with the first token at 3.0
    cost = CostModel(intercept=1.0, per_token=0.5, decode_kv=0.125, prefill_attention=0.25)
    inst = case([(2, 2)], M=3, cost=cost)
    for objective, expected in [("total_latency", 4.75), ("mean_latency", 4.75), ("mean_ttft", 3.0)]:
        res = brute_force(inst, objective)
        assert res.value == pytest.approx(expected, rel=1e-12)
        replayed(inst, res, objective)
    assert [b.tokens for b in brute_force(inst).schedule.batches] == [{0: 2}, {0: 1}]


def test_eviction_is_strictly_better_under_tight_memory():
    # two requests I = 1, O = 2 (peak KV 2 each), M = 2, every batch 1 s.
    # With eviction: prefill both (KV 1 + 1), evict 1 and decode 0 (KV 2, 0 finishes),
    # refill 1 (2 tokens, it finishes): 3 batches; latencies 2 and 3.
    # Without: once both hold KV, neither can decode (2 + 1 > M), so they run one after the
    # other: 2 + 2 = 4 batches; latencies 2 and 4.
    inst = case([(1, 2), (1, 2)], M=2)
    best = brute_force(inst, "total_latency")
    assert best.value == 3
    assert replayed(inst, best, "total_latency").evictions == 1
    no_evict = brute_force(inst, "total_latency", allow_evict=False)
    assert no_evict.value == 4
    assert replayed(inst, no_evict, "total_latency").evictions == 0
    assert brute_force(inst, "mean_latency").value == 2.5
    assert brute_force(inst, "mean_latency", allow_evict=False).value == 3.0


def test_waiting_for_an_arrival_is_optimal():
    # request 0 (I = O = 1) at 0 s, requests 1 and 2 at 0.1 s, every batch 1 s.
    # Batch 0 at once: latencies 1, 1.9, 1.9 (sum 4.8). Waiting until 0.1 s and batching all
    # three: 1.1, 1.0, 1.0 (sum 3.1), and nothing does better (1 and 2 need a batch after 0.1 s,
    # and batches run one after another).
    inst = case([(1, 1, 0.0), (1, 1, 0.1), (1, 1, 0.1)], M=3)
    res = brute_force(inst, "mean_latency")
    assert res.value == pytest.approx(3.1 / 3, rel=1e-12)
    replayed(inst, res, "mean_latency")
    assert len(res.schedule.batches) == 1
    assert res.schedule.batches[0].start == pytest.approx(0.1)
    assert res.schedule.batches[0].tokens == {0: 1, 1: 1, 2: 1}
    # the start survives the schedule's JSON form
    again = schedule_from_json(json.loads(json.dumps(res.schedule.to_json())))
    assert validate(inst, again).metrics.mean_latency == pytest.approx(3.1 / 3, rel=1e-12)
    total = brute_force(inst, "total_latency")
    assert total.value == pytest.approx(1.1)
    replayed(inst, total, "total_latency")


def test_waiting_helps_total_latency_but_not_when_it_costs_a_batch():
    # 0 at 0 s and 1 at 0.5 s (I = O = 1): batching both after waiting ends at 1.5 s,
    # not waiting ends at 2 s
    inst = case([(1, 1, 0.0), (1, 1, 0.5)], M=2)
    res = brute_force(inst, "total_latency")
    assert res.value == pytest.approx(1.5)
    replayed(inst, res, "total_latency")
    # with room for one request at a time, waiting gains nothing: 0 at [0, 1], 1 at [1, 2]
    tight = case([(1, 1, 0.0), (1, 1, 0.5)], M=1)
    res = brute_force(tight, "total_latency")
    assert res.value == pytest.approx(2.0)
    replayed(tight, res, "total_latency")


def test_mean_ttft_one_prompt_per_batch():
    # two prompts of 2 tokens, C = 2: a batch completes at most one prompt, so first tokens
    # come at 1 s and 2 s at best (mean 1.5); the schedule must still finish both requests
    inst = case([(2, 3), (2, 3)], M=8, C=2)
    res = brute_force(inst, "mean_ttft")
    assert res.value == 1.5
    replayed(inst, res, "mean_ttft")


def test_max_batch_size():
    inst = case([(1, 1), (1, 1)], M=2)
    assert brute_force(inst, "total_latency").value == 1
    res = brute_force(inst, "total_latency", max_batch_size=1)
    assert res.value == 2
    assert all(len(b.tokens) <= 1 for b in res.schedule.batches)
    replayed(inst, res, "total_latency")


def test_block_rounding_limits_memory():
    # I = 1, O = 2 twice (each holds 1 token after its prefill, 2 during its decode).
    # b = 1, M = 3: prefill both (KV 2), decode 0 (2 + 1), decode 1: 3 batches.
    # b = 2, M = 3: one cached token costs a whole block of 2, so two requests never hold KV at
    # once (2 + 2 > 3): one after the other, 4 batches.  b = 2, M = 4: both at once, 2 batches.
    for b, M, expected in [(1, 3, 3), (2, 3, 4), (2, 4, 2)]:
        inst = case([(1, 2), (1, 2)], M=M, b=b)
        res = brute_force(inst)
        assert res.value == expected, (b, M)
        replayed(inst, res, "total_latency")


def test_unknown_objective():
    with pytest.raises(ValueError):
        brute_force(case([(1, 1)], M=1), "p99_latency")


# ------------------------------------------------------------------ cross-checks

FAST = settings(max_examples=40, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@FAST
@given(tiny_instances())
def test_oracle_and_validator_agree(inst):
    """Two independent implementations of the semantics: the validator reproduces every optimum."""
    results = {}
    for objective in OBJECTIVES:
        best = brute_force(inst, objective)
        replayed(inst, best, objective)
        no_evict = brute_force(inst, objective, allow_evict=False)
        assert replayed(inst, no_evict, objective).evictions == 0
        assert best.value <= no_evict.value * (1 + 1e-12)
        results[objective] = best
    # each optimal schedule is feasible for the other objectives too: none of them beats an optimum
    for objective, best in results.items():
        for other in results.values():
            value = getattr(validate(inst, other.schedule).metrics, objective)
            assert best.value <= value * (1 + 1e-12) + 1e-12


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_instances(max_requests=3, max_prompt=3, max_output=2))
def test_max_batch_size_one_is_never_better(inst):
    for objective in OBJECTIVES:
        free = brute_force(inst, objective)
        single = brute_force(inst, objective, max_batch_size=1)
        replayed(inst, single, objective)
        assert all(len(b.tokens) <= 1 for b in single.schedule.batches)
        assert free.value <= single.value * (1 + 1e-12)


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_instances(max_requests=2, max_prompt=3, max_output=2, costs=("unit-batches", "all-terms")))
def test_pruned_search_equals_plain_search(inst):
    """The A* bound and the dominance pruning change nothing: plain uniform-cost search agrees."""
    for objective in OBJECTIVES:
        fast = brute_force(inst, objective)
        plain = brute_force(inst, objective, heuristic=False, dominance=False)
        replayed(inst, plain, objective)
        assert math.isclose(fast.value, plain.value, rel_tol=1e-9, abs_tol=1e-12)
