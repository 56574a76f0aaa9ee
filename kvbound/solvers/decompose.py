"""The anytime search used where no MIP model fits: bounds and schedules improve until the deadline.

Two things alternate while time is left (docs/formulation.md, "The Lagrangian bound", "The
completion master" and "The admission-pattern search"):
* for mean latency and mean TTFT, a subgradient pass of the Lagrangian bound
  (`formulation.lagrangian`) or of its variant with the completion master
  (`formulation.completion_master`) once the first one's bound stalls; every pass's value is a
  certified bound (none is made where the bound's ceiling is below the analytic bound:
  `lagrangian_ceiling`);
* schedules from admission patterns (an order, and a batch before which each request is not
  admitted): the best schedule's own pattern, the Lagrangian trajectories' (the Lagrangian
  heuristic), then random moves of one request in the best pattern so far, each simulated by an
  ordered unified preset (`OrderedScheduler`) and checked by the validator.
For total latency, packing (`packing`: each request run as alone, the starts chosen by greedy fits
and then CP-SAT, or with arrivals by a fit on a clock) first takes PACKING_SHARE of the time.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .. import progress
from ..deadline import Deadline
from ..errors import SchedulerRefused, SchedulerStuck
from ..interrupt import Stopped
from ..formulation.base import Constraints
from ..formulation.bounds import minimum_work
from ..formulation.completion_master import MasterBound
from ..formulation.lagrangian import LagrangianBound
from ..objective import Objective
from ..schedule import Batch, Metrics, Schedule, validate
from ..schedulers import get_scheduler, simulate
from ..schedulers.unified import OrderedScheduler, UnifiedScheduler
from ..workload import Instance
from .configuration_lp import configuration_batches
from .packing import applies as packing_applies, pack

#: the unified presets whose admission order the search permutes
ORDERED_BASES = ("sjf-mc", "rank-i", "srpt", "srpt:ratio=2", "sjf-mc:prefill_limit=512")
#: the Lagrangian stops after its first pass (zero multipliers) if that is below this share of the
#: analytic bound: with arrivals spread out (which it does not see) it stays far below, often
#: negative (30 Splitwise code requests with their arrival times: -18 s against 0.16 s)
USEFUL_FIRST_PASS = 0.5
#: Lagrangian passes between two rounds of pattern moves, and the moves in a round
PASSES_PER_ROUND = 5
ROUND_MOVES = 8
#: a variant leaves the search once its bound has gained less than this share over its last passes
#: (or its steps vanished): it can stay flat for 100 passes and then rise again (40 tight
#: conversation requests, batch sharing: 1.0282 s from pass 300 to 400, 1.0295 s at 500)
STALLED_PASSES = 200
STALLED_GAIN = 1e-4
#: once the first variant has made STALLED_PASSES passes (or half the time has gone), the variant
#: with the lower bound gets this share of the time, so a bound that creeps without stalling (8
#: code-like requests: 0.23075 s -> 0.23082 s over 200 passes) cannot starve one that would overtake it
FOLLOWER_SHARE = 0.2
#: the most of the time left that the configuration LP (total latency) may take; it stops where it
#: converges, after 0.1-3.5 s on the tight real-trace cases up to 1,000 requests and 4-12 s on the
#: loose ones at 1,000 (cut earlier, Farley's bound is far weaker: 30 tight arXiv requests, 2,058
#: batches after 0.5 s, 2,173 at 0.76 s)
CONFIGURATION_SHARE = 0.5
#: share of the time left that packing (total latency) takes:
#: on 30 tight arXiv requests its CP-SAT model found 14.44 s in 30 s where 120 s of pattern moves
#: had found 15.14 s
PACKING_SHARE = 0.75


@dataclass
class SearchOutcome:
    bound: float  # -inf: no Lagrangian bound (total latency, or no time for a pass)
    schedule: Schedule | None  # the best schedule the search found, if it beats the one it started from
    metrics: Metrics | None  # the validator's metrics of that schedule
    value: float
    name: str
    stats: dict = field(default_factory=dict)


def lagrangian_ceiling(instance: Instance, objective: Objective, schedule: Schedule) -> float:
    """The most the Lagrangian bounds can certify on `instance` (seconds; mean objectives).

    Both see every request from time 0, so each is at most the optimum of the instance with every
    arrival at 0 less the mean arrival time, and that optimum is at most `schedule`'s there (its
    batches back to back). With arrivals spread over minutes this is far below zero, and their first
    pass alone (four pricings) took the whole 600 s on 1,000 Splitwise conversation requests."""
    arrivals = instance.arrivals
    if not len(arrivals) or (arrivals == arrivals[0]).all():
        return math.inf  # all at once: nothing to relax
    at_zero = Instance(tuple(replace(r, arrival=0.0) for r in instance.requests), instance.system, instance.cost)
    batches = [Batch(dict(b.tokens), b.evict) for b in schedule.batches]
    return objective.of(validate(at_zero, Schedule(at_zero.requests, batches)).metrics) - float(arrivals.mean())


def admission_keys(schedule: Schedule, n: int) -> np.ndarray:
    """Per request, the batch it is first processed in (an admission pattern)."""
    keys = np.full(n, float(len(schedule.batches)))
    for j, batch in enumerate(reversed(schedule.batches)):
        for i in batch.tokens:
            keys[i] = len(schedule.batches) - 1 - j
    return keys


@dataclass
class Pattern:
    """An admission pattern: the order (keys), the batches before which no request is admitted
    (hold; None: at once) and the preset that serves it."""

    keys: np.ndarray
    hold: np.ndarray | None
    base: UnifiedScheduler

    def moved(self, rng: random.Random, batches: int) -> "Pattern":
        """One random move: a request to another place in the order, its hold later or earlier, or released."""
        keys = self.keys.copy()
        hold = None if self.hold is None else self.hold.copy()
        i = rng.randrange(len(keys))
        if not self.base.ranks_by_keys:  # the base keeps its own order: only holds move
            hold = np.zeros(len(keys)) if hold is None else hold
            move = rng.randrange(1, 3)
        else:
            move = rng.randrange(3) if hold is not None else 0
        if move == 0:
            keys[i] = keys[rng.randrange(len(keys))] + rng.choice((-0.5, 0.5))
        elif move == 1:
            hold[i] = max(0.0, hold[i] + rng.choice((-1, 1)) * rng.randint(1, max(2, batches // 20)))
        else:
            hold[i] = 0.0
        return Pattern(keys, hold, self.base)


def search(instance: Instance, objective: Objective, constraints: Constraints, start: Schedule, start_value: float,
           deadline: Deadline, trajectory: "Trajectory", satisfies, known_bound: float = -math.inf,
           seed: int = 0, others: tuple[Schedule, ...] = ()) -> SearchOutcome:
    """Improve the bound and the schedule until `deadline`, or until a schedule meets the bound (the
    Lagrangian one or `known_bound`, a certified one from elsewhere); `trajectory` gets (seconds,
    best, bound) points as they improve (`Trajectory`); `satisfies(instance, schedule, constraints)`
    filters schedules. The admission patterns of `start` and of `others` (more good schedules)
    seed the search."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    best = SearchOutcome(-math.inf, None, None, start_value, "")
    bases = [p for p in (get_scheduler(b) for b in ORDERED_BASES) if isinstance(p, UnifiedScheduler)]
    tried = simulated = 0
    cap = constraints.objective_cap
    # moves start from the best pattern simulated so far, even while its schedule is worse than
    # the start schedule (which no pattern may reproduce exactly)
    incumbent, incumbent_value = None, math.inf
    # and the best pattern whose order is its keys (sjf-mc, rank-i): every other move starts there,
    # so that an srpt incumbent (whose moves only shift holds) does not take every move
    keyed, keyed_value = None, math.inf

    def consider(pattern: Pattern, name: str) -> None:
        nonlocal simulated, tried, incumbent, incumbent_value, keyed, keyed_value
        tried += 1
        try:
            with deadline.enforced():
                res = simulate(instance, OrderedScheduler(pattern.base, pattern.keys, pattern.hold))
        except (SchedulerRefused, SchedulerStuck, ValueError):
            return
        simulated += 1
        value = objective.of(res.replay.metrics)
        if (cap is not None and value > cap * (1 + 1e-12)) or not satisfies(instance, res.schedule, constraints):
            return
        if value < incumbent_value:
            incumbent, incumbent_value = pattern, value
        if pattern.base.ranks_by_keys and value < keyed_value:
            keyed, keyed_value = pattern, value
        if value < best.value * (1 - 1e-12):
            offer(res.schedule, f"{name}:{pattern.base.name}")

    def offer(schedule: Schedule, name: str) -> None:
        """Keep `schedule` if the validator's latency beats the best (and it meets the constraints)."""
        metrics = validate(instance, schedule).metrics  # the one validator's numbers
        checked = objective.of(metrics)
        if (checked >= best.value * (1 - 1e-12) or (cap is not None and checked > cap * (1 + 1e-12))
                or not satisfies(instance, schedule, constraints)):
            return
        best.schedule, best.metrics, best.value, best.name = schedule, metrics, checked, name
        progress.report(best=checked)
        trajectory.record(best=checked)
        for track in tracks:
            track.bound.target = checked  # Polyak steps aim at the best value known

    def proven() -> bool:
        """The best schedule meets a certified bound (the Lagrangian one or `known_bound`): optimal."""
        return max(best.bound, known_bound) >= best.value * (1 - 1e-9)

    tracks: list[_Track] = []
    why_none = "none for total latency" if not objective.is_mean else "none: no pass finished in time"
    if objective.is_mean:
        try:
            with deadline.enforced():  # a replay: under a second on 1,000 requests
                ceiling = lagrangian_ceiling(instance, objective, start)
        except Stopped:
            ceiling = -math.inf  # no time left (or interrupted): no pass could run either
        if ceiling > known_bound:
            horizon = max(1, int(1.1 * len(start.batches)))
            lagrangian = LagrangianBound(instance, objective, horizon)
            tracks.append(_Track("batch sharing", lagrangian, lagrangian.iterate(start_value)))
            master = MasterBound.where_it_fits(instance, objective, horizon)
            if master is not None:
                tracks.append(_Track("completion master", master, master.iterate(start_value)))
        elif math.isfinite(ceiling):
            why_none = (f"none: it sees every request from time 0, so it stays below {ceiling:.6g} s (the best "
                        "schedule with every arrival at 0, less the mean arrival), under the analytic bound")
    n_pass, best_track, all_tracks, turns = 0, None, list(tracks), _Turns(deadline)
    packing_stats = configuration_stats = None
    fewest_batches = 0  # a lower bound on every schedule's batches, once the configuration LP has one
    try:
        seeds = set()  # two heuristics may give the same schedule (srpt at ratio 1 and 2): one pattern

        def seed(schedule: Schedule) -> None:  # a good schedule's own pattern, with and without its admission batches
            admitted = admission_keys(schedule, len(instance))
            if admitted.tobytes() in seeds:
                return
            seeds.add(admitted.tobytes())
            for base in bases:
                consider(Pattern(admitted, admitted.copy(), base), "pattern")
                consider(Pattern(admitted, None, base), "pattern")

        for schedule in (start, *others):
            seed(schedule)
        if not objective.is_mean and not proven():  # total latency >= batches x intercept + work
            config = configuration_batches(instance, deadline.share(CONFIGURATION_SHARE))
            value = config.batches * instance.cost.intercept + minimum_work(instance)
            configuration_stats = {**config.to_json(), "bound": value}
            fewest_batches = config.batches
            if value > known_bound:
                known_bound = value
                progress.report(analytic=value)
                trajectory.record(bound=value)
        if not objective.is_mean and packing_applies(instance, constraints) and not proven():  # total latency ~ batches
            orders = {f"heuristic {k}": np.argsort(admission_keys(s, len(instance)), kind="stable")
                      for k, s in enumerate((start, *others))}
            packing = pack(instance, deadline.share(PACKING_SHARE), orders, fewest_batches)
            packing_stats = packing.stats
            if packing.schedule is not None:
                offer(packing.schedule, "packed")
                # its admission order served by the presets, which may pause or evict: on 30 tight
                # arXiv requests sjf-mc in the packed order did 14.436 s against its 14.510 s
                seed(packing.schedule)
        while not deadline.expired():
            if tracks:
                pricing = track = None
                for _ in range(PASSES_PER_ROUND):
                    # batch sharing first: it is the better bound on conversation and arXiv, where
                    # equal time cost it more than the master gained; the master (better on the
                    # code trace) gets a share once it has warmed up, and all of it if it stalls
                    track, sharing = turns.next(tracks)
                    began = time.perf_counter()
                    with deadline.enforced():  # a pass on 1,000 requests takes minutes: it is cut at the deadline
                        value, pricing, _ = next(track.iterations, (None, None, None))
                    spent = time.perf_counter() - began
                    track.seconds += spent
                    track.shared += spent if sharing else 0.0
                    if value is None:
                        tracks.remove(track)
                        pricing = None
                        if not tracks:
                            break
                        continue
                    n_pass += 1
                    track.history.append(max(track.value, value))
                    if (len(tracks) > 1 and track.passes > STALLED_PASSES
                            and track.value - track.history[-STALLED_PASSES - 1] <= STALLED_GAIN * abs(track.value)):
                        tracks.remove(track)  # its bound stalls: the next variant takes the time
                    if track.passes == 1 and track is all_tracks[0]:
                        if value < USEFUL_FIRST_PASS * known_bound:
                            # arrivals neither variant sees (the master starts where this one is): the
                            # time goes to schedules instead
                            tracks, pricing = [], None
                            why_none = ("none kept: its first pass was below half the analytic bound (it does not "
                                        "see arrival times)")
                            break
                    if value > best.bound:
                        best.bound, best_track = value, track.name
                        progress.report(analytic=value)
                        trajectory.record(bound=value)
                    if deadline.expired():
                        break
                if pricing is not None:  # the Lagrangian heuristic: admit in the trajectories' order and time
                    keys = pricing.start.astype(float)
                    hold = np.maximum(0.0, keys - track.bound.first_prefill)
                    for base in bases:
                        for name, pattern in (("lagrangian", Pattern(keys, hold, base)),
                                              ("lagrangian-order", Pattern(keys, None, base))):
                            consider(pattern, name)
            if proven():
                break
            for move in range(ROUND_MOVES if incumbent is not None else 0):  # moves from the best patterns so far
                if deadline.expired():
                    break
                source = keyed if move % 2 and keyed is not None else incumbent
                consider(source.moved(rng, len(start.batches)), "pattern")
            if incumbent is None and not tracks:
                break  # no pattern can be simulated (every preset refuses the case)
    except Stopped:
        pass
    best.stats = {"lagrangian_passes": n_pass, "patterns_tried": tried, "patterns_simulated": simulated,
                  "search_seconds": time.perf_counter() - t0,
                  "lagrangian_note": "every multiplier gives a bound" if math.isfinite(best.bound) else why_none}
    if math.isfinite(best.bound):
        best.stats["lagrangian_variant"] = best_track
    if packing_stats is not None:
        best.stats["packing"] = packing_stats
    if configuration_stats is not None:
        best.stats["configuration_lp"] = configuration_stats
    best.stats["lagrangian_variants"] = {t.name: {"passes": t.passes, "seconds": round(t.seconds, 3),
                                                  "bound": t.value if math.isfinite(t.value) else None}
                                         for t in all_tracks}
    return best


class _Turns:
    """Whose pass comes next: the first variant alone until it has made STALLED_PASSES passes (or
    half the search's time has gone: passes are slower on a busy machine), then the lower bound gets
    FOLLOWER_SHARE of the time, counted from when the leader took the lead (so a new leader does
    not owe the old one the time it had)."""

    def __init__(self, deadline: Deadline):
        self.leader: _Track | None = None
        self.warm_up = deadline.share(0.5)

    def next(self, tracks: list[_Track]) -> tuple[_Track, bool]:
        """The track, and whether the time is shared yet (its pass then adds to its `shared`)."""
        if len(tracks) == 1 or (tracks[0].passes <= STALLED_PASSES and not self.warm_up.expired()):
            return tracks[0], False
        leader = max(tracks, key=lambda t: t.value)
        if leader is not self.leader:
            self.leader = leader
            for t in tracks:
                t.shared = 0.0
        return min(tracks, key=lambda t: t.shared / (1 - FOLLOWER_SHARE if t is leader else FOLLOWER_SHARE)), True


@dataclass
class _Track:
    """One Lagrangian bound's subgradient passes in the search."""

    name: str
    bound: LagrangianBound | MasterBound
    iterations: object  # its `iterate` generator
    seconds: float = 0.0  # spent in its passes
    shared: float = 0.0  # of which since the leader took the lead (`_Turns`)
    history: list = field(default_factory=list)  # its best bound after each pass

    @property
    def passes(self) -> int:
        return len(self.history)

    @property
    def value(self) -> float:
        """Its best bound so far."""
        return self.history[-1] if self.history else -math.inf


class Trajectory:
    """The best schedule's value and the certified bound over time, one point per improvement."""

    def __init__(self, deadline: Deadline):
        self.deadline, self.best, self.bound, self.points = deadline, None, -math.inf, []

    def record(self, best: float | None = None, bound: float | None = None) -> None:
        if best is not None and (self.best is None or best < self.best):
            self.best = best
        if bound is not None and bound > self.bound:
            self.bound = bound
        self.points.append({"seconds": round(self.deadline.elapsed(), 3), "best": self.best,
                            "bound": self.bound if math.isfinite(self.bound) else None})
