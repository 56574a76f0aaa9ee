"""The warm-start heuristics as units (`kvbound.solvers.phases.heuristics`): on a large trace those after
the first schedule run on every core or on Ray.

* Made to do so on a shipped case, a pool of 2 and a local Ray of 2 give the same seeds, in the same
  order and of the same values, as one after another in this process, each validated.
* A heuristic that would run past the heuristics' share of the time is stopped at it: the phase ends
  within the share and keeps the others' schedules.
* An interrupt while the units run ends the phase at once with the schedules already made.
* The first schedule comes in the list's order; from then on a mean objective runs the heuristics that
  serve small requests first (`SMALL_FIRST`) before the rest, and total latency keeps the list's order.
"""
from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

from kvbound import interrupt, load_case, validate
from kvbound.deadline import Deadline
from kvbound.objective import Objective
from kvbound.schedulers import FAST_HEURISTICS, SMALL_FIRST, run_scheduler
from kvbound.solvers.ledger import Ledger
from kvbound.solvers.options import SolveOptions
from kvbound.solvers.phases import heuristics
from kvbound.solvers.phases.heuristics import HEURISTIC_SHARE, Heuristics, favoured_first
from kvbound.units import UnitRunner

CASE = Path(__file__).resolve().parents[1] / "cases" / "sample200.toml"
SLOW = "srpt"  # made to sleep in the tests that need one heuristic to run long


@pytest.fixture(scope="module")
def instance():
    return load_case(str(CASE))


def _runners() -> list[UnitRunner]:
    runners = [UnitRunner(workers=1), UnitRunner(workers=2)]
    if importlib.util.find_spec("ray") is not None:
        runners.append(UnitRunner("ray", 2))
    return runners


def _run(instance, runner: UnitRunner, seconds: float | None, warm_start=FAST_HEURISTICS) -> Ledger:
    options = SolveOptions(Objective.MEAN_LATENCY, units=runner, warm_start=warm_start)
    ledger = Ledger(instance, options, Deadline(seconds))
    Heuristics().run(ledger)
    return ledger


def _recording_units(monkeypatch) -> list[list[str]]:
    """Every list of heuristics the phase hands to units (none where it runs them here)."""
    handed, as_units = [], heuristics._as_units

    def recording(ledger, names, deadline):
        handed.append(list(names))
        return as_units(ledger, names, deadline)

    monkeypatch.setattr(heuristics, "_as_units", recording)
    return handed


def test_the_heuristics_as_units_give_the_seeds_they_give_one_after_another(monkeypatch, instance):
    monkeypatch.setattr(heuristics, "POOL_FROM_SECONDS", 0.0)
    handed = _recording_units(monkeypatch)
    seeds = []
    for runner in _runners():
        handed.clear()
        ledger = _run(instance, runner, 120)
        assert bool(handed) == (runner.count(10) > 1)  # here one after another, else as units
        for seed in ledger.seeds:
            assert validate(instance, seed.schedule).metrics.mean_latency == pytest.approx(seed.value, rel=1e-12)
        seeds.append([(seed.name, seed.value) for seed in ledger.seeds])
    assert len(seeds) >= 2 and len(seeds[0]) >= 5
    assert all(found == seeds[0] for found in seeds)


def _sleeping_heuristic(monkeypatch):
    """SLOW sleeps a minute before it answers (the pool's workers are forked: they see it too)."""
    real = heuristics.run_scheduler

    def run(instance, name):
        if name == SLOW:
            time.sleep(60)
        return real(instance, name)

    monkeypatch.setattr(heuristics, "run_scheduler", run)


def test_a_unit_past_the_share_of_the_time_is_stopped_and_the_others_kept(monkeypatch, instance):
    monkeypatch.setattr(heuristics, "POOL_FROM_SECONDS", 0.0)
    _sleeping_heuristic(monkeypatch)
    handed = _recording_units(monkeypatch)
    names = ("sarathi-pc", "vllm", SLOW, "sjf-mc", "mcsf-pc")
    limit = 8.0
    started = time.monotonic()
    ledger = _run(instance, UnitRunner(workers=2), limit, warm_start=names)
    took = time.monotonic() - started
    assert handed and took <= HEURISTIC_SHARE * limit + 1.5
    made = [seed.name for seed in ledger.seeds]
    assert SLOW not in made and {"sarathi-pc", "sjf-mc", "mcsf-pc"} <= set(made)
    ran = [names[0], *favoured_first(list(names[1:]), Objective.MEAN_LATENCY), "serial"]
    assert made == [name for name in ran if name in made]  # in the phase's order


def test_an_interrupt_while_the_units_run_ends_the_phase_at_once(monkeypatch, instance):
    monkeypatch.setattr(heuristics, "POOL_FROM_SECONDS", 0.0)
    _sleeping_heuristic(monkeypatch)
    names = ("sarathi-pc", SLOW, "sjf-mc")
    expected = run_scheduler(instance, "sjf-mc").replay.metrics.mean_latency
    timer = threading.Timer(4.0, interrupt.request)
    timer.start()
    started = time.monotonic()
    try:
        ledger = _run(instance, UnitRunner(workers=2), 120, warm_start=names)
    finally:
        timer.cancel()
        interrupt.reset()
    assert time.monotonic() - started <= 4.0 + 1.5
    # the serial schedule is not made after an interrupt; sjf-mc ended beside the sleeper and is kept
    assert [seed.name for seed in ledger.seeds] == ["sarathi-pc", "sjf-mc"]
    assert ledger.seeds[1].value == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("objective", list(Objective))
def test_once_a_schedule_exists_the_mean_objectives_run_the_small_first_heuristics_next(monkeypatch, instance, objective):
    # on a long trace the share of the time ends before the list does: for a mean objective the heuristics
    # that serve small requests first must have run by then; the first schedule still comes from the list's
    # own order (its cheap ones lead it), and total latency keeps the list's order
    ran = []
    real = heuristics.run_heuristic

    def recording(job):
        ran.append(job.name)
        return real(job)

    monkeypatch.setattr(heuristics, "run_heuristic", recording)
    monkeypatch.setattr(heuristics, "POOL_FROM_SECONDS", float("inf"))
    names = ("vllm-hy", "sarathi-pc", "evict-short", *reversed(SMALL_FIRST), "sarathi")
    ledger = Ledger(instance, SolveOptions(objective, warm_start=names), Deadline(None))
    Heuristics().run(ledger)
    until = names.index(ledger.seeds[0].name) + 1  # the heuristics run until the first schedule
    assert until <= 2 and ran[:until] == list(names[:until])
    later = names[until:]
    if objective.is_mean:
        assert ran[until:] == [*SMALL_FIRST, *(n for n in later if n not in SMALL_FIRST)]
    else:
        assert ran[until:] == list(later)
