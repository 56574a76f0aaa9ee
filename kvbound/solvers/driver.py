"""`solve_with(instance, options) -> Result`: the best schedule and a stated lower bound.

One visible loop (`Ledger.run`): every phase of the plan that applies to what the ledger holds runs, offering
schedules and certifying bounds on it, and the result is read off the ledger. The heuristics'
schedules (valid under the semantics and the hypothesis constraints) give an upper bound and the
warm start; the upper bound fixes a horizon J that provably admits an optimal schedule; the model
is solved (or, where none fits, the search runs); every schedule is re-evaluated by the validator,
and that exact latency is what is reported.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .. import interrupt
from ..backends import BACKENDS, SOLVERS, chosen_backends
from ..bounds.base import Bound
from ..constraints import Constraints
from ..deadline import Deadline
from ..errors import InputError, KvboundError
from ..formulation import FORMULATION_KINDS
from ..schedule import validate
from ..workload import Instance
from ..schedulers import FAST_HEURISTICS
from .ledger import Ledger
from .options import DEFAULT_TIME_LIMIT, SEARCH, SolveOptions
from .phases.periods import one_after_another
from .plan import PLAN
from .result import Result

def solve_with(instance, options: SolveOptions, deadline: Deadline | None = None) -> Result:
    """Best schedule and lower bound for `options.objective` (`deadline`, default `options.time_limit`
    from now, bounds the whole call)."""
    deadline = deadline if deadline is not None else Deadline(options.time_limit)
    _lookup(dict.fromkeys(SOLVERS), options.backend, "solver")
    # named in the result where no model ran: the backend, or the one auto runs on a large model
    solver = chosen_backends(options.backend, math.inf, BACKENDS)[0].name
    if options.formulation not in ("auto", SEARCH):
        _lookup(FORMULATION_KINDS, options.formulation, "formulation")
    if options.export and options.formulation == SEARCH:
        raise InputError("", "export", f"--formulation {SEARCH} builds no model to write; name a model "
                                       f"({', '.join(FORMULATION_KINDS)}) or use auto")
    shift = float(instance.arrivals.min()) if len(instance) else 0.0
    if shift > 0 and options.objective.is_mean and not options.export:
        # a shift of every arrival changes no latency, but a model's horizon counts batches from 0
        return _shifted_back(solve_with(instance.from_zero(), options, deadline), instance, shift)
    ledger = Ledger(instance, options, deadline)
    with options.units.session():  # one Ray (where named) for every phase's units
        ledger.run(PLAN)
    with interrupt.deferred():  # what is known is reported, whatever comes now
        return ledger.result(ledger.backend or solver)


def _shifted_back(result: Result, instance: Instance, shift: float) -> Result:
    """`result` of `instance.from_zero()` as one of `instance`: every batch at its start plus `shift`,
    the metrics replayed on `instance` (the latencies are the same)."""
    if result.schedule is None:
        return result
    with interrupt.deferred():
        schedule = one_after_another(instance, [(np.arange(len(instance)), result.schedule, shift)])
        metrics = validate(instance, schedule).metrics
        return replace(result, schedule=schedule, metrics=metrics, objective=result.objective_name.of(metrics))


def solve(instance, objective: str = "total_latency", backend: str = "auto", time_limit: float = DEFAULT_TIME_LIMIT,
          warm_start=FAST_HEURISTICS, formulation: str = "auto", constraints: Constraints = Constraints(),
          horizon: int | None = None, verbose: bool = False, export: str | None = None, *,
          skip_proven: bool = True, deadline: Deadline | None = None) -> Result:
    """`solve_with` for callers that name the options one by one (a notebook, a test)."""
    options = SolveOptions(objective, backend, formulation, time_limit, warm_start, horizon, constraints, verbose, export,
                           skip_proven)
    return solve_with(instance, options, deadline)


def lower_bounds(instance, options: SolveOptions, deadline: Deadline | None = None) -> tuple[list[Bound], Result]:
    """Every lower bound kvbound has for `options.objective` (cheapest first) and the solve that gave
    them: before a model, the bounds that need a schedule's horizon (the LP relaxation) take up to
    half of the time the heuristics leave."""
    result = solve_with(instance, options.but(every_bound=True), deadline)
    return result.bounds, result


def _lookup(table: dict, name: str, what: str):
    if name not in table:
        raise KvboundError(f"unknown {what} {name!r}; choose from {', '.join(table)}")
    return table[name]
