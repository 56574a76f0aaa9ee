"""The certified capacity bound (kvbound.analysis.capacity_bound; docs/analysis.md).

* The windows bound L(f) / N and the one-machine flow / N are never above the brute-force optimum of
  the mean objective at the factor, with arrivals, tight M and evictions; L grows with f.
* The one-machine flow scales as the proof says: flow(f) >= (g / f) flow(g) for g <= f.
* Windows of groups (long traces) are windows of requests: never above the ungrouped bound.
* The certified factor: at it and above, the optimum exceeds the limit (the oracle), and a scheduler's
  value at and above it exceeds the limit too.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvbound.analysis import capacity_bound as cb
from kvbound.analysis.capacity import objective_value, scale_arrivals
from kvbound.analysis.headroom import unloaded_value
from kvbound.bounds.analytic import srpt_completions
from kvbound.io.cases import load_case
from kvbound.objective import Objective
from tests.oracle import brute_force
from tests.conftest import REPO
from tests.test_formulation import instances

MEAN = (Objective.MEAN_LATENCY, Objective.MEAN_TTFT)
FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
TOL = 1e-9


@settings(max_examples=50, deadline=None)
@given(inst=instances(min_requests=2, max_requests=4, max_prompt=3, max_output=3, arrivals=True),
       objective=st.sampled_from(MEAN), factor=st.sampled_from(FACTORS))
def test_window_and_one_machine_bounds_never_exceed_the_optimum(inst, objective, factor):
    windows = cb.window_bounds(inst, objective)
    machine = cb.OneMachine(inst, objective, 3)
    opt = brute_force(scale_arrivals(inst, factor), objective.value).value
    assert windows.mean(factor) <= opt * (1 + TOL) + 1e-12
    for k in range(len(machine.shares)):
        assert machine.flow(factor, k) / len(inst) <= opt * (1 + TOL) + 1e-12
    values = [windows.mean(f) for f in FACTORS]
    assert all(a <= b * (1 + TOL) + 1e-15 for a, b in zip(values, values[1:]))  # L grows with f


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.floats(0.01, 5.0), min_size=1, max_size=8),
       gaps=st.lists(st.floats(0.0, 3.0), min_size=8, max_size=8),
       g=st.floats(0.1, 4.0), stretch=st.floats(1.0, 5.0))
def test_one_machine_flow_shrinks_no_faster_than_the_factor(sizes, gaps, g, stretch):
    arrivals = np.cumsum(gaps[:len(sizes)]) - gaps[0]
    sizes = np.array(sizes)

    def flow(f):
        return float((srpt_completions(arrivals / f, sizes) - arrivals / f).sum())

    f = g * stretch
    assert flow(f) >= (g / f) * flow(g) * (1 - 1e-9) - 1e-12


def test_windows_of_groups_are_never_above_the_windows_of_requests(monkeypatch):
    inst = load_case(REPO / "cases" / "ground_truth" / "gt_conv_r0_n8_s40_tight_arr.toml")
    fine = cb.window_bounds(inst, "mean_latency")
    monkeypatch.setattr(cb, "MAX_GROUPS", 3)
    coarse = cb.window_bounds(inst, "mean_latency")
    assert coarse.at_zero.shape == (3, 3)
    for f in (0.5, 2.0, 8.0, 1e6):
        assert coarse.mean(f) <= fine.mean(f) * (1 + TOL)
    assert fine.mean(1e6) > coarse.mean(0.5)  # not all the same number


@settings(max_examples=25, deadline=None)
@given(inst=instances(min_requests=2, max_requests=3, max_prompt=3, max_output=3, arrivals=True),
       objective=st.sampled_from(MEAN), position=st.floats(0.2, 0.8))
def test_at_and_above_the_certified_factor_the_optimum_exceeds_the_limit(inst, objective, position):
    assume(inst.arrivals.max() > 0)
    unloaded = unloaded_value(inst, objective)
    windows = cb.window_bounds(inst, objective)
    top = windows.mean(cb.HIGHEST)
    assume(top > unloaded * (1 + 1e-6))
    limit = unloaded + position * (top - unloaded)  # between the unloaded value and all at once
    bound = cb.capacity_upper_bound(inst, objective, limit, windows=windows)
    assert bound.factor is not None and bound.limit == limit
    for scale in (1.0, 1.5, 4.0, 1e3):
        f = bound.factor * scale
        assert brute_force(scale_arrivals(inst, f), objective.value).value > limit * (1 - TOL)


@pytest.mark.parametrize("name", ["ground_truth/gt_code_r0_n8_s200_tight_arr", "sample200"])
def test_schedulers_exceed_the_limit_from_the_certified_factor_on(name):
    inst = load_case(REPO / "cases" / f"{name}.toml")
    unloaded = unloaded_value(inst, "mean_latency")
    windows = cb.window_bounds(inst, "mean_latency")
    limit = min(2 * unloaded, (unloaded + windows.mean(cb.HIGHEST)) / 2)  # 8 at once stay within 2 x
    bound = cb.capacity_upper_bound(inst, "mean_latency", limit, windows=windows)
    assert bound.factor is not None and "windows of arrivals" in bound.covered_by
    for scale in (1.0, 1.3, 3.0, 50.0):
        scaled = scale_arrivals(inst, bound.factor * scale)
        for scheduler in ("srpt", "sarathi"):
            assert objective_value(scaled, scheduler, "mean_latency") > limit
