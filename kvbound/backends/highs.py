"""HiGHS branch-and-cut on the model arrays, in HiGHS's own solve thread (so that a signal is handled
at once); its log goes to stderr, never stdout."""
from __future__ import annotations

import math
import sys
import time

import numpy as np

from .. import interrupt, progress
from ..bounds.base import bound_above
from ..deadline import Deadline
from ..fileio import native_stdout_aside
from ..formulation.model import ModelArrays
from .base import Backend, BackendOutcome, Exchange, accepted, register, threads

#: HiGHS's bounds are floating-point results within its feasibility and optimality tolerances (1e-7 by
#: default): one came out 1.4e-7 (relative) above the optimum the brute-force oracle found (mean latency,
#: network model, attention coefficients of ~5e-7 a unit). Every bound it reports is lowered by this share
#: of its size, inside the 2e-6 within which a schedule counts as optimal (bounds.base.OPTIMAL_TOL)
BOUND_MARGIN = 5e-7


def _safe(bound: float) -> float:
    """A HiGHS bound lowered by BOUND_MARGIN of its size (infinities as they are)."""
    return bound - BOUND_MARGIN * abs(bound) if math.isfinite(bound) else bound


#: a HiGHS MIP proven optimal with presolve within this share of its time limit is solved again
#: without presolve, from its solution, and the second answer's bound is the one reported
CONFIRM_SHARE = 0.25


def solve_highs(arrays: ModelArrays, deadline: Deadline, warm: np.ndarray | None, *, relax: bool = False,
                verbose: bool = False, gap: float = 1e-9, presolve: bool = True,
                incumbents: Exchange | None = None) -> BackendOutcome:
    """HiGHS on the arrays. A MIP solve whose bound ends above the (feasible) warm start, or whose
    reported objective is not its solution's, is repeated without presolve: HiGHS 1.13 to 1.15's
    MIP presolve can cut off the optimum, and 1.16's can hand back the warm start as "optimal" with
    a smaller objective (tests/test_solvers.py::test_highs_presolve_that_cuts_off_the_optimum_is_caught,
    ::test_highs_answer_whose_objective_is_not_its_solution_is_solved_again). In a race (`incumbents`)
    it offers its improving solutions and takes the others' as user solutions."""
    import highspy

    time_limit = deadline.remaining()  # HiGHS's own unit, once
    with native_stdout_aside(verbose):  # highspy 1.16 prints its banner when constructed, before any option
        h = highspy.Highs()
    h.setOptionValue("output_flag", bool(verbose))
    if not presolve:
        h.setOptionValue("presolve", "off")
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", gap)
    h.setOptionValue("mip_abs_gap", 1e-12)
    h.setOptionValue("threads", threads())
    lp = highspy.HighsLp()
    lp.num_col_ = arrays.n_cols
    lp.num_row_ = arrays.n_rows
    lp.col_cost_ = arrays.objective
    lp.col_lower_ = arrays.col_lb
    lp.col_upper_ = arrays.col_ub
    lp.row_lower_ = arrays.row_lo
    lp.row_upper_ = arrays.row_hi
    lp.offset_ = arrays.objective_offset
    starts, index, value = arrays.csc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    lp.a_matrix_.num_col_ = arrays.n_cols
    lp.a_matrix_.num_row_ = arrays.n_rows
    if not relax:
        lp.integrality_ = [highspy.HighsVarType.kInteger if f else highspy.HighsVarType.kContinuous
                           for f in arrays.integrality]
    h.passModel(lp)
    if warm is not None and not relax:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, warm))
        sol.value_valid = True
        h.setSolution(sol)
    t0 = time.perf_counter()
    abandoned = _run_highs(h, deadline, verbose, None if relax else incumbents)
    seconds = time.perf_counter() - t0
    if abandoned is not None:  # HiGHS did not stop in time: only the bound its callbacks reported
        bound = abandoned.get("bound", -math.inf)
        bound = _safe(bound) if bound is not None and math.isfinite(bound) and not relax else -math.inf
        why = abandoned.get("busy") or f"HiGHS did not stop within {interrupt.STOP_GRACE:g} s of being asked"
        return BackendOutcome("unknown", None, None, bound, seconds, None, {"model_status": "ABANDONED", "abandoned": why})
    ms = h.getModelStatus()
    info = h.getInfo()
    MS = highspy.HighsModelStatus
    x = None
    objective = None
    if relax:
        if ms == MS.kOptimal:
            return BackendOutcome("optimal", None, info.objective_function_value, _safe(info.objective_function_value),
                                  seconds)
        if ms == MS.kInfeasible:
            return BackendOutcome("infeasible", None, None, math.inf, seconds)
        return BackendOutcome("unknown", None, None, -math.inf, seconds)
    if info.primal_solution_status == 2:  # kSolutionStatusFeasible
        x = np.array(h.getSolution().col_value)
        objective = info.objective_function_value
    bound = info.mip_dual_bound
    if ms == MS.kOptimal:
        status = "optimal"
        bound = max(bound, objective) if objective is not None and info.mip_gap <= gap else bound
    elif ms == MS.kInfeasible:
        status, bound = "infeasible", math.inf
    else:
        status = "feasible" if x is not None else "unknown"
    if not math.isfinite(bound) and status != "infeasible":
        bound = -math.inf
    kept_warm = accepted(arrays, warm, objective)
    warm_obj = None if warm is None else float(arrays.objective @ warm + arrays.objective_offset)
    stats = {"model_status": h.modelStatusToString(ms), "nodes": int(info.mip_node_count),
             "interrupted": ms == MS.kInterrupt}
    own = None if x is None else float(arrays.objective @ x + arrays.objective_offset)
    mismatch = own is not None and abs(objective - own) > 1e-7 * (1 + abs(own))
    retry = None
    if mismatch:
        retry = f"objective {objective} is not its solution's {own}"
    elif warm is not None and bound_above(bound, warm_obj) and not arrays.check(warm):
        retry = f"bound {bound} above the feasible warm start's {warm_obj}"
    elif status == "optimal" and presolve and x is not None and seconds < CONFIRM_SHARE * time_limit:
        # HiGHS 1.16's presolve can also cut off the optimum below a worse warm start (mean latency,
        # two requests, chain model: "optimal" 0.016103 s, the optimum 0.016071 s): where the
        # proof was quick, it is confirmed without presolve, starting from the solution found
        retry, warm = "confirmed without presolve", x
    if retry is not None and presolve and not deadline.expired():
        again = solve_highs(arrays, deadline, warm, verbose=verbose, gap=gap, presolve=False, incumbents=incumbents)
        if not mismatch and objective is not None and (again.objective is None or objective < again.objective):
            again.x, again.objective = x, objective  # the first solve's schedule is better; only its bound is not trusted
            again.status = "feasible" if again.status == "unknown" else again.status
        again.warm_start_accepted = kept_warm
        again.stats["presolve_retry"] = f"{retry}: solved again without presolve"
        again.seconds += seconds
        return again
    if mismatch:  # not solved again: the solution at its own value, no bound
        status, objective, bound = "feasible", own, -math.inf
        stats["untrusted"] = retry
    return BackendOutcome(status, x, objective, _safe(bound), seconds, kept_warm, stats)


#: seconds HiGHS may overrun its own time limit before kvbound interrupts it (from a callback)
HIGHS_GRACE = 0.5


def _run_highs(h, deadline: Deadline, verbose: bool, incumbents: Exchange | None = None) -> dict | None:
    """`h.run()` in HiGHS's solve thread while this thread waits, so that a signal is handled at once.

    HiGHS's interrupt callbacks stop it on an interrupt (kvbound.interrupt) or when it overruns
    `deadline` by HIGHS_GRACE; its incumbent and bound are kept. Some phases (presolve of a large
    model) never call them: if HiGHS has not returned STOP_GRACE seconds after it was asked to stop,
    it is abandoned (its thread left to finish alone; the CLI then ends the process) and the last
    figures its callbacks reported are returned instead (None when it returned normally). Its log,
    with `verbose`, goes to stderr through a callback: nothing of HiGHS's reaches stdout."""
    hard = deadline.shifted(HIGHS_GRACE)
    seen: dict = {}

    def stop(event):
        try:
            out = event.data_out
            seen["bound"] = out.mip_dual_bound
            progress.report(incumbent=out.objective_function_value, bound=_safe(out.mip_dual_bound))
        except Exception:  # an LP callback has no MIP figures
            pass
        if interrupt.requested() is not None or hard.expired():
            event.interrupt()

    for callback in (h.cbMipInterrupt, h.cbSimplexInterrupt, h.cbIpmInterrupt):
        callback.subscribe(stop)
    if incumbents is not None:
        def improved(event):
            out = event.data_out
            incumbents.offer(np.array(out.mip_solution, dtype=float), out.objective_function_value)

        def given(event):
            x = incumbents.take()
            if x is not None:
                event.data_in.setSolution(np.asarray(x, dtype=float))

        h.cbMipImprovingSolution.subscribe(improved)
        h.cbMipUserSolution.subscribe(given)
    if verbose:
        h.setOptionValue("log_to_console", False)
        h.cbLogging.subscribe(lambda event: sys.stderr.write(event.message))
    # highspy runs one solve per process at a time (its lock is the class's): a solve abandoned
    # earlier in this process (a notebook, a sweep's worker, a bound's pricings) may still be running
    while h.is_solver_running():
        if interrupt.requested() is not None or hard.expired():
            return {"busy": "an earlier HiGHS solve in this process, abandoned, was still running"}
        time.sleep(0.05)
    thread = h.startSolve()
    give_up = math.inf
    with interrupt.deferred():
        while True:
            try:
                done, _ = h.wait(0.1)
            except KeyboardInterrupt:  # no handler installed (a library caller): stop, keep the best
                interrupt.request()
                continue
            if done:
                break
            if give_up == math.inf and (interrupt.requested() is not None or hard.expired()):
                h.cancelSolve()
                give_up = time.monotonic() + interrupt.STOP_GRACE
            if time.monotonic() > give_up:
                interrupt.abandon(thread)
                return seen
    thread.join()
    return None


register(Backend("highs", solve_highs, False, "HiGHS branch-and-cut", races=True))
