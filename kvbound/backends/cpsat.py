"""OR-Tools CP-SAT on the integer-tick model, in a child process (`kvbound.cpsat_process`)."""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from .. import progress
from ..cpsat_process import CPSAT_GRACE, cpsat_solver, run_cpsat_process
from ..deadline import Deadline
from ..formulation.model import ModelArrays
from .base import Backend, BackendOutcome, Exchange, accepted, register

# CP-SAT's portfolio grows with its workers (max_lp from 6, reduced_costs at 8); with the 2 of a
# 2-core machine its one full-problem worker was default_lp (the rest are heuristics and LNS),
# and a three-request model that 8 workers prove at the root in 0.03 s stayed 10% short of a
# proof after 60 s (CI; tests/test_solvers.py::test_cpsat_runs_its_lp_workers_on_few_cores).
# Workers are threads.
CPSAT_WORKERS = 8


def solve_cpsat(arrays: ModelArrays, deadline: Deadline, warm: np.ndarray | None, *, verbose: bool = False,
                fix_to_hint: bool = False, grace: float = CPSAT_GRACE, workers: int | None = None,
                incumbents: Exchange | None = None) -> BackendOutcome:
    """Every variable and coefficient must be integral (the formulation is built with `tick`).

    The child reports each improving solution with CP-SAT's bound (to `incumbents` where it races
    another solver; it cannot take theirs). If it has not answered `grace` seconds after the
    deadline, it is killed and the last solution it reported (if any) is the outcome.
    """
    def on_incumbent(message):
        _, objective, bound, x = message
        if incumbents is not None:
            incumbents.offer(x, objective, bound)
        else:
            progress.report(incumbent=objective, bound=bound)

    answer = run_cpsat_process(_solve_cpsat_here, (arrays, warm, verbose, fix_to_hint, workers or CPSAT_WORKERS),
                               deadline, grace=grace, on_incumbent=on_incumbent)
    if answer.outcome is not None:
        return answer.outcome
    stats = {"model_status": "KILLED", "killed": answer.why}
    if answer.last is None:
        return BackendOutcome("unknown", None, None, -math.inf, answer.seconds, None, stats)
    _, objective, bound, x = answer.last
    return BackendOutcome("feasible", x, objective, bound, answer.seconds, accepted(arrays, warm, objective), stats)


def _solve_cpsat_here(payload, at: float, say=None, stop_conn=None, on_start=lambda: None) -> BackendOutcome:
    """CP-SAT on the model arrays in this process until the monotonic time `at`; `say` gets each
    improving solution, a message on `stop_conn` stops the search. `payload`: (arrays, warm start,
    verbose, fix_to_hint, workers)."""
    from ortools.sat.python import cp_model

    arrays, warm, verbose, fix_to_hint, workers = payload

    if not (arrays.integrality.all() or _all_integral(arrays.col_lb) and _all_integral(arrays.col_ub)):
        raise ValueError("CP-SAT needs an all-integer model (build the formulation with tick)")
    for name, arr in (("coefficients", arrays.vals), ("objective", arrays.objective)):
        if not _all_integral(arr):
            raise ValueError(f"CP-SAT needs integer {name}")
    md = cp_model.CpModel()
    big = 2 ** 50
    lb = np.maximum(arrays.col_lb, -big)
    ub = np.minimum(arrays.col_ub, big)
    xs = [md.NewIntVar(int(math.ceil(l)), int(math.floor(u)), "") for l, u in zip(lb, ub)]
    starts, cols, vals = arrays.csr()
    for k in range(arrays.n_rows):
        a, b = starts[k], starts[k + 1]
        expr = sum(int(v) * xs[c] for c, v in zip(cols[a:b], vals[a:b]))
        lo, hi = arrays.row_lo[k], arrays.row_hi[k]
        if lo == hi:
            md.Add(expr == int(round(lo)))
        else:
            if math.isfinite(lo):
                md.Add(expr >= int(math.ceil(lo - 1e-9)))
            if math.isfinite(hi):
                md.Add(expr <= int(math.floor(hi + 1e-9)))
    nz = np.nonzero(arrays.objective)[0]
    md.Minimize(sum(int(arrays.objective[c]) * xs[c] for c in nz))
    if warm is not None:
        for var, v in zip(xs, warm):
            md.AddHint(var, int(round(v)))
    on_start()
    solver = cpsat_solver(workers, at, stop_conn, verbose)
    # CP-SAT 9.15's presolve can lose the optimum and then certify a worse point as optimal, at
    # random with two workers and a hint (google/or-tools#5293; here 7% of the runs of
    # tests/test_solvers.py::test_cpsat_presolve_does_not_lose_the_optimum). Without the
    # at-most-one/linear inclusion step and the reductions that drop feasible points: 0 of 600
    # (and 0 of 600 with either one alone).
    solver.parameters.presolve_inclusion_work_limit = 0
    solver.parameters.keep_all_feasible_solutions_in_presolve = True
    if fix_to_hint:
        solver.parameters.fix_variables_to_their_hinted_value = True
    offset = arrays.objective_offset
    callback = _Incumbents(xs, offset, say) if say is not None else None
    t0 = time.perf_counter()
    st = solver.Solve(md, callback)
    seconds = time.perf_counter() - t0
    x = None
    objective = None
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        x = np.array([solver.Value(v) for v in xs], dtype=float)
        objective = solver.ObjectiveValue() + offset
    if st == cp_model.OPTIMAL:
        status, bound = "optimal", objective
    elif st == cp_model.INFEASIBLE:
        status, bound = "infeasible", math.inf
    else:
        status = "feasible" if x is not None else "unknown"
        bound = solver.BestObjectiveBound() + offset if x is not None else -math.inf
    stats = {"model_status": solver.StatusName(st), "branches": int(solver.NumBranches()),
             "conflicts": int(solver.NumConflicts())}
    return BackendOutcome(status, x, objective, bound, seconds, accepted(arrays, warm, objective), stats)


def _Incumbents(xs, offset: float, say):
    """A CP-SAT solution callback that reports each improving solution (at most every 0.2 s; the
    final one comes with the answer) with CP-SAT's bound at that moment."""
    from ortools.sat.python import cp_model

    class Incumbents(cp_model.CpSolverSolutionCallback):
        def __init__(self):
            super().__init__()
            self.last = 0.0

        def on_solution_callback(self):
            now = time.monotonic()
            if now - self.last < 0.2:
                return
            self.last = now
            x = np.array([self.Value(v) for v in xs], dtype=float)
            with contextlib.suppress(OSError):
                say(("incumbent", self.ObjectiveValue() + offset, self.BestObjectiveBound() + offset, x))

    return Incumbents()


def _all_integral(a) -> bool:
    a = np.asarray(a, dtype=float)
    finite = np.isfinite(a)
    return bool(np.all(np.abs(a[finite] - np.round(a[finite])) < 1e-9))


register(Backend("cpsat", solve_cpsat, True, f"OR-Tools CP-SAT on the integer-tick model ({CPSAT_WORKERS} workers)",
                 races=True))
