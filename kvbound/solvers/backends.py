"""Solver backends: each takes the model arrays, a time limit and a warm start point, and returns
a `BackendOutcome` of the same shape (status, best point, objective, dual bound, statistics).

All bounds are in model units (seconds, or ticks for the integer-scaled CP-SAT model).
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import signal
import subprocess
import sys
import threading
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import interrupt, progress
from ..deadline import Deadline
from ..interrupt import Stopped
from ..formulation.model import ModelArrays

#: relative error of the figures CBC hands back through text files (8 significant digits)
CBC_TEXT_PRECISION = 1e-7


@dataclass
class BackendOutcome:
    status: str  # optimal, feasible, infeasible, unknown (as the backend proved it, in model units)
    x: np.ndarray | None
    objective: float | None
    bound: float  # a lower bound on the model optimum (-inf if none)
    seconds: float
    warm_start_accepted: bool | None = None
    stats: dict = field(default_factory=dict)


def _threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


# CP-SAT's portfolio grows with its workers (max_lp from 6, reduced_costs at 8); with the 2 of a
# 2-core machine its one full-problem worker was default_lp (the rest are heuristics and LNS),
# and a three-request model that 8 workers prove at the root in 0.03 s stayed 10% short of a
# proof after 60 s (CI; tests/test_solvers.py::test_cpsat_runs_its_lp_workers_on_few_cores).
# Workers are threads.
CPSAT_WORKERS = 8


# ------------------------------------------------------------------------- HiGHS

@contextlib.contextmanager
def _stdout_to_stderr():
    """Send what native code writes to file descriptor 1 to 2 meanwhile: `--json` keeps stdout for the JSON."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)  # the C library's buffered stdout, written while redirected
        os.dup2(saved, 1)
        os.close(saved)


#: a HiGHS MIP proven optimal with presolve within this share of its time limit is solved again
#: without presolve, from its solution, and the second answer's bound is the one reported
CONFIRM_SHARE = 0.25


def solve_highs(arrays: ModelArrays, time_limit: float, warm: np.ndarray | None, *, relax: bool = False,
                verbose: bool = False, gap: float = 1e-9, presolve: bool = True) -> BackendOutcome:
    """HiGHS on the arrays. A MIP solve whose bound ends above the (feasible) warm start, or whose
    reported objective is not its solution's, is repeated without presolve: HiGHS 1.13 to 1.15's
    MIP presolve can cut off the optimum, and 1.16's can hand back the warm start as "optimal" with
    a smaller objective (tests/test_solvers.py::test_highs_presolve_that_cuts_off_the_optimum_is_caught,
    ::test_highs_answer_whose_objective_is_not_its_solution_is_solved_again)."""
    import highspy

    deadline = Deadline(time_limit)
    with _stdout_to_stderr():  # highspy 1.16 prints its banner when constructed, before any option
        h = highspy.Highs()
    h.setOptionValue("output_flag", bool(verbose))
    if not presolve:
        h.setOptionValue("presolve", "off")
    h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
    h.setOptionValue("mip_rel_gap", gap)
    h.setOptionValue("mip_abs_gap", 1e-12)
    h.setOptionValue("threads", _threads())
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
    accepted = None
    if warm is not None and not relax:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, warm))
        sol.value_valid = True
        h.setSolution(sol)
    t0 = time.perf_counter()
    abandoned = _run_highs(h, deadline, verbose)
    seconds = time.perf_counter() - t0
    if abandoned is not None:  # HiGHS did not stop in time: only the bound its callbacks reported
        bound = abandoned.get("bound", -math.inf)
        bound = bound if bound is not None and math.isfinite(bound) and not relax else -math.inf
        return BackendOutcome("unknown", None, None, bound, seconds, None, {
            "model_status": "ABANDONED", "abandoned": f"HiGHS did not stop within {STOP_GRACE:g} s of being asked"})
    ms = h.getModelStatus()
    info = h.getInfo()
    MS = highspy.HighsModelStatus
    x = None
    objective = None
    if relax:
        if ms == MS.kOptimal:
            return BackendOutcome("optimal", None, info.objective_function_value, info.objective_function_value, seconds)
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
    if warm is not None:
        warm_obj = float(arrays.objective @ warm + arrays.objective_offset)
        accepted = objective is not None and objective <= warm_obj + 1e-9 * (1 + abs(warm_obj))
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
        again = solve_highs(arrays, max(deadline.remaining(), 1.0), warm, verbose=verbose, gap=gap, presolve=False)
        if not mismatch and objective is not None and (again.objective is None or objective < again.objective):
            again.x, again.objective = x, objective  # the first solve's schedule is better; only its bound is not trusted
            again.status = "feasible" if again.status == "unknown" else again.status
        again.warm_start_accepted = accepted
        again.stats["presolve_retry"] = f"{retry}: solved again without presolve"
        again.seconds += seconds
        return again
    if mismatch:  # not solved again: the solution at its own value, no bound
        status, objective, bound = "feasible", own, -math.inf
        stats["untrusted"] = retry
    return BackendOutcome(status, x, objective, bound, seconds, accepted, stats)


#: seconds HiGHS may overrun its own time limit before kvbound interrupts it (from a callback)
HIGHS_GRACE = 0.5


def _run_highs(h, deadline: Deadline, verbose: bool) -> dict | None:
    """`h.run()` in HiGHS's solve thread while this thread waits, so that a signal is handled at once.

    HiGHS's interrupt callbacks stop it on an interrupt (kvbound.interrupt) or when it overruns
    `deadline` by HIGHS_GRACE; its incumbent and bound are kept. Some phases (presolve of a large
    model) never call them: if HiGHS has not returned STOP_GRACE seconds after it was asked to stop,
    it is abandoned (its thread left to finish alone; the CLI then ends the process) and the last
    figures its callbacks reported are returned instead (None when it returned normally). Its log,
    with `verbose`, goes to stderr through a callback: nothing of HiGHS's reaches stdout."""
    hard = deadline.share(1.0)
    hard.at += HIGHS_GRACE
    seen: dict = {}

    def stop(event):
        try:
            out = event.data_out
            seen["bound"] = out.mip_dual_bound
            progress.report(incumbent=out.objective_function_value, bound=out.mip_dual_bound)
        except Exception:  # an LP callback has no MIP figures
            pass
        if interrupt.requested() is not None or hard.expired():
            event.interrupt()

    for callback in (h.cbMipInterrupt, h.cbSimplexInterrupt, h.cbIpmInterrupt):
        callback.subscribe(stop)
    if verbose:
        h.setOptionValue("log_to_console", False)
        h.cbLogging.subscribe(lambda event: sys.stderr.write(event.message))
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
                give_up = time.monotonic() + STOP_GRACE
            if time.monotonic() > give_up:
                interrupt.abandon(thread)
                return seen
    thread.join()
    return None


def bound_above(bound: float, value: float, rel: float = 1e-6) -> bool:
    """Whether a claimed lower bound exceeds a known feasible value beyond tolerance (so it is wrong)."""
    return bound > value + rel * max(abs(value), 1e-12)


# ------------------------------------------------------------------------- CP-SAT

#: seconds CP-SAT may overrun its time limit before its process is killed: it does not always stop
#: in time (google/or-tools#2604, #4882), and the time limit is part of `solve`'s contract
CPSAT_GRACE = 1.0
#: seconds a stopped solver (an interrupt) gets to hand back its best before its process is killed
STOP_GRACE = 1.0


def solve_cpsat(arrays: ModelArrays, time_limit: float, warm: np.ndarray | None, *, verbose: bool = False,
                fix_to_hint: bool = False, grace: float = CPSAT_GRACE, workers: int | None = None) -> BackendOutcome:
    """Every variable and coefficient must be integral (the formulation is built with `tick`).

    CP-SAT runs in a child process (`run_cpsat_process`); the child reports each improving
    solution with CP-SAT's bound. If it has not answered `grace` seconds after the limit, it is
    killed and the last solution it reported (if any) is the outcome.
    """
    answer = run_cpsat_process(_solve_cpsat_here, (arrays, warm, verbose, fix_to_hint, workers or CPSAT_WORKERS),
                               time_limit, grace=grace,
                               on_incumbent=lambda message: progress.report(incumbent=message[1], bound=message[2]))
    if answer.outcome is not None:
        return answer.outcome
    stats = {"model_status": "KILLED", "killed": answer.why}
    if answer.last is None:
        return BackendOutcome("unknown", None, None, -math.inf, answer.seconds, None, stats)
    _, objective, bound, x = answer.last
    return BackendOutcome("feasible", x, objective, bound, answer.seconds, _accepted(arrays, warm, objective), stats)


@dataclass
class CpsatAnswer:
    """What `run_cpsat_process` got: the child's outcome, or (killed) the last incumbent it reported."""

    outcome: object | None  # what the child's solve function returned; None if it was killed
    last: tuple | None  # the last ("incumbent", ...) message
    seconds: float
    why: str = ""  # why the child was killed


def run_cpsat_process(solve_here: Callable, payload, time_limit: float, *, grace: float = CPSAT_GRACE,
                      on_incumbent: Callable[[tuple], None] | None = None) -> CpsatAnswer:
    """Run `solve_here(payload, at, say, stop_conn, on_start)` (a module-level function that builds and
    solves a CP-SAT model until the monotonic time `at`, `say`ing ("incumbent", ...) messages) in a
    fresh child process.

    OR-Tools bundles its own HiGHS, whose symbols clash with highspy's when both load in one
    process, so CP-SAT never runs in kvbound's own. `time_limit` counts from now, the child's
    start-up and model building included. If the child has not answered `grace` seconds after the
    limit, it is killed and the answer holds the last incumbent it reported. On an interrupt
    (kvbound.interrupt) the child is told to stop and answers with its best, or is killed
    STOP_GRACE seconds later.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    stop_receive, stop_send = ctx.Pipe(duplex=False)
    limit = Deadline(time_limit)
    child = ctx.Process(target=_cpsat_child, daemon=True, args=(send, stop_receive, solve_here, payload, limit.at))
    interrupt.add_child(child)
    with _sigint_ignored():  # a Ctrl-C reaches the whole process group: the child starts deaf to it
        child.start()
    send.close()
    stop_receive.close()
    best = None  # the last ("incumbent", ...) the child reported
    message = None
    kill_at = limit.at + grace
    try:
        with interrupt.deferred():
            while message is None or message[0] not in ("done", "error"):
                if interrupt.requested() is not None and kill_at > time.monotonic() + STOP_GRACE:
                    kill_at = time.monotonic() + STOP_GRACE
                    with contextlib.suppress(OSError):
                        stop_send.send("stop")
                wait = kill_at - time.monotonic()
                if wait <= 0:
                    child.kill()
                    seconds = limit.elapsed()
                    why = ("stopped by an interrupt" if interrupt.requested() is not None
                           else f"CP-SAT did not return {max(0.0, seconds - time_limit):.1f} s after its "
                                f"{time_limit:g} s limit")
                    return CpsatAnswer(None, best, seconds, why)
                try:
                    message = _receive(receive, child, min(wait, 0.1))
                except KeyboardInterrupt:  # no handler installed (a library caller): stop, keep the best
                    interrupt.request()
                    continue
                if message is not None and message[0] == "incumbent":
                    best = message
                    if on_incumbent is not None:
                        on_incumbent(message)
    finally:
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join(timeout=5)
        interrupt.drop_child(child)
        receive.close()
        stop_send.close()
    kind, payload = message
    if kind == "error":
        raise payload
    return CpsatAnswer(payload, best, limit.elapsed())


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored meanwhile (main thread only), so that a process started here inherits the
    ignored disposition through exec: Python installs its KeyboardInterrupt handler only where
    SIGINT is at its default, so a Ctrl-C during the child's start-up (imports) cannot end it with a
    traceback. Only the few milliseconds of the start are deaf in this process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _accepted(arrays: ModelArrays, warm, objective) -> bool | None:
    """Whether the solver kept (or beat) the warm start it was given."""
    if warm is None:
        return None
    warm_obj = float(arrays.objective @ warm + arrays.objective_offset)
    return objective is not None and objective <= warm_obj + 1e-9 * (1 + abs(warm_obj))


def _receive(conn, child, timeout: float | None):
    """The child's next message, or None if none came within `timeout` seconds."""
    if not conn.poll(timeout):
        return None
    try:
        return conn.recv()
    except EOFError:
        child.join(timeout=5)
        raise RuntimeError(f"the CP-SAT process ended without an answer (exit code {child.exitcode})") from None


def _cpsat_child(conn, stop_conn, solve_here, payload, at) -> None:
    # the parent handles Ctrl-C and tells this process to stop; it dies with the parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    interrupt.die_with_parent()
    lock = threading.Lock()

    def say(message):
        with lock:
            conn.send(message)

    try:
        say(("done", solve_here(payload, at, say, stop_conn, on_start=lambda: say(("solving", None)))))
    except BaseException as exc:  # handed to the parent, which raises it
        say(("error", exc))
    finally:
        conn.close()


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
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False  # the parent decides (kvbound.interrupt)
    solver.parameters.num_workers = workers
    solver.parameters.log_search_progress = bool(verbose)
    if verbose:  # CP-SAT's log goes to stderr, never stdout
        solver.parameters.log_to_stdout = False
        solver.log_callback = lambda line: print(line, file=sys.stderr, flush=True)
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
    on_start()
    solver.parameters.max_time_in_seconds = float(max(at - time.monotonic(), 0.01))
    stop_on_message(solver, stop_conn)
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
    accepted = _accepted(arrays, warm, objective)
    stats = {"model_status": solver.StatusName(st), "branches": int(solver.NumBranches()),
             "conflicts": int(solver.NumConflicts())}
    return BackendOutcome(status, x, objective, bound, seconds, accepted, stats)


def stop_on_message(solver, stop_conn) -> None:
    """Stop `solver` (a CpSolver) when a message comes on `stop_conn` (the parent's interrupt)."""
    if stop_conn is None:
        return

    def wait_for_stop():
        with contextlib.suppress(EOFError, OSError):
            stop_conn.recv()
            solver.stop_search()
    threading.Thread(target=wait_for_stop, daemon=True).start()


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


# ------------------------------------------------------------------------- CBC through PuLP

def build_pulp(arrays: ModelArrays, names: list[str] | None = None, row_names: list[str] | None = None,
               deadline: Deadline | None = None):
    """The model as a PuLP problem; a `deadline` that passes meanwhile raises `Stopped`."""
    import pulp

    prob = pulp.LpProblem("kvbound", pulp.LpMinimize)
    xs = []
    for k in range(arrays.n_cols):
        lo = arrays.col_lb[k] if math.isfinite(arrays.col_lb[k]) else None
        hi = arrays.col_ub[k] if math.isfinite(arrays.col_ub[k]) else None
        cat = pulp.LpInteger if arrays.integrality[k] else pulp.LpContinuous
        xs.append(prob.add_variable(names[k] if names else f"x{k}", lo, hi, cat))
    starts, cols, vals = arrays.csr()
    for k in range(arrays.n_rows):
        if deadline is not None and k % 1000 == 0 and deadline.expired():
            raise Stopped("interrupted" if interrupt.requested() is not None else "time limit")
        a, b = starts[k], starts[k + 1]
        expr = pulp.LpAffineExpression([(xs[c], float(v)) for c, v in zip(cols[a:b], vals[a:b])])
        lo, hi = arrays.row_lo[k], arrays.row_hi[k]
        row = row_names[k] if row_names else f"r{k}"
        if lo == hi:
            prob += expr == float(lo), row
        else:
            if math.isfinite(lo):
                prob += expr >= float(lo), f"{row}_lo"
            if math.isfinite(hi):
                prob += expr <= float(hi), f"{row}_hi"
    nz = np.nonzero(arrays.objective)[0]
    # the objective offset stays outside the LP file so CBC's printed bounds are plain model values
    prob += pulp.LpAffineExpression([(xs[c], float(arrays.objective[c])) for c in nz])
    return prob, xs


def solve_cbc(arrays: ModelArrays, time_limit: float, warm: np.ndarray | None, *, verbose: bool = False,
              names: list[str] | None = None) -> BackendOutcome:
    """CBC (PuLP's bundled binary) in a child process, in its own temporary folder.

    `time_limit` counts from now, writing the model included. CBC does not always stop at its
    `-sec` limit (on large models it overran by minutes), so at the limit kvbound sends it SIGINT
    (CBC then stops and writes its best solution) and kills it STOP_GRACE seconds later; an
    interrupt does the same at once. Its log goes to a file (and, with `verbose`, to stderr after
    it ends), never to stdout; the folder is removed whatever happens."""
    import pulp

    limit = Deadline(time_limit)
    with limit.enforced():  # building and writing the model are cut short at the limit
        prob, xs = build_pulp(arrays, names, deadline=limit)
    if warm is not None:
        for var, v in zip(xs, warm):
            var.setInitialValue(round(v) if var.cat == pulp.LpInteger else float(v))
    tmp = tempfile.mkdtemp(prefix="kvbound-cbc-")
    interrupt.add_folder(tmp)
    try:
        with warnings.catch_warnings():  # PuLP 3.3 deprecates its bundled CBC for pulp[cbc] (a 190 MB wheel)
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, int(math.ceil(limit.remaining()))), gapRel=1e-9,
                                       gapAbs=1e-12, warmStart=warm is not None, threads=_threads(), keepFiles=False)
        solver.tmpDir = tmp
        mps, sol, mst, log = (os.path.join(tmp, f"model.{ext}") for ext in ("mps", "sol", "mst", "log"))
        t0 = time.perf_counter()
        args = [solver.path, mps]
        with limit.enforced():
            vs, var_names, con_names, _ = prob.writeMPS(mps, rename=1)
            if warm is not None:
                solver.writesol(mst, prob, vs, var_names, con_names)
                args += ["-mips", mst]
        args += ["-sec", str(max(1, int(math.ceil(limit.remaining()))))]
        args += [w for option in solver.options + solver.getOptions() for w in ("-" + option).split()]
        args += ["-solve", "-printingOptions", "all", "-solution", sol]
        stopped = _run_child(args, log, limit)
        seconds = time.perf_counter() - t0
        text = open(log, errors="replace").read() if os.path.exists(log) else ""
        if verbose:
            sys.stderr.write(text)
        if os.path.exists(sol):
            status, values, reduced, prices, slacks, sol_status = solver.readsol_MPS(sol, prob, vs, var_names, con_names)
            prob.assignVarsVals(values)
            prob.assignStatus(status, sol_status)
        else:
            prob.assignStatus(pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound)
    finally:
        interrupt.drop_folder(tmp)
    x = None
    objective = None
    values = [v.varValue for v in xs]
    if prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible) and None not in values:
        x = np.array(values, dtype=float)
        objective = float(arrays.objective @ x + arrays.objective_offset)
    bound = _cbc_bound(text)
    if bound is not None:
        bound += arrays.objective_offset
    if prob.sol_status == pulp.LpSolutionOptimal and not stopped:  # solved to gapRel 1e-9: the bound is the objective
        status = "optimal"
        bound = objective
    elif prob.status == pulp.LpStatusInfeasible or prob.sol_status == pulp.LpSolutionInfeasible:
        status, bound = "infeasible", math.inf
    else:
        status = "feasible" if x is not None else "unknown"
        if bound is None:
            bound = -math.inf
    if bound is not None and math.isfinite(bound):
        # CBC's point and its log come back as text with 8 significant digits: lower the bound by more
        bound -= CBC_TEXT_PRECISION * abs(bound)
    accepted = None
    if warm is not None:
        accepted = bool(re.search(r"MIPStart provided solution with cost|mipstart values read|solution of value", text, re.I)) or \
            (objective is not None and objective <= float(arrays.objective @ warm + arrays.objective_offset) + 1e-9)
    stats = {"model_status": pulp.LpStatus[prob.status]}
    if stopped:
        stats["stopped"] = stopped
    return BackendOutcome(status, x, objective, bound, seconds, accepted, stats)


def _run_child(args: list[str], log: str, limit: Deadline) -> str | None:
    """Run a solver binary (its output to `log`) until it ends, `limit` passes or an interrupt:
    then SIGINT, and SIGKILL STOP_GRACE seconds later. Returns why it was stopped, or None."""
    stopped, kill_at = None, None
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # the terminal's Ctrl-C reaches kvbound, not the solver
    interrupt.add_child(proc)
    try:
        with interrupt.deferred():
            while True:
                try:
                    proc.wait(0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                except KeyboardInterrupt:  # no handler installed (a library caller)
                    interrupt.request()
                if stopped is None and limit.expired():
                    stopped = "interrupted" if interrupt.requested() is not None else "time limit"
                    proc.send_signal(signal.SIGINT)
                    kill_at = time.monotonic() + STOP_GRACE
                elif kill_at is not None and time.monotonic() > kill_at:
                    proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        interrupt.drop_child(proc)
    return stopped


def _cbc_bound(text: str) -> float | None:
    """The final lower bound CBC printed ("Lower bound:" after a stop, or "Objective value" when optimal)."""
    m = re.findall(r"Lower bound:\s*([-+0-9.eE]+)", text)
    if m:
        return float(m[-1])
    m = re.findall(r"best possible ([-+0-9.eE]+)", text)
    if m:
        return float(m[-1])
    return None


# ------------------------------------------------------------------------- what each backend is

@dataclass(frozen=True)
class Backend:
    """One solver backend, described once: `solve()` reads these fields instead of branching on names."""
    name: str
    run: Callable[..., BackendOutcome]  # (arrays, time_limit, warm, *, verbose) -> BackendOutcome
    integer_ticks: bool  # needs an integer model: time in whole ticks, coefficients floored
    child_process: bool  # runs in a child process that kvbound can stop
    summary: str


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("highs", solve_highs, False, False, "HiGHS branch-and-cut (default)"),
    Backend("cpsat", solve_cpsat, True, True, "OR-Tools CP-SAT on the integer-tick model (8 workers)"),
    Backend("cbc", solve_cbc, False, True, "COIN-OR CBC through PuLP"),
)}
