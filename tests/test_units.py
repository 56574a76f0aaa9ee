"""Units of work on every core or on Ray (kvbound/units.py): every unit once, by its index, from this
process and from a pool; bad input before any work; a unit's own runs stay in its worker; an early
close stops what runs; a unit's argument made as it starts (`start`: a shared deadline's shares); an
interrupt starts no more units."""
from __future__ import annotations

import importlib.util
import time

import pytest

from kvbound import interrupt
from kvbound.errors import InputError
from kvbound.interrupt import Stopped
from kvbound.units import UnitRunner, check_backend, run_units


def _square(x: int) -> int:
    return x * x


def _nested_count(_: int) -> int:
    """Inside a unit, how many units a runner would run at once (1: it stays in this worker)."""
    return UnitRunner(workers=4).count(8)


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@pytest.mark.parametrize("workers", [1, 2])
def test_every_unit_once_by_its_index(workers):
    got = dict(run_units(_square, list(range(7)), workers=workers))
    assert got == {k: k * k for k in range(7)}


def test_no_units_is_an_empty_generator_that_closes():
    results = run_units(_square, [])
    assert list(results) == []
    results.close()


def test_a_units_own_runs_stay_in_its_worker():
    assert UnitRunner(workers=4).count(8) == 4  # here: four at once
    assert dict(run_units(_nested_count, [0, 1], workers=2)) == {0: 1, 1: 1}


def test_closing_early_does_not_wait_for_running_units():
    began = time.perf_counter()
    results = run_units(_sleep, [0.0, 30.0, 30.0], workers=2)
    first = next(results)
    results.close()
    assert first == (0, 0.0)
    assert time.perf_counter() - began < 10.0  # not the 30 s units


@pytest.mark.parametrize("backend,workers,field", [("spark", None, "backend"), ("local", 0, "workers")])
def test_bad_backend_or_workers_is_bad_input(backend, workers, field):
    with pytest.raises(InputError) as exc:
        check_backend(backend, workers)
    assert exc.value.field == field
    with pytest.raises(InputError):
        UnitRunner(backend, workers)


def test_ray_named_but_not_installed_is_bad_input_before_any_work(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(InputError, match="pip install 'kvbound\\[distributed\\]'"):
        UnitRunner("ray", 2)


@pytest.mark.parametrize("workers, rounds", [(1, [4, 3, 2, 1]), (2, [2, 2, 1, 1])])
def test_start_makes_each_units_argument_as_it_starts(workers, rounds):
    """`start(unit, rounds)` is called as each unit starts, in order, with ceil(units not started /
    units at once): units start only as workers free up, so a unit's share of a deadline is reckoned
    from the time left then (headroom's rate points)."""
    began, starts = time.perf_counter(), []

    def start(unit: float, left: int) -> float:
        starts.append((time.perf_counter() - began, left))
        return unit

    got = dict(run_units(_sleep, [0.3] * 4, workers=workers, start=start))
    assert got == {k: 0.3 for k in range(4)}
    assert [left for _, left in starts] == rounds
    # the third unit started when one of the first `workers` had ended, not with them
    assert starts[2][0] - starts[0][0] >= 0.25


def _ask_to_stop(x: int) -> int:
    interrupt.request()  # as Ctrl-C does while a unit runs
    return x


def test_an_interrupt_in_this_process_starts_no_more_units():
    results = run_units(_ask_to_stop, [0, 1, 2], workers=1)
    try:
        assert next(results) == (0, 0)  # the unit that ran is kept
        with pytest.raises(Stopped):
            next(results)
    finally:
        interrupt.reset()
