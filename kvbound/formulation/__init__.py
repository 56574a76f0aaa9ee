"""The formulations kvbound solves, each described once (docs/formulation.md).

`FORMULATION_KINDS` maps a name to what the formulation is: how to build it, how large it gets,
how it represents evict-only batches, and what it cannot express. `solve()` reads these instead
of branching on names.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import Constraints, Formulation
from .bigm import bigm_size, build_bigm
from .chain import build_chain, chain_size
from .network import build_network, network_size


@dataclass(frozen=True)
class FormulationKind:
    name: str
    build: Callable[..., Formulation]  # (instance, objective, horizon, constraints, tick=) -> Formulation
    size: Callable  # (instance, horizon) -> about how many variables
    folds_evict_only: bool  # an evict-only batch is part of the next model batch (state networks)
    fixes_admission_order: bool  # can express Constraints.admission_order
    summary: str

    def batches_needed(self, schedule) -> int:
        """Model batches a (warm-start) schedule occupies."""
        if self.folds_evict_only:
            trailing_evict = bool(schedule.batches) and not schedule.batches[-1].tokens
            return sum(1 for b in schedule.batches if b.tokens) + int(trailing_evict)
        return sum(1 for b in schedule.batches if b.tokens or b.evict)


FORMULATION_KINDS: dict[str, FormulationKind] = {k.name: k for k in (
    FormulationKind("chain", build_chain, chain_size, True, False,
                    "token-chain state network: O(I) arcs per class and batch (default)"),
    FormulationKind("network", build_network, network_size, True, False,
                    "state network: one transition per (state, chunk), O(I^2) per class and batch"),
    FormulationKind("bigm", build_bigm, bigm_size, False, True, "the seed paper's Big-M model, completed"),
)}

__all__ = ["Constraints", "Formulation", "FormulationKind", "FORMULATION_KINDS"]
