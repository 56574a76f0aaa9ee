"""Units of work on every core or on Ray (kvbound/units.py): every unit once, by its index, from this
process and from a pool; bad input before any work; a unit's own runs stay in its worker; an early
close stops what runs."""
from __future__ import annotations

import importlib.util
import time

import pytest

from kvbound.errors import InputError
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
