"""The LP relaxation bound of the Big-M model over a certified horizon (HiGHS without integrality)."""
from __future__ import annotations

import math
import time

from ..backends.highs import solve_highs
from ..deadline import Deadline
from ..formulation import FORMULATION_KINDS, MODEL_LIMIT
from ..formulation.bigm import build_bigm
from ..formulation.horizon import horizon_for
from ..interrupt import Stopped
from ..objective import Objective
from ..workload import Instance
from .base import Bound, Stage, register

NAME = "LP relaxation (bigm)"


@register
class LpRelaxation:
    """Before a model, where every bound is asked for: the Big-M model's LP over the horizon that
    the best schedule certifies, in up to half the time left."""

    name, stage, share = "lp_relaxation", Stage.MODEL, 0.5

    def skip_reason(self, known) -> str | None:
        if known.best_schedule is None:
            return "no schedule to derive a horizon from"
        J = horizon_for(known.instance, known.objective, known.best_value)[0]
        size = FORMULATION_KINDS["bigm"].size(known.instance, J)
        return f"the bigm model would have ~{size:,} variables (limit {MODEL_LIMIT:,})" if size > MODEL_LIMIT else None

    def compute(self, known, deadline: Deadline) -> list[Bound]:
        return [lp_bound(known.instance, known.objective, known.best_value, deadline)]


def lp_bound(instance: Instance, objective: Objective, upper_bound: float, deadline: Deadline) -> Bound:
    """The LP relaxation of the Big-M model over a certified horizon (building it counts in the
    deadline; cut short, the bound is -inf and not certified)."""
    t0 = time.perf_counter()
    J, certified, why = horizon_for(instance, objective, upper_bound)
    try:
        with deadline.enforced():
            form = build_bigm(instance, objective, J)
            arrays = form.model.finalize()
    except Stopped as stop:
        return Bound(NAME, -math.inf, time.perf_counter() - t0, False, note=f"{stop.reason} while building the model")
    out = solve_highs(arrays, deadline, None, relax=True)
    value = out.bound / form.objective_scale() if out.status == "optimal" else -math.inf
    return Bound(NAME, value, time.perf_counter() - t0, certified and out.status == "optimal", note=f"horizon J = {J}: {why}")
