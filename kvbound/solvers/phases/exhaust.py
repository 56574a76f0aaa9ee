"""Tiny instances: their states exhausted (`kvbound.bounds.exhaustive`), the optimum and its proof."""
from __future__ import annotations

import time

from ... import progress
from ...bounds.base import Bound
from ...bounds.exhaustive import exhaust, searchable

#: the part of the time left the search may take (it stops at its budget of states before that)
EXHAUST_SHARE = 0.5
#: the row's name in `kvbound bound` and `solve --json`'s bounds, and its schedule's source
NAME = "the states exhausted: a shortest path over batches"
SOURCE = "exhaustive search"


class Exhaust:
    """Where the instance's states within M are few, A* over them (the default solve: `auto` formulation
    and solver, no horizon or export; a named model, solver or horizon is solved as asked): an optimal
    schedule and the bound that proves it, or, cut short, the least priority left open as a certified
    bound."""

    name = "exhaust"

    def applies(self, ledger) -> bool:
        options = ledger.options
        return (options.formulation == "auto" and options.backend == "auto" and options.horizon is None
                and not options.export and not ledger.proven and not ledger.deadline.expired()
                and searchable(ledger.instance) is None)

    def run(self, ledger) -> None:
        progress.report(phase=self.name)
        t0 = time.perf_counter()
        constraints = ledger.constraints  # the others only remove schedules: the search's bound stays one
        found = exhaust(ledger.instance, ledger.objective, ledger.deadline.share(EXHAUST_SHARE),
                        allow_evict=not constraints.no_evict, max_batch_size=constraints.max_batch_size)
        if found.schedule is not None:
            ledger.offer(found.schedule, SOURCE)
        note = (f"optimal over every schedule ({found.expanded:,} states expanded)" if found.exact else
                f"cut short after {found.expanded:,} states; the least cost still open")
        ledger.certify(Bound(NAME, found.bound, time.perf_counter() - t0, note=note))
