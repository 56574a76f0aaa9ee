"""The search, where no model is solved: bounds and schedules improve until the deadline or a proof.

First, for the mean objectives, the burst schedules' grid (`bursts`), then the admission patterns of
the best heuristic schedules (`patterns`), then the one-shot steps (for total latency the
configuration LP and packing, each with its share of the time), then rounds
of the anytime bounds' race (`kvbound.bounds.race`: for mean latency and mean TTFT the Lagrangian
bound and its completion-master variant), each round followed by the patterns the best bound's
trajectories hint (the Lagrangian heuristic), random pattern moves and the burst schedules' local
moves (docs/formulation.md, "The
Lagrangian bound", "The completion master" and "The admission-pattern search").
"""
from __future__ import annotations

import math
import time

from ... import progress
from ...bounds.base import Bound, Stage, registered
from ...bounds.race import Race
from ...interrupt import Stopped
from .patterns import Patterns, search_seeds

#: anytime-bound passes in a round, between two rounds of pattern moves
PASSES_PER_ROUND = 5
#: the bound row of the race
RACE_ROW = "Lagrangian"


class Search:
    name = "search"

    def __init__(self, steps):
        self.steps = steps  # one-shot phases run before the race, in order

    def applies(self, ledger) -> bool:
        """Where no model is solved, and after a model that ended with time left and neither a proof of
        infeasibility nor the optimum of a model that holds one (a certified horizon): a solve that is
        not proven keeps improving until its limit. (An objective cap or skip_proven=False can leave a
        solved model unproven by the ledger's rule; the model's own proof then ends the solve.)"""
        route, run = ledger.route, ledger.model
        if route is None or ledger.best is None or ledger.done() or ledger.proven:
            return False
        if route.way != "model":
            return True
        return run is not None and not run.infeasible and not (run.backend_status == "optimal" and route.certified)

    def run(self, ledger) -> None:
        progress.report(phase=self.name)
        began, deadline = time.perf_counter(), ledger.deadline
        seeds = search_seeds(ledger)
        # the race starts where the best heuristic schedule is (its horizon, its value as the first target)
        race = Race(registered(Stage.ANYTIME), ledger, deadline)
        patterns = Patterns(ledger, len(seeds[0].batches))
        movers = []  # the steps that ran and move on in every round (`moves`)

        def run_step(step):
            known = len(ledger.seeds)
            if step.applies(ledger):
                step.run(ledger)
                if hasattr(step, "moves"):
                    movers.append(step)
            for candidate in ledger.seeds[known:]:
                patterns.seed(candidate.schedule)

        try:
            # steps marked `before_patterns` (cheap builds: the bursts' grid) run before the seeds' patterns,
            # whose simulations can take the whole time left on a few hundred requests
            for step in self.steps:
                if getattr(step, "before_patterns", False):
                    run_step(step)
            for schedule in seeds:
                patterns.seed(schedule)
            for step in self.steps:
                if not getattr(step, "before_patterns", False):
                    run_step(step)
            self._rounds(ledger, race, patterns, movers)
        except Stopped:
            pass
        finally:
            self._report(ledger, race, patterns, time.perf_counter() - began)

    def _rounds(self, ledger, race: Race, patterns: Patterns, movers=()) -> None:
        deadline = ledger.deadline
        turns = race.turns(deadline) if race.members else None
        best = -math.inf
        while not deadline.expired():
            if turns is not None:
                hint = None
                for _ in range(PASSES_PER_ROUND):
                    found = next(turns, StopIteration)
                    if found is StopIteration:
                        turns, hint = None, None
                        break
                    hint = found.hint if found is not None else None  # None: a member left
                    if race.best > best:
                        best = race.best
                        ledger.certify(race.row(RACE_ROW))
                    if deadline.expired():
                        break
                if hint is not None:
                    patterns.hint(hint)
            if ledger.proven:
                break
            patterns.moves()
            moving = False
            for mover in movers:
                if ledger.proven or deadline.expired():
                    break
                moving = mover.moves(ledger) or moving
            if patterns.incumbent is None and turns is None and not moving:
                break  # no pattern can be simulated (every preset refuses the case) and no bound passes

    def _report(self, ledger, race: Race, patterns: Patterns, seconds: float) -> None:
        found = math.isfinite(race.best)
        note = "every multiplier gives a bound" if found else race.note
        row = ledger.certify(Bound(RACE_ROW, race.best, sum(m.seconds for m in race.all), certified=found,
                                   note=f"{race.leader} variant, {race.passes} passes: {note}" if found else note))
        how = ledger.route.why_not if ledger.route.way == "search" else "after the model, in the time it left: "
        how += "packing, " if "packing" in ledger.stats else ""
        ledger.stats.update({
            "search": how + "Lagrangian bound and admission-pattern search",
            "lagrangian_passes": race.passes, "patterns_tried": patterns.tried, "patterns_simulated": patterns.simulated,
            "search_seconds": seconds, "lagrangian_note": note if row.found or not found else row.note,
            "lagrangian_variants": race.report(), "lagrangian_bound": row.value if row.found else None})
        if row.found:
            ledger.stats["lagrangian_variant"] = race.leader
