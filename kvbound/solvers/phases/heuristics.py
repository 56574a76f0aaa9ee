"""The warm-start heuristics: every named scheduler's schedule, then the serial one, offered to the
ledger; and the route the solve takes from there."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ... import interrupt, progress
from ...bounds.base import Bound, meets
from ...deadline import Deadline
from ...errors import SchedulerRefused, SchedulerStuck
from ...interrupt import Stopped
from ...schedule import Metrics, Schedule
from ...objective import Objective
from ...schedulers import SMALL_FIRST, run_scheduler
from ...schedulers.serial import serial_schedule
from ...workload import Instance
from ..ledger import Candidate, Ledger
from ..options import SolveOptions
from ..route import route
from .exhaust import NAME as EXHAUSTED
from .periods import NAME as BUSY_PERIODS

#: the part of the time the heuristics may use (they stop at it; a model gets the rest)
HEURISTIC_SHARE = 0.5
#: the heuristics left go to every core (or Ray) where, at the pace of the last one, they would take
#: longer than this one after another (a pool's start and the instance's travel cost far less)
POOL_FROM_SECONDS = 5.0


@dataclass(frozen=True)
class HeuristicJob:
    """One heuristic on the instance, within `seconds` (a unit of `kvbound.units`)."""

    instance: Instance
    name: str
    seconds: float


def run_heuristic(job: HeuristicJob) -> tuple[Schedule, Metrics] | None:
    """The heuristic's schedule and its replay; None where it refuses the instance, gets stuck, runs out
    of time or is interrupted."""
    try:
        with Deadline(job.seconds).enforced():
            result = run_scheduler(job.instance, job.name)
    except (SchedulerRefused, SchedulerStuck, Stopped):
        return None
    return result.schedule, result.replay.metrics


class Heuristics:
    """The heuristics of `options.warm_start`, each while time is left (one cut short by the deadline or
    an interrupt is left out), then the serial schedule: valid under every constraint. They share
    HEURISTIC_SHARE of the time, but until one has made a schedule each may take the whole time limit
    and half of what the promise allows past it (`Deadline.with_grace`: where the analytic bounds took
    the time, 1,000 requests at a 1-s limit, a solve still returns a schedule), as a model needs a
    schedule to derive its horizon from, so until then they run in the list's order (cheap ones lead
    it). Once one has, for the mean objectives those that serve small requests first come next
    (`favoured_first`), and where the rest would take long here (a large trace: seconds each), they run
    as units on every core or on Ray (`SolveOptions.units`) and are offered in their order, whichever
    ends first."""

    name = "heuristics"

    def applies(self, ledger) -> bool:
        return True

    def run(self, ledger) -> None:
        progress.report(phase=self.name)
        deadline = ledger.deadline.share(HEURISTIC_SHARE)
        first = ledger.deadline.with_grace()  # until some schedule exists
        names = list(ledger.options.warm_start or ())
        runner = ledger.options.units
        k = 0
        while k < len(names):
            now = deadline if ledger.seeds else first
            if now.expired():
                break
            started, had_one = time.monotonic(), bool(ledger.seeds)
            _offer(ledger, names[k], run_heuristic(HeuristicJob(ledger.instance, names[k], now.remaining())))
            k += 1
            if ledger.seeds and not had_one:  # the first schedule: the rest in the objective's order
                names[k:] = favoured_first(names[k:], ledger.objective)
            rest = names[k:]
            if (ledger.seeds and rest and (time.monotonic() - started) * len(rest) >= POOL_FROM_SECONDS
                    and runner.count(len(rest)) > 1):
                _as_units(ledger, rest, deadline)
                break
        serial_deadline = deadline if ledger.seeds or interrupt.requested() is not None else first
        try:
            with serial_deadline.enforced():
                constraints = ledger.constraints
                order = list(constraints.admission_order) if constraints.admission_order is not None else None
                serial = serial_schedule(ledger.instance, order, chunked=not constraints.no_chunk)
                if serial is not None:
                    ledger.offer(serial, "serial", seed=True)
        except Stopped:
            pass


def favoured_first(names: list[str], objective: Objective) -> list[str]:
    """`names` with, for the mean objectives, those of SMALL_FIRST first in its order, then the others in
    theirs: on a long trace the share of the time may end before the list does."""
    if not objective.is_mean:
        return list(names)
    return [n for n in SMALL_FIRST if n in names] + [n for n in names if n not in SMALL_FIRST]


def _offer(ledger: Ledger, name: str, answer: tuple[Schedule, Metrics] | None) -> None:
    if answer is not None:
        schedule, metrics = answer
        ledger.offer(schedule, name, metrics, seed=True)


def _as_units(ledger: Ledger, names: list[str], deadline: Deadline) -> None:
    """`names` as units until `deadline`, each offered as soon as those before it in `names` are (the
    same seeds, in the same order, as one after another)."""
    finished: dict[int, tuple[Schedule, Metrics] | None] = {}
    offered = 0
    answers = ledger.options.units.run(
        run_heuristic, names, start=lambda name, rounds: HeuristicJob(ledger.instance, name, deadline.remaining()))
    try:
        with deadline.enforced():
            for k, answer in answers:
                finished[k] = answer
                with interrupt.deferred():  # an offer is not cut in half
                    while offered in finished:
                        _offer(ledger, names[offered], finished.pop(offered))
                        offered += 1
    except Stopped:
        pass
    finally:
        answers.close()  # stops the units still running
    for k in sorted(finished):  # those that ended after one cut short
        _offer(ledger, names[k], finished[k])


def heuristic_candidates(instance, options: SolveOptions) -> list[Candidate]:
    """The schedules the heuristics of `options.warm_start` and the serial one give that meet the
    constraints, each validated, in order, without a time limit (what a solve starts from)."""
    ledger = Ledger(instance, options, Deadline(None))
    Heuristics().run(ledger)
    return ledger.seeds


def _why_proven(ledger) -> str:
    """Which bound the best schedule met before any model."""
    def met(name: str) -> bool:
        return name in ledger.rows and meets(ledger.best.value, ledger.rows[name].value)
    if met(EXHAUSTED):
        return "the best schedule meets the exhaustive search's bound: optimal without a model"
    if met(BUSY_PERIODS):
        return "the busy periods, each solved to a proof, meet the best schedule: optimal without a model"
    return "the best heuristic schedule meets the analytic bound: optimal without a model"


class ChooseRoute:
    """A model (which, at what horizon) or the search, from the best schedule meeting the constraints;
    none where the heuristics were stopped before any schedule."""

    name = "route"

    def __init__(self, backends):
        self.backends = backends

    def applies(self, ledger) -> bool:
        return ledger.upper is not None or not ledger.deadline.expired()

    def run(self, ledger) -> None:
        upper = ledger.upper
        if upper is None:
            ledger.impossible = ledger.constraints.impossible(ledger.instance)
            if ledger.impossible is not None:  # proven infeasible: nothing to route
                ledger.certify(Bound("the constraints", math.inf, note=ledger.impossible))
                return
        ledger.route = chosen = route(ledger.instance, ledger.options, self.backends,
                                      upper.schedule if upper else None, upper.value if upper else None)
        if ledger.done() and ledger.proven:
            # a heuristic schedule meets a certified bound (valid under any constraints): it is optimal,
            # and a model could add nothing but time and memory
            ledger.skipped = _why_proven(ledger)
        elif chosen.way == "none":
            ledger.skipped = chosen.why_not
