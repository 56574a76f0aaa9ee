"""Busy periods, for mean latency and mean TTFT with arrival times: where the best schedule leaves no
request waiting before a later one arrives, the requests split there into windows of consecutive
arrivals, each solved as an instance of its own (its arrivals from 0) by the same plan.

A schedule restricted to some of the requests, every batch at its own start and only as long as their
part of it, is a schedule of those requests alone in which none of them ends later
(docs/formulation.md, "Busy periods"). So for any partition of the requests the windows' certified
bounds add up to a certified bound on the whole, and the windows' best schedules, one after another,
are a schedule of the whole, as good as the sum where no window's schedule runs into the next one's
arrivals. Each window starts from the whole's best schedule restricted to it; a window the time or an
interrupt leaves unsolved counts its requests alone. The windows are independent units: they run on
every core by default, or on Ray (`SolveOptions.units`), and the bound grows as each one ends.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import interrupt, progress
from ...alone import time_alone
from ...bounds.base import Bound
from ...constraints import Constraints
from ...deadline import Deadline
from ...interrupt import Stopped
from ...schedule import Batch, Schedule, validate
from ...units import UnitRunner
from ...workload import Instance
from ..options import SolveOptions

#: the share of the time left the windows take together (the whole instance's route gets the rest)
SHARE = 0.5
#: the bound's row
NAME = "busy periods: each window of arrivals solved alone"
#: fewer windows than this are solved in this process (a pool costs more than they gain)
POOL_FROM = 4


def busy_windows(arrivals: np.ndarray, completion: np.ndarray) -> list[np.ndarray]:
    """The requests (ids) in windows of consecutive arrivals, cut before each arrival at or after which
    every earlier one has completed (`completion`: a schedule's completion times)."""
    order = np.argsort(arrivals, kind="stable")
    ends = np.maximum.accumulate(completion[order])
    cuts = np.flatnonzero(arrivals[order][1:] >= ends[:-1]) + 1
    return np.split(order, cuts)


def window_instance(instance: Instance, members: np.ndarray) -> tuple[Instance, float]:
    """The requests `members` alone, their arrivals less the first of them (a shift changes no latency),
    and that shift."""
    window = Instance(tuple(instance.requests[i] for i in members), instance.system, instance.cost,
                      name=f"{instance.name}[busy period]")
    return window.from_zero(), float(window.arrivals.min())


def restricted(schedule: Schedule, starts: np.ndarray, members: np.ndarray, window: Instance, shift: float) -> Schedule:
    """`schedule`'s batches (which start at `starts`) kept for `members` only, renumbered and each at
    its own start less `shift`: a schedule of `window` in which no request ends later."""
    return split(schedule, starts, [members], [window], [shift])[0]


def split(schedule: Schedule, starts: np.ndarray, windows: list[np.ndarray], instances: list[Instance],
          shifts: list[float]) -> list[Schedule]:
    """`restricted` for every window at once, in one pass over the batches."""
    owner = np.full(len(schedule.requests), -1, dtype=np.int64)
    local = np.zeros(len(schedule.requests), dtype=np.int64)
    for k, members in enumerate(windows):
        owner[members], local[members] = k, np.arange(len(members))
    owner_of, local_of = owner.tolist(), local.tolist()
    batches: list[list[Batch]] = [[] for _ in windows]
    for b, start in zip(schedule.batches, starts.tolist()):
        tokens: dict[int, dict[int, int]] = {}
        evict: dict[int, list[int]] = {}
        for i, c in b.tokens.items():
            if owner_of[i] >= 0:
                tokens.setdefault(owner_of[i], {})[local_of[i]] = c
        for i in b.evict:
            if owner_of[i] >= 0:
                evict.setdefault(owner_of[i], []).append(local_of[i])
        for k in tokens.keys() | evict.keys():
            batches[k].append(Batch(tokens.get(k, {}), tuple(evict.get(k, ())), max(0.0, start - shifts[k])))
    return [Schedule(inst.requests, found) for inst, found in zip(instances, batches)]


def one_after_another(instance: Instance, parts: list[tuple[np.ndarray, Schedule, float]]) -> Schedule:
    """The windows' schedules (members, schedule, shift), in order, each batch at its own start plus
    the window's shift (or later, where the window before runs on): a schedule of `instance`."""
    batches = []
    for members, schedule, shift in parts:
        if all(b.start is not None for b in schedule.batches):
            starts = [b.start for b in schedule.batches]  # a batch starts at the later of its own and the end before
        else:
            starts = validate(schedule_instance(schedule, instance), schedule).batch_start.tolist()
        ids = members.tolist()
        for b, start in zip(schedule.batches, starts):
            batches.append(Batch({ids[k]: c for k, c in b.tokens.items()}, tuple(ids[k] for k in b.evict),
                                 float(start) + shift))
    return Schedule(instance.requests, batches)


@dataclass(frozen=True)
class WindowJob:
    """What a unit that solves one window gets: its instance, the schedule it starts from, the options and
    phases of the solve, and its seconds (made as it starts: `BusyPeriods.run`)."""

    instance: Instance
    start: Schedule
    options: SolveOptions
    phases: tuple
    seconds: float


@dataclass(frozen=True)
class WindowAnswer:
    """A window's certified bound on its mean, its best schedule where it beats the start (else None),
    and whether it is proven."""

    lower: float
    schedule: Schedule | None
    proven: bool


def solve_window(job: WindowJob) -> WindowAnswer:
    """One window by the plan on a ledger of its own (a unit: here, on a worker or on Ray)."""
    from ..ledger import Ledger

    sub = Ledger(job.instance, job.options, Deadline(job.seconds))
    with progress.muted():
        sub.offer(job.start, "the whole's best, restricted", seed=True)
        start = sub.best
        sub.run(job.phases)
    return WindowAnswer(sub.lower, sub.best_schedule if sub.best is not start else None, sub.proven)


class BusyPeriods:
    name = "busy periods"

    def applies(self, ledger) -> bool:
        inst, options = ledger.instance, ledger.options
        return (ledger.objective.is_mean and len(inst) > 1 and np.ptp(inst.arrivals) > 0
                and ledger.constraints == Constraints() and not options.export and ledger.best is not None
                and not ledger.proven and not ledger.deadline.expired() and interrupt.requested() is None)

    def run(self, ledger) -> None:
        instance, objective, whole = ledger.instance, ledger.objective, ledger.best_schedule
        deadline = ledger.deadline.share(SHARE)
        with deadline.enforced():  # on the full Splitwise trace this part alone takes seconds
            replay = validate(instance, whole)
            windows = busy_windows(instance.arrivals, replay.completion)
            if len(windows) < 2:
                return
            cut = [window_instance(instance, members) for members in windows]
            schedules = split(whole, replay.batch_start, windows, [w for w, _ in cut], [shift for _, shift in cut])
            # per window: a bound on its sum (to start with, its requests alone) and its best schedule (to
            # start with, the whole's best restricted to it)
            alone = time_alone(instance, objective)
            sums = [float(alone[members].sum()) for members in windows]
        options = ledger.options.but(every_bound=False, verbose=False)
        parts = [(members, schedule, shift) for members, schedule, (_, shift) in zip(windows, schedules, cut)]
        # the smallest first: they are proven soonest and leave their time to the larger ones
        order = sorted(range(len(windows)), key=lambda k: len(windows[k]))
        runner = ledger.options.units if len(windows) >= POOL_FROM else UnitRunner(workers=1)
        at_once = runner.count(len(windows))
        unstarted = len(instance)  # the requests of the windows not yet started

        def job(k: int, _rounds: int) -> WindowJob:
            # a window's share of the time left: its requests over those of the windows not yet started,
            # times the windows that run at once
            nonlocal unstarted
            size = len(windows[k])
            seconds = deadline.remaining() * min(1.0, at_once * size / unstarted)
            unstarted -= size
            return WindowJob(cut[k][0], parts[k][1], options, ledger.phases, seconds)

        solved = proven = improved = 0
        largest = max(len(w) for w in windows)

        def certify() -> None:
            ledger.certify(Bound(NAME, sum(sums) / len(instance), deadline.elapsed(),
                                 note=f"{len(windows)} windows (the largest {largest} requests); "
                                      f"{solved} solved, {proven} of them proven",
                                 details={"windows": len(windows), "largest": largest, "solved": solved,
                                          "proven": proven, "improved": improved}))

        progress.report(phase=f"{self.name} 0/{len(windows)}")
        answers = runner.run(solve_window, order, start=job)
        try:
            for position, answer in answers:
                k = order[position]
                members = windows[k]
                sums[k] = max(sums[k], answer.lower * len(members))
                if answer.schedule is not None:
                    parts[k] = (members, answer.schedule, parts[k][2])
                    improved += 1
                solved, proven = solved + 1, proven + answer.proven
                with interrupt.deferred():
                    certify()  # the bound as it grows: every window not yet solved counts its requests alone
                progress.report(phase=f"{self.name} {solved}/{len(windows)}")
                if deadline.expired():
                    break
        except Stopped:  # an interrupt: the windows solved so far stand
            pass
        finally:
            answers.close()  # what has not run is cancelled, what runs is stopped
        with interrupt.deferred():  # what the windows gave is kept, whatever comes now
            if improved:
                ledger.offer(one_after_another(instance, parts), self.name)
            certify()


def schedule_instance(schedule: Schedule, like: Instance) -> Instance:
    """The instance of `schedule`'s requests on `like`'s system and cost."""
    return Instance(schedule.requests, like.system, like.cost, name=f"{like.name}[busy period]")
