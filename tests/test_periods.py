"""Busy periods (issue 33): the requests cut into windows of consecutive arrivals where the best
schedule is idle, each window solved alone (`kvbound.solvers.phases.periods`).

* The partition argument, on every part of any partition (arrivals, block rounding, tight M,
  evictions, token knees): the parts' least sums of latencies (first-token times) alone, arrivals
  from 0, add up to at most the whole's (the brute-force oracle on the parts and on the whole), and
  the whole's optimal schedule restricted to a part is a valid schedule of it in which no request
  ends or gets its first token later.
* The parts' optimal schedules one after another are a valid schedule of the whole (the validator),
  worth their sum where each part ends before the next one's first arrival.
* `busy_windows` cuts exactly before the arrivals at or after every earlier request's completion.
* In a solve: on the ground-truth case whose chain MIP stayed unproven in 150 s, the windows are each
  proven, the solve is optimal, and its value is the sum of the oracle's optima of the windows;
  `kvbound bound` lists the row; the windows in this process, on a pool of 2 and on a local Ray of 2
  give the same row; an interrupt during the windows (here or on a pool) keeps the bound of the
  windows solved (the others counted alone) and a schedule.
* A case whose first arrival is not 0 is solved as from 0: the ground truth's code case 1 s later is
  proven at its recorded optimum, its schedule in the case's own time.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbound import interrupt, load_case, validate
from kvbound.alone import time_alone
from kvbound.objective import Objective
from kvbound.solvers import driver, lower_bounds, solve
from kvbound.solvers.ledger import Ledger
from kvbound.solvers.options import SolveOptions
from kvbound.solvers.phases import periods
from kvbound.solvers.phases.periods import (NAME, POOL_FROM, busy_windows, one_after_another, restricted,
                                            window_instance)
from kvbound.units import UnitRunner
from tests.oracle import brute_force, tiny_instances

MEAN = (Objective.MEAN_LATENCY, Objective.MEAN_TTFT)
TOL = 1e-9
GROUND_TRUTH = Path(__file__).resolve().parents[1] / "bench" / "results" / "ground_truth.json"
CASE = Path(__file__).resolve().parents[1] / "cases" / "ground_truth" / "gt_conv_r0_n8_s40_tight_arr.toml"


def _times(replay, objective: Objective) -> np.ndarray:
    return replay.first_token if objective.first_token else replay.completion


@settings(max_examples=60, deadline=None)
@given(inst=tiny_instances(max_requests=3, arrivals=True), objective=st.sampled_from(MEAN),
       labels=st.lists(st.integers(0, 2), min_size=3, max_size=3))
def test_parts_add_up_to_at_most_the_optimum_and_restrictions_are_valid(inst, objective, labels):
    n = len(inst)
    best = brute_force(inst, objective.value)
    whole = validate(inst, best.schedule)
    parts = [np.flatnonzero(np.array(labels[:n]) == g) for g in range(3)]
    parts = [p for p in parts if len(p)]
    total = 0.0
    for members in parts:
        window, shift = window_instance(inst, members)
        assert min(r.arrival for r in window.requests) == 0.0
        part = validate(window, restricted(best.schedule, whole.batch_start, members, window, shift))
        assert np.all(_times(part, objective) + shift <= _times(whole, objective)[members] + TOL)
        total += len(members) * brute_force(window, objective.value).value
    assert total <= n * best.value * (1 + TOL) + 1e-12


@settings(max_examples=40, deadline=None)
@given(inst=tiny_instances(max_requests=3, arrivals=True), objective=st.sampled_from(MEAN),
       gap=st.sampled_from((0.0, 0.5, 40.0)))
def test_parts_one_after_another_are_a_schedule_of_the_whole(inst, objective, gap):
    # the last request moved `gap` intercepts past the rest's latest arrival: a window of its own
    last = inst.requests[-1]
    moved = [*inst.requests[:-1], type(last)(last.prompt, last.output,
                                            max(r.arrival for r in inst.requests) + gap * inst.cost.intercept)]
    inst = type(inst)(tuple(moved), inst.system, inst.cost)
    parts, total = [], 0.0
    for members in (np.arange(len(inst) - 1), np.array([len(inst) - 1])):
        window, shift = window_instance(inst, members)
        optimum = brute_force(window, objective.value)
        parts.append((members, optimum.schedule, shift))
        total += len(members) * optimum.value
    replay = validate(inst, one_after_another(inst, parts))  # raises where a rule breaks
    value = objective.of(replay.metrics) * len(inst)
    assert value >= total * (1 - TOL) - 1e-12
    first = validate(window_instance(inst, parts[0][0])[0], parts[0][1]).completion.max()
    if first <= moved[-1].arrival - parts[0][2]:  # the first window ends before the last request arrives
        assert value <= total * (1 + TOL) + 1e-12


def test_busy_windows_cut_where_every_earlier_request_has_completed():
    arrivals = np.array([0.0, 1.0, 5.0, 5.0, 9.0, 2.0])
    completion = np.array([3.0, 2.0, 6.0, 9.0, 10.0, 2.5])
    # by arrival: 0 (to 3), 1 (to 2), 5 (2.0, to 2.5) | 2 at 5 >= 3 | 3 at 5, to 9 | 4 at 9 >= 9
    assert [list(w) for w in busy_windows(arrivals, completion)] == [[0, 1, 5], [2, 3], [4]]
    assert len(busy_windows(np.zeros(3), np.ones(3))) == 1


def _oracle_sum_over_windows(inst, schedule, objective: Objective) -> float:
    total = 0.0
    for members in busy_windows(inst.arrivals, validate(inst, schedule).completion):
        window, _ = window_instance(inst, members)
        total += len(members) * brute_force(window, objective.value).value
    return total / len(inst)


def test_a_solve_proves_the_ground_truth_case_the_chain_model_left_open():
    inst = load_case(str(CASE))
    for objective in MEAN:
        result = solve(inst, objective.value, time_limit=30)
        row = next(b for b in result.bounds if b.name == NAME)
        assert result.status == "optimal" and row.certified and row.details["proven"] == row.details["solved"] > 1
        validate(inst, result.schedule)
        oracle = _oracle_sum_over_windows(inst, result.schedule, objective)
        assert abs(result.objective - oracle) <= 1e-9 * oracle
        assert result.lower_bound <= result.objective * (1 + TOL)


def test_kvbound_bound_lists_the_row():
    inst = load_case(str(CASE))
    bounds, result = lower_bounds(inst, SolveOptions("mean_latency", time_limit=20))
    row = next(b for b in bounds if b.name == NAME)
    assert row.certified and row.found and row.value <= result.objective * (1 + TOL)


def _runners() -> list[UnitRunner]:
    runners = [UnitRunner(workers=1), UnitRunner(workers=2)]
    if importlib.util.find_spec("ray") is not None:
        runners.append(UnitRunner("ray", 2))
    return runners


def test_windows_solved_here_on_every_core_and_on_ray_give_one_bound():
    # the windows are independent units: in this process, on a pool of 2 and on a local Ray of 2 workers
    # each is proven, so the row is the same sum of optima whichever ran them
    inst = load_case(str(CASE))
    rows = []
    for runner in _runners():
        result = driver.solve_with(inst, SolveOptions("mean_latency", time_limit=60, units=runner))
        row = next(b for b in result.bounds if b.name == NAME)
        assert result.status == "optimal" and row.details["proven"] == row.details["solved"] == row.details["windows"]
        rows.append(row.value)
    assert len(rows) >= 2 and max(rows) - min(rows) <= 1e-9 * rows[0]
    assert abs(rows[0] - _oracle_sum_over_windows(inst, result.schedule, Objective.MEAN_LATENCY)) <= 1e-9 * rows[0]


@pytest.mark.parametrize("workers", [1, 2])
def test_an_interrupt_during_the_windows_keeps_their_bound_and_a_schedule(monkeypatch, workers):
    inst = load_case(str(CASE))
    real, rows = Ledger.certify, []

    def interrupt_after_the_first_window(ledger, bound):
        kept = real(ledger, bound)
        if bound.name == NAME and "[busy period]" not in ledger.instance.name:
            rows.append(bound.details["solved"])
            if bound.details["solved"] == 1:
                interrupt.request()
        return kept

    monkeypatch.setattr(Ledger, "certify", interrupt_after_the_first_window)
    sizes, solve_window = [], periods.solve_window
    if workers == 1:  # in this process the windows' order is seen: the smallest first

        def recording(job):
            sizes.append(len(job.instance))
            return solve_window(job)

        monkeypatch.setattr(periods, "solve_window", recording)
    try:
        result = driver.solve_with(inst, SolveOptions("mean_latency", time_limit=30, units=UnitRunner(workers=workers)))
    finally:
        interrupt.reset()
    row = next(b for b in result.bounds if b.name == NAME)
    windows = row.details["windows"]
    assert windows >= POOL_FROM and rows[0] == 1  # the bound as each window ends, on a pool too
    assert 1 <= row.details["solved"] <= workers < windows  # none started after the interrupt
    assert sizes == ([1] if workers == 1 else [])
    alone = time_alone(inst, Objective.MEAN_LATENCY)
    assert alone.sum() / len(inst) <= row.value * (1 + TOL)
    assert row.value <= _oracle_sum_over_windows(inst, result.schedule, Objective.MEAN_LATENCY) * (1 + TOL)
    assert result.status == "interrupted" and result.schedule is not None
    validate(inst, result.schedule)


def test_arrivals_that_start_late_are_solved_as_from_zero():
    # the ground truth's code case (proven in seconds from 0) with every arrival 1 s later: the same
    # optimum, proven (a model's horizon counts batches from 0: 282 where 11 do), the schedule in the
    # case's own time
    code = load_case(str(CASE.parent / "gt_code_r0_n8_s200_tight_arr.toml"))
    late = type(code)(tuple(type(r)(r.prompt, r.output, r.arrival + 1.0) for r in code.requests), code.system, code.cost)
    assert late.arrivals.min() == 1.0 and np.allclose(late.from_zero().arrivals, code.arrivals)
    result = solve(late, "mean_latency", time_limit=60)
    assert result.status == "optimal" and result.horizon is not None and result.horizon < 20
    replay = validate(late, result.schedule)
    assert replay.batch_start.min() >= 1.0
    assert abs(replay.metrics.mean_latency - result.objective) <= 1e-12
    recorded = json.loads(GROUND_TRUTH.read_text())["cases"]["gt_code_r0_n8_s200_tight_arr"]["objectives"]["mean_latency"]
    assert recorded["proven"] and abs(result.objective - recorded["optimum"]) <= 1e-6 * result.objective
