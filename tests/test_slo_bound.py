"""kvbound.analysis.slo_bound (issue 35, item 3): the certified upper bound on SLO attainment.

The bound must never be below the attainment of any schedule. On tiny instances (tests/oracle.py's
`tiny_instances`, arrivals, tight M, evictions possible) it is checked against:

* an exhaustive search for the largest set of requests that some schedule keeps within the SLO
  (`best_attainment`), over the oracle's batches (`tests.oracle._Problem`, written from the semantics
  without the validator), every batch back to back or starting at an arrival, the requests outside
  the target set untouched until it is served, at most one eviction on the way. It explores a part
  of the schedule space, so its answer is a lower bound of the true best: every schedule it returns
  is completed and replayed by the validator, and the bound must be >= what the replay counts;
* every scheduler of `headroom.DEFAULT_SCHEDULERS` and the oracle's optimal mean-TTFT and
  mean-latency schedules, each replayed by the validator.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbound import Batch, Instance, Request, Schedule, SystemConfig, run_scheduler, validate
from kvbound.analysis.capacity import scale_arrivals
from kvbound.analysis.headroom import DEFAULT_SCHEDULERS, slo_alone_bound
from kvbound.analysis.slo_bound import (alone_attainable, max_on_time, slo_attainment_upper_bound, slo_bound)
from kvbound.costs import PRESETS
from kvbound.errors import SchedulerRefused, SchedulerStuck
from kvbound.schedule import Slo
from tests.oracle import _Problem, brute_force, tiny_instances

EPS = 1e-9


# ------------------------------------------------------------------------------ the exhaustive search

def _feasible(instance: Instance, target: tuple[int, ...], slo: Slo, evictions: int = 1):
    """Batches (ids of `instance`) after which every request in `target` has met the SLO and is
    finished, or None: a depth-first search over the oracle's batches of the target requests alone."""
    sub = Instance(tuple(instance.requests[i] for i in target), instance.system, instance.cost)
    prob = _Problem(sub, allow_evict=True, max_batch_size=None)
    k = prob.k
    ttft_limit = [prob.a[j] + slo.ttft * (1 + EPS) for j in range(k)]
    # a gap still open may not exceed what the P99 of the request's gaps allows (O <= 3: one or two gaps;
    # with two, P99 = 0.01 v_min + 0.99 v_max)
    gap_limit = [slo.tbt * (1 + EPS) / (1.0 if prob.O[j] <= 2 else 0.99) for j in range(k)]
    seen = set()

    def p99_ok(gaps) -> bool:
        return not gaps or float(np.percentile(gaps, 99)) <= slo.tbt * (1 + EPS)

    def dfs(state, t, last, gaps, evicted_left, path):
        if all(n == o for (_, n), o in zip(state, prob.O)):
            return path
        key = (state, t, last, gaps, evicted_left)
        if key in seen:
            return None
        seen.add(key)
        for start in [t] + [a for a in prob.arrival_times if a > t]:
            for tokens, evict, duration in prob.batches(state, start):
                if evict and not evicted_left:
                    continue
                if start > t and not tokens:
                    continue
                end = start + duration
                after = prob.apply(state, tokens, evict)
                new_last, new_gaps, ok = list(last), list(gaps), True
                for j in range(k):
                    n0, n1 = state[j][1], after[j][1]
                    if n1 > n0:  # generated a token at `end`
                        if n0 == 0:
                            ok &= end <= ttft_limit[j]
                        else:
                            new_gaps[j] = gaps[j] + (end - last[j],)
                            ok &= end - last[j] <= gap_limit[j]
                        new_last[j] = end
                        if n1 == prob.O[j]:
                            ok &= p99_ok(new_gaps[j])
                    elif n1 == 0:
                        ok &= end <= ttft_limit[j] or not tokens  # its first token can come no earlier
                    elif n1 < prob.O[j]:
                        ok &= end - last[j] <= gap_limit[j]
                    if not ok:
                        break
                if not ok:
                    continue
                found = dfs(after, end, tuple(new_last), tuple(new_gaps), evicted_left - len(evict),
                            path + [(start if start > t else None, tokens, evict)])
                if found is not None:
                    return found
        return None

    path = dfs(tuple((0, 0) for _ in range(k)), 0.0, (0.0,) * k, ((),) * k, evictions, [])
    if path is None:
        return None
    return [Batch({target[j]: c for j, c in tokens.items()}, tuple(target[j] for j in evict), start)
            for start, tokens, evict in path]


def _finish_the_rest(instance: Instance, batches: list[Batch], done: set[int]) -> list[Batch]:
    """Append batches that run every request outside `done` alone to its end (nothing else holds KV:
    the search touched only the target requests, which are finished)."""
    s = instance.system
    step = min(s.max_prefill_tokens, s.max_batch_tokens)
    out = list(batches)
    for i, r in enumerate(instance.requests):
        if i in done:
            continue
        start = r.arrival
        left = r.prompt
        while left:
            c = min(step, left)
            out.append(Batch({i: c}, (), start))
            start, left = None, left - c
        out += [Batch({i: 1}) for _ in range(r.output - 1)]
    return out


def best_attainment(instance: Instance, slo: Slo) -> tuple[float, Schedule]:
    """The largest attainment the search reaches, with its (validated) schedule."""
    n = len(instance)
    for size in range(n, 0, -1):
        for target in itertools.combinations(range(n), size):
            batches = _feasible(instance, target, slo)
            if batches is not None:
                schedule = Schedule(instance.requests, _finish_the_rest(instance, batches, set(target)))
                replay = validate(instance, schedule)
                got = float(replay.slo_attained(slo).mean())
                assert got >= size / n - EPS, (target, got)  # the search's own count agrees with the validator
                return got, schedule
    schedule = Schedule(instance.requests, _finish_the_rest(instance, [], set()))
    return float(validate(instance, schedule).slo_attained(slo).mean()), schedule


def _attainments(instance: Instance, slo: Slo) -> dict[str, float]:
    """Every scheduler's and the oracle's schedules, each replayed by the validator."""
    out = {}
    for name in DEFAULT_SCHEDULERS:
        try:
            schedule = run_scheduler(instance, name).schedule
        except (SchedulerRefused, SchedulerStuck):
            continue
        out[name] = float(validate(instance, schedule).slo_attained(slo).mean())
    for objective in ("mean_ttft", "mean_latency"):
        schedule = brute_force(instance, objective).schedule
        out[f"oracle {objective}"] = float(validate(instance, schedule).slo_attained(slo).mean())
    return out


@st.composite
def _slo(draw, intercept: float) -> Slo:
    return Slo(ttft=intercept * draw(st.sampled_from([1, 1.5, 2, 2.5, 3, 4, 6])),
               tbt=intercept * draw(st.sampled_from([1, 1.25, 1.5, 2, 4])))


# ------------------------------------------------------------------------------ the tests

@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), tiny_instances(min_requests=2, max_requests=3, max_prompt=4, max_output=3))
def test_the_bound_is_never_below_any_schedules_attainment(data, inst):
    slo = data.draw(_slo(inst.cost.intercept))
    bound = slo_bound(inst, slo)
    assert bound.attainment <= slo_alone_bound(inst, slo) + EPS  # the new one is never looser than alone
    assert bound.attainment == slo_attainment_upper_bound(inst, slo)
    best, _ = best_attainment(inst, slo)
    assert bound.attainment >= best - EPS, (bound, best)
    for name, value in _attainments(inst, slo).items():
        assert bound.attainment >= value - EPS, (name, value, bound)


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), tiny_instances(min_requests=4, max_requests=4, max_prompt=2, max_output=2, arrivals=True,
                                 costs=("unit-batches", "all-terms")))
def test_four_requests_with_arrivals(data, inst):
    slo = data.draw(_slo(inst.cost.intercept))
    best, _ = best_attainment(inst, slo)
    assert slo_attainment_upper_bound(inst, slo) >= best - EPS


def test_strictly_below_the_alone_bound_and_tight():
    # three prompts of 4 tokens at t = 0 and P = 4: each alone meets TTFT <= 1 batch, but one batch
    # prefills only one of them, so at most one first token by t = 1; the fourth arrives later, alone
    inst = Instance((Request(4, 2), Request(4, 2), Request(4, 2), Request(4, 2, 5.0)), SystemConfig(64, 8, 4),
                    PRESETS["unit-batches"])
    slo = Slo(ttft=1.0, tbt=1.0)
    assert slo_alone_bound(inst, slo) == 1.0
    bound = slo_bound(inst, slo)
    assert bound.attainment == 0.5 and bound.on_time == 2 and bound.alone == 4 and bound.share
    best, schedule = best_attainment(inst, slo)
    assert best == 0.5  # the bound is tight here, and that schedule is valid (best_attainment replays it)
    # a little more time: two first tokens by t = 2, in two batches; the bound follows
    assert slo_attainment_upper_bound(inst, Slo(ttft=2.0, tbt=1.0)) == 0.75


def test_arrivals_spread_out_lift_the_bound_back_to_alone():
    inst = Instance(tuple(Request(4, 2, 0.0) for _ in range(4)), SystemConfig(64, 8, 4), PRESETS["unit-batches"])
    slo = Slo(ttft=1.0, tbt=1.0)
    assert slo_attainment_upper_bound(inst, slo) == 0.25
    spread = Instance(tuple(Request(4, 2, 2.0 * k) for k in range(4)), inst.system, inst.cost)
    assert slo_attainment_upper_bound(spread, slo) == 1.0
    assert slo_attainment_upper_bound(scale_arrivals(spread, 4.0), slo) == 0.5  # every 0.5 s: every other one


def test_alone_attainable_is_the_alone_bound():
    inst = Instance((Request(4, 1), Request(4, 3, 1.0), Request(30, 2, 1.0)), SystemConfig(64, 8, 4),
                    PRESETS["unit-batches"])
    for slo in (Slo(1.0, 1.0), Slo(1.0, 0.5), Slo(8.0, 1.0), Slo(0.5, 1.0)):
        assert float(alone_attainable(inst, slo).mean()) == slo_alone_bound(inst, slo)
        assert slo_attainment_upper_bound(inst, slo) <= slo_alone_bound(inst, slo)


def test_max_on_time_against_every_subset():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 7))
        r = np.sort(rng.integers(0, 6, n)).astype(float)
        S = float(rng.integers(1, 5))
        p = rng.integers(1, 4, n).astype(float)
        best = 0
        for mask in range(1 << n):
            chosen = [j for j in range(n) if mask >> j & 1]
            t, ok = -math.inf, True
            for j in chosen:  # first-come first-served (equal windows: as good as any preemptive schedule)
                t = max(t, r[j]) + p[j]
                ok &= t <= r[j] + S
            if ok:
                best = max(best, len(chosen))
        assert max_on_time(r, r + S, p) == best
    with pytest.raises(ValueError):
        max_on_time(np.array([0.0, 1.0]), np.array([5.0, 2.0]), np.array([1.0, 1.0]))


def test_headroom_json_carries_the_bound():
    from kvbound.analysis.headroom import POINT_KEYS, headroom

    inst = Instance((Request(4, 3, 0.0), Request(6, 2, 1.0), Request(3, 4, 2.0)), SystemConfig(16, 8),
                    PRESETS["unit-batches"])
    slo = Slo(ttft=1.0, tbt=1.0)
    result = headroom(inst, [1, 8], ["srpt"], objective="mean_ttft", slo=slo, time_limit=6)
    data = result.to_json()
    for p in data["points"]:
        assert tuple(p) == POINT_KEYS
        scaled = scale_arrivals(inst, p["rate_factor"])
        expected = min(slo_alone_bound(scaled, slo), slo_attainment_upper_bound(scaled, slo))
        assert p["slo_attainment_upper_bound"] == expected
        for r in p["rows"]:
            assert r["slo_attainment"] <= p["slo_attainment_upper_bound"] + EPS
    # at 8 x the rate the three first prefills (4 + 6 + 3 tokens, P = 8) no longer fit their 1 s windows
    assert [p["slo_attainment_upper_bound"] for p in data["points"]] == [1.0, pytest.approx(2 / 3)]
