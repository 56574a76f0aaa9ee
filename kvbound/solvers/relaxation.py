"""The LP relaxation bound of the Big-M model (a solver-computed bound; the analytic ones are in
`kvbound.formulation.bounds`)."""
from __future__ import annotations

import math
import time

from ..deadline import Deadline
from ..interrupt import Stopped
from ..formulation.base import horizon_for
from ..formulation.bigm import build_bigm
from ..formulation.bounds import Bound, analytic_bounds
from ..workload import Instance
from ..formulation import FORMULATION_KINDS
from . import api
from .api import Result, solve_with
from .backends import solve_highs
from .options import SolveOptions


def lp_bound(instance: Instance, objective: str, upper_bound: float, time_limit: float = 60.0) -> Bound:
    """The LP relaxation of the Big-M model over a certified horizon (building it counts in `time_limit`;
    cut short, the bound is -inf and not certified)."""
    t0 = time.perf_counter()
    limit = Deadline(time_limit)
    J, certified, why = horizon_for(instance, objective, upper_bound)
    try:
        with limit.enforced():
            form = build_bigm(instance, objective, J)
            arrays = form.model.finalize()
    except Stopped as stop:
        return Bound("LP relaxation (bigm)", -math.inf, time.perf_counter() - t0, False,
                     note=f"{stop.reason} while building the model")
    out = solve_highs(arrays, max(0.01, limit.remaining()), None, relax=True)
    value = out.bound / form.objective_scale() if out.status == "optimal" else -math.inf
    return Bound("LP relaxation (bigm)", value, time.perf_counter() - t0, certified and out.status == "optimal",
                 note=f"horizon J = {J}: {why}")


def lower_bounds(instance: Instance, options: SolveOptions, deadline: Deadline | None = None) -> tuple[list[Bound], Result]:
    """Every lower bound kvbound has, cheapest first: the analytic ones, the LP relaxation of the
    Big-M model and the MILP dual bound; and the solve that gave the MILP bound (and the upper bound
    the LP's horizon needs). The MILP gets half of the time, the LP what is left; where no model
    fits, the search (its Lagrangian bound) gets it all."""
    deadline = deadline if deadline is not None else Deadline(options.time_limit)
    bounds = list(analytic_bounds(instance, options.objective))
    res = solve_with(instance, options, deadline, analytic=max(b.value for b in bounds), model_deadline=deadline.share(0.5))
    if "search" in res.stats:  # no model fitted: the search's Lagrangian bound stands for the MILP's
        value, passes = res.stats.get("lagrangian_bound"), res.stats["lagrangian_passes"]
        variant = res.stats.get("lagrangian_variant")
        bounds.append(Bound(f"Lagrangian{', ' + variant if variant else ''} ({passes} passes)",
                            -math.inf if value is None else value,
                            res.stats["search_seconds"], value is not None, res.stats["lagrangian_note"]))
        if "configuration_lp" in res.stats:
            config = res.stats["configuration_lp"]
            bounds.append(Bound("batches (configuration LP of the KV items) x intercept + minimum work",
                                -math.inf if config["bound"] is None else config["bound"],
                                config["seconds"], config["bound"] is not None, note=f"at least {config['batches']} batches"
                                + ("" if config["lp"] is not None else " (Farley's bound: cut by the time limit)")))
        return bounds, res
    if res.objective is not None and not deadline.expired():
        J = horizon_for(instance, options.objective, res.objective)[0]
        if FORMULATION_KINDS["bigm"].size(instance, J) <= api.MODEL_LIMIT:  # else it could not be built here
            bounds.append(lp_bound(instance, options.objective, res.objective, deadline.remaining()))
    bounds.append(Bound(f"MILP dual bound ({res.solver}, {res.formulation}, {res.backend_seconds:.3g} s)",
                        res.solver_bound, res.backend_seconds, res.bound_certified, f"horizon J = {res.horizon}"))
    return bounds, res
