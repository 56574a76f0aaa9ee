"""The formulations kvbound solves, each described once (docs/formulation.md).

`FORMULATION_KINDS` maps a name to what the formulation is: how to build it, how large it gets,
how it represents evict-only batches, what it can express, and up to which size `--formulation
auto` picks it. The solve driver reads these instead of branching on names.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..constraints import Constraints
from .base import Formulation
from .bigm import bigm_size, build_bigm
from .chain import build_chain, chain_size
from .network import build_network, network_size

#: larger models are not built (memory on a 24 GiB machine): the best heuristic schedule is reported
#: with the analytic bounds instead
MODEL_LIMIT = 1_500_000


@dataclass(frozen=True)
class FormulationKind:
    name: str
    build: Callable[..., Formulation]  # (instance, objective, horizon, constraints, tick=) -> Formulation
    size: Callable  # (instance, horizon) -> about how many variables
    folds_evict_only: bool  # an evict-only batch is part of the next model batch (state networks)
    fixes_admission_order: bool  # can express Constraints.admission_order
    auto_limit: int  # `auto` builds it up to this many variables (0: never), in this table's order
    summary: str

    def batches_needed(self, schedule) -> int:
        """Model batches a (warm-start) schedule occupies."""
        if self.folds_evict_only:
            trailing_evict = bool(schedule.batches) and not schedule.batches[-1].tokens
            return sum(1 for b in schedule.batches if b.tokens) + int(trailing_evict)
        return sum(1 for b in schedule.batches if b.tokens or b.evict)

    def expresses(self, constraints: Constraints) -> bool:
        """Whether the model can express every hypothesis constraint."""
        return constraints.admission_order is None or self.fixes_admission_order


FORMULATION_KINDS: dict[str, FormulationKind] = {k.name: k for k in (
    FormulationKind("chain", build_chain, chain_size, True, False, MODEL_LIMIT,
                    "token-chain state network: O(I) arcs per class and batch (default)"),
    FormulationKind("network", build_network, network_size, True, False, 0,
                    "state network: one transition per (state, chunk), O(I^2) per class and batch"),
    # past 100,000 variables Big-M models of real traces returned their warm start with weak bounds in
    # 120 s, where the search improves both (bench/results/NOTES.md)
    FormulationKind("bigm", build_bigm, bigm_size, False, True, 100_000, "the seed paper's Big-M model, completed"),
)}

__all__ = ["Constraints", "Formulation", "FormulationKind", "FORMULATION_KINDS", "MODEL_LIMIT"]
