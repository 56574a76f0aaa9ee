"""COIN-OR CBC (PuLP's bundled binary) in a child process, in its own temporary folder; PuLP also
writes the models that `solve --export` saves."""
from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

from .. import interrupt
from ..deadline import Deadline
from ..formulation.model import ModelArrays
from ..interrupt import Stopped
from .base import Backend, BackendOutcome, register, threads

#: relative error of the figures CBC hands back through text files (8 significant digits)
CBC_TEXT_PRECISION = 1e-7


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


def solve_cbc(arrays: ModelArrays, deadline: Deadline, warm: np.ndarray | None, *, verbose: bool = False,
              names: list[str] | None = None) -> BackendOutcome:
    """CBC until `deadline`, writing the model included. CBC does not always stop at its `-sec` limit
    (on large models it overran by minutes), so at the deadline kvbound sends it SIGINT (CBC then
    stops and writes its best solution) and kills it `interrupt.STOP_GRACE` seconds later; an
    interrupt does the same at once. Its log goes to a file (and, with `verbose`, to stderr after
    it ends), never to stdout; the folder is removed whatever happens."""
    import pulp

    limit = deadline
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
            solver = pulp.PULP_CBC_CMD(msg=False, gapRel=1e-9, gapAbs=1e-12, warmStart=warm is not None,
                                       threads=threads(), keepFiles=False)
        solver.tmpDir = tmp
        mps, sol, mst, log = (os.path.join(tmp, f"model.{ext}") for ext in ("mps", "sol", "mst", "log"))
        t0 = time.perf_counter()
        args = [solver.path, mps]
        with limit.enforced():
            vs, var_names, con_names, _ = prob.writeMPS(mps, rename=1)
            if warm is not None:
                solver.writesol(mst, prob, vs, var_names, con_names)
                args += ["-mips", mst]
        args += ["-sec", f"{max(limit.remaining(), 0.01):.2f}"]  # CBC's own unit, once; kvbound stops it at the deadline
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
    then SIGINT, and SIGKILL `interrupt.STOP_GRACE` seconds later. Returns why it was stopped, or None.

    The binary runs in its own session (the terminal's Ctrl-C reaches kvbound, which stops it) and
    dies with kvbound, even a SIGKILLed one (`interrupt.child_setup`: the parent-death signal). A
    signal while it starts is deferred (`interrupt.held`), never lost: the loop below sees it at once."""
    stopped, kill_at = None, None
    with interrupt.deferred():
        with open(log, "wb") as out, interrupt.held():
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=interrupt.child_setup())
            interrupt.add_child(proc)
        try:
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
                    kill_at = time.monotonic() + interrupt.STOP_GRACE
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


register(Backend("cbc", solve_cbc, False, "COIN-OR CBC through PuLP"))
