"""Packing in the search, for total latency: the packed schedule offered to the ledger, and its
admission order handed to the pattern search as a seed."""
from __future__ import annotations

import numpy as np

from ...schedulers.packing import applies as packing_applies
from ...schedulers.packing import pack
from .patterns import admission_keys, search_seeds

#: share of the time left that packing takes: its fits and CP-SAT find shorter schedules than the
#: pattern moves given the same time (bench/results/NOTES.md, "Constants")
PACKING_SHARE = 0.75


class Packing:
    name = "packing"

    def applies(self, ledger) -> bool:
        return (not ledger.objective.is_mean and packing_applies(ledger.instance, ledger.constraints)
                and not ledger.proven)

    def run(self, ledger) -> None:
        """Pack in the orders of the search's seeds and a few of its own."""
        orders = {f"heuristic {k}": np.argsort(admission_keys(s, len(ledger.instance)), kind="stable")
                  for k, s in enumerate(search_seeds(ledger))}
        packing = pack(ledger.instance, ledger.deadline.share(PACKING_SHARE), orders, ledger.fewest_batches)
        ledger.stats["packing"] = packing.stats
        if packing.schedule is not None:
            # also a seed: its order served by the presets, which may pause or evict, can do better still
            ledger.offer(packing.schedule, "packed", seed=True)
