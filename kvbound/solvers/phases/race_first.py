"""Before a model, for the mean objectives: the anytime bounds' race (the Lagrangian bound and its
completion-master variant) for a small share of the time, its bound beside the model's.

On the ground truth's 8-10-request instances the chain model's own bound in 30 s is 88.8-93.8% of
the optimum on the cases it does not close, while the race reaches 93-98% in 1-2 s
(bench/results/NOTES.md, "the Lagrangian before the model"); the model keeps the rest of the time.
"""
from __future__ import annotations

import math

from ... import progress
from ...bounds.base import Stage, registered
from ...bounds.race import Race
from ...interrupt import Stopped

#: the share of the time left that the race takes before the model
SHARE = 0.05
#: fewer requests than this: the model (or the exhaustive search before it) proves them in seconds
MIN_REQUESTS = 6
ROW = "Lagrangian, before the model"


class RaceFirst:
    name = "Lagrangian before the model"

    def applies(self, ledger) -> bool:
        route = ledger.route
        return (route is not None and route.way == "model" and ledger.objective.is_mean
                and len(ledger.instance) >= MIN_REQUESTS and ledger.best is not None
                and not ledger.proven and not ledger.done() and math.isfinite(ledger.deadline.limit))

    def run(self, ledger) -> None:
        progress.report(phase=self.name)
        deadline = ledger.deadline.share(SHARE)
        race = Race(registered(Stage.ANYTIME), ledger, deadline)
        best = -math.inf
        try:
            for _ in race.turns(deadline) if race.members else ():
                if race.best > best:
                    best = race.best
                    ledger.certify(race.row(ROW))
                if ledger.proven or deadline.expired():
                    break
        except Stopped:
            pass
        ledger.stats["lagrangian_before_model"] = {"passes": race.passes, "bound": best if math.isfinite(best) else None}
