"""The LP relaxation bound of the Big-M model (a solver-computed bound; the analytic ones are in
`kvbound.formulation.bounds`)."""
from __future__ import annotations

import math
import time

from ..formulation.bigm import build_bigm
from ..formulation.base import horizon_for
from ..formulation.bounds import Bound
from ..workload import Instance
from .backends import solve_highs


def lp_bound(instance: Instance, objective: str, upper_bound: float, time_limit: float = 60.0) -> Bound:
    """The LP relaxation of the Big-M model over a certified horizon."""
    t0 = time.perf_counter()
    J, certified, why = horizon_for(instance, objective, upper_bound)
    form = build_bigm(instance, objective, J)
    out = solve_highs(form.model.finalize(), time_limit, None, relax=True)
    value = out.bound / form.objective_scale() if out.status == "optimal" else -math.inf
    return Bound("LP relaxation (bigm)", value, time.perf_counter() - t0, certified and out.status == "optimal",
                 note=f"horizon J = {J}: {why}")
