"""The warm-start heuristics: every named scheduler's schedule, then the serial one, offered to the
ledger; and the route the solve takes from there."""
from __future__ import annotations

import math

from ... import interrupt, progress
from ...bounds.base import Bound, meets
from ...deadline import Deadline
from ...errors import SchedulerRefused, SchedulerStuck
from ...interrupt import Stopped
from ...schedulers import run_scheduler
from ...schedulers.serial import serial_schedule
from ..ledger import Candidate, Ledger
from ..options import SolveOptions
from ..route import route
from .exhaust import NAME as EXHAUSTED
from .periods import NAME as BUSY_PERIODS

#: the part of the time the heuristics may use (they stop at it; a model gets the rest)
HEURISTIC_SHARE = 0.5


class Heuristics:
    """The heuristics of `options.warm_start`, each while time is left (one cut short by the deadline or
    an interrupt is left out), then the serial schedule: valid under every constraint. They share
    HEURISTIC_SHARE of the time, but until one has made a schedule each may take the whole time limit
    and half of what the promise allows past it (`Deadline.with_grace`: where the analytic bounds took
    the time, 1,000 requests at a 1-s limit, a solve still returns a schedule), as a model needs a
    schedule to derive its horizon from."""

    name = "heuristics"

    def applies(self, ledger) -> bool:
        return True

    def run(self, ledger) -> None:
        progress.report(phase=self.name)
        instance, constraints = ledger.instance, ledger.constraints
        deadline = ledger.deadline.share(HEURISTIC_SHARE)
        first = ledger.deadline.with_grace()  # until some schedule exists
        try:
            for name in ledger.options.warm_start or ():
                with (deadline if ledger.seeds else first).enforced():
                    try:
                        result = run_scheduler(instance, name)
                    except (SchedulerRefused, SchedulerStuck):
                        continue
                    ledger.offer(result.schedule, name, result.replay.metrics, seed=True)
        except Stopped:
            pass
        serial_deadline = deadline if ledger.seeds or interrupt.requested() is not None else first
        try:
            with serial_deadline.enforced():
                order = list(constraints.admission_order) if constraints.admission_order is not None else None
                serial = serial_schedule(instance, order, chunked=not constraints.no_chunk)
                if serial is not None:
                    ledger.offer(serial, "serial", seed=True)
        except Stopped:
            pass


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
