"""Lower bounds on the optimal latency, each a registered method of one interface (`base`).

analytic (the instance alone), configuration_lp (total latency: batches of the KV items),
lagrangian and completion_master (mean objectives: anytime, raced in `race`), blocks (mean
objectives: blocks of requests priced together, pairs across them), window_ranks (mean latency, all
arriving together: the window relaxation's minimum as an assignment of ranks), lp_relaxation (the Big-M
model's LP); kv_items holds the KV facts several of them count batches with.
docs/formulation.md, "Bounds", derives each.
"""
from .base import Bound, Stage

__all__ = ["Bound", "Stage"]
