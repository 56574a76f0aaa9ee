"""The batch-accounting primitive (kvbound/accounting.py) against the validator and docs/semantics.md.

* on schedules of every scheduler and on random schedules with evictions and chunks, each
  batch's `account_batch` (from the state before it) gives the features the validator's replay
  records, the time it took, the KV it held, and the features a direct transcription of
  docs/semantics.md section 6 gives; `largest_batch_time` is above every batch's time;
* the decode-type rule and block rounding on hand-made cases;
* the validator's fast path: the first broken rule is still the one named, and a rejected
  batch leaves the state as it was.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbound import SCHEDULERS, Batch, CostModel, Instance, Request, ScheduleError, SystemConfig, validate
from kvbound.accounting import (BatchAccount, account_batch, block_count, is_decode_type, largest_batch_time,
                                round_to_blocks)
from kvbound.errors import SchedulerRefused, SchedulerStuck
from kvbound.schedule import ReplayState, Schedule
from kvbound.schedulers import run_scheduler
from tests.test_formulation import instances, random_schedule
from tests.test_schedulers import small_instances

SETTINGS = settings(max_examples=60, deadline=None, database=None)


def semantics_features(batch: Batch, m: list[int], n: list[int], prompt: list[int]) -> list[float]:
    """docs/semantics.md section 6 written out directly (the test's own oracle)."""
    f = [0.0] * 6
    for i, c in batch.tokens.items():
        mi = 0 if i in batch.evict else m[i]
        f[0] = 1.0
        f[1] += c
        if n[i] >= 1 and prompt[i] + n[i] - mi == 1:
            f[2] += mi
        else:
            f[3] += c * c + 2 * mi * c
            f[4] += mi
            f[5] += 1
    return f


def check_schedule(inst: Instance, schedule: Schedule) -> None:
    replay = validate(inst, schedule)
    st_ = ReplayState(inst)
    s, cost = inst.system, inst.cost
    bound = largest_batch_time(s, cost, len(inst))
    for j, batch in enumerate(schedule.batches):
        evicted = set(batch.evict)
        account = account_batch(batch.tokens, st_.m, st_.n, st_.prompt, evicted, s.block_size)
        assert not account.overdrawn
        expected = semantics_features(batch, st_.m, st_.n, st_.prompt)
        assert list(account.features) == expected, j
        assert replay.batch_features[j].tolist() == expected, j
        assert replay.batch_start[j] + account.time(cost) == replay.batch_end[j], j
        # section 6: the linear terms, and the convex token term where the cost model has knees
        kinks = sum(slope * max(0, expected[1] - knee) for knee, slope in zip(cost.token_knees, cost.per_token_above))
        assert account.time(cost) == pytest.approx(cost.coefficients @ np.array(expected) + (kinks if expected[1] else 0),
                                                   rel=1e-12, abs=0)
        assert account.time(cost) <= bound, j
        assert account.prefill_tokens <= s.max_prefill_tokens and account.tokens <= s.max_batch_tokens
        held = sum(round_to_blocks(0 if i in evicted else st_.m[i], s.block_size)
                   for i in range(len(inst)) if i not in batch.tokens and not st_.finished[i])
        grown = sum(round_to_blocks((0 if i in evicted else st_.m[i]) + c, s.block_size)
                    for i, c in batch.tokens.items())
        assert held + grown == replay.batch_kv[j], j
        freed = sum(round_to_blocks(st_.m[i], s.block_size) for i in evicted)
        assert st_.kv_used + account.kv_growth - freed == replay.batch_kv[j], j
        st_.apply(batch)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
@settings(max_examples=15, deadline=None, database=None)
@given(inst=small_instances())
def test_account_matches_the_replay_on_scheduler_schedules(name, inst):
    try:
        result = run_scheduler(inst, name)
    except (SchedulerRefused, SchedulerStuck):
        return
    check_schedule(inst, result.schedule)


@SETTINGS
@given(data=st.data(), allow_evict=st.booleans())
def test_account_matches_the_replay_on_random_schedules(data, allow_evict):
    inst = data.draw(instances(max_requests=4, block_sizes=(1, 2, 3)))
    check_schedule(inst, random_schedule(data.draw, inst, allow_evict))


def test_largest_batch_time_is_the_documented_bound():
    cost = CostModel(intercept=1.0, per_token=2.0, decode_kv=3.0, prefill_attention=5.0, prefill_kv=7.0,
                     per_prefill_request=11.0)
    s = SystemConfig(kv_capacity=10, max_batch_tokens=4)
    assert largest_batch_time(s, cost, 2) == 1 + 2 * 4 + 3 * 10 + 5 * (16 + 80) + 7 * 10 + 11 * 2
    assert largest_batch_time(s, cost, 9) == 1 + 2 * 4 + 3 * 10 + 5 * (16 + 80) + 7 * 10 + 11 * 4  # <= C prefills


# ------------------------------------------------------------------ the decode-type rule

@pytest.mark.parametrize("generated, uncached, decode, why", [
    (1, 1, True, "generated a token, only that one uncached"),
    (7, 1, True, "a later decode"),
    (0, 1, False, "the last token of a first prefill (n = 0) is prefill-type"),
    (0, 5, False, "a first prefill"),
    (1, 2, False, "a refill after an eviction (n >= 1, S - m > 1)"),
    (3, 9, False, "a refill from nothing"),
])
def test_decode_type_rule(generated, uncached, decode, why):
    assert is_decode_type(generated, uncached) == decode, why
    assert bool(is_decode_type(np.array([generated]), np.array([uncached]))[0]) == decode


def test_the_worked_example_batch_1_through_the_primitive():
    # docs/semantics.md section 13, batch 1: r0 decodes with m = 3 (I = 3, n = 1), r1 finishes its
    # prompt with its last token (I = 2, m = 1, n = 0): prefill-type
    account = account_batch({0: 1, 1: 1}, [3, 1], [1, 0], [3, 2])
    assert account.features == (1.0, 2, 3, 3, 1, 1)
    assert account.prefill_tokens == 1 and account.kv_growth == 2 and not account.overdrawn


def test_evicted_requests_count_with_nothing_cached_and_overdraw_is_flagged():
    # request 0 (I = 4, n = 2, m = 5) evicted then refilled: m = 0 in this batch
    account = account_batch({0: 6}, [5], [2], [4], evicted={0}, block=4)
    assert account.features == (1.0, 6, 0, 36, 0, 1)
    assert account.kv_growth == 8
    assert account_batch({0: 2}, [5], [2], [4]).overdrawn  # only S - m = 1 uncached
    assert not account_batch({0: 1}, [5], [2], [4]).overdrawn


def test_an_empty_batch_costs_nothing():
    account = account_batch({}, [], [], [])
    assert account == BatchAccount(0, 0, 0, 0, 0, 0, 0, False)
    assert account.features == (0.0,) * 6
    assert account.time(CostModel(intercept=1.0)) == 0.0


# ------------------------------------------------------------------ block rounding

@pytest.mark.parametrize("tokens, block, rounded, count", [
    (0, 1, 0, 0), (7, 1, 7, 7), (0, 4, 0, 0), (1, 4, 4, 1), (4, 4, 4, 1), (5, 4, 8, 2), (8, 4, 8, 2),
    (17, 16, 32, 2), (2047, 2048, 2048, 1),
])
def test_block_rounding(tokens, block, rounded, count):
    assert round_to_blocks(tokens, block) == rounded
    assert block_count(tokens, block) == count
    assert SystemConfig(10 ** 6, 10, block_size=block).blocks(tokens) == rounded


def test_block_rounding_of_arrays():
    np.testing.assert_array_equal(round_to_blocks(np.array([0, 1, 3, 4, 5]), 3), [0, 3, 3, 6, 6])
    np.testing.assert_array_equal(block_count(np.array([0, 1, 3, 4]), 3), [0, 1, 1, 2])


# ------------------------------------------------------------------ the validator's fast path

def _two_requests(arrival: float = 0.0) -> Instance:
    return Instance((Request(3, 2), Request(2, 2, arrival)), SystemConfig(100, 100), CostModel(intercept=1.0))


def test_the_first_broken_rule_in_batch_order_is_named():
    st_ = ReplayState(_two_requests())
    # request 0 asks for 4 of its 3 uncached tokens before request 7 (unknown) is reached
    with pytest.raises(ScheduleError, match="batch 0, request 0: processes 4 tokens but only 3"):
        st_.apply(Batch({0: 4, 7: 1}))
    with pytest.raises(ScheduleError, match="batch 0, request 7: processes an unknown request id"):
        st_.apply(Batch({0: 3, 7: 1}))
    with pytest.raises(ScheduleError, match="batch 0, request 1: processes 0 tokens"):
        st_.apply(Batch({0: 3, 1: 0}))
    with pytest.raises(ScheduleError, match="batch 0, request -1: processes an unknown"):
        st_.apply(Batch({-1: 1}))


def test_a_rejected_batch_leaves_arrivals_as_they_were():
    st_ = ReplayState(_two_requests(arrival=5.0))
    with pytest.raises(ScheduleError, match="processes 9 tokens"):
        st_.apply(Batch({1: 9}, start=6.0))  # starts after request 1 arrives, but is invalid
    with pytest.raises(ScheduleError, match="batch 0, request 1: processed in a batch starting at 0 s"):
        st_.apply(Batch({1: 2}))  # the clock is still at 0: request 1 has not arrived
    st_.apply(Batch({0: 3}))
    st_.apply(Batch({0: 1}))
    with pytest.raises(ScheduleError, match="batch 2, request 0: processed after it finished"):
        st_.apply(Batch({1: 2, 0: 1}, start=5.0))
    st_.apply(Batch({1: 2}, start=5.0))
    assert st_.n == [2, 1] and st_.first_token[1] == 6.0
