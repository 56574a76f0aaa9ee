"""Probe: a time-indexed LP with mean busy times for mean latency with arrival times (not part of kvbound).

    python bench/probes/mean_busy_lp.py CASE [--slot 0.02] [--window 3]

The relaxation. Cut time into slots [t_s, t_s + delta) from the first arrival on and split each
batch's duration over the slots it overlaps, pro rata (every part of a batch, its intercept and each
request's work, by the same fractions). Count for request i only its O_i generating batches (the
one that ends its prefill, then one a token). Per slot s:

    k0 Y_s + sum_i W_is <= delta                 (the machine is busy at most delta)
    D_is <= Y_s                                  (i's generating batches are among the slot's batches)
    W_is >= w_i (D_is - G_is),  G_is <= D_is     (each generating batch but the first, G, carries w_i of i's work)

with sum_s D_is = O_i, sum_s G_is <= 1, sum_s W_is = i's least work, nothing before i's arrival; w_i
is the least work of a later token (a decode at m = I_i, or a refill, whichever is less). A batch's
parts in slot s lie at or after t_s, so the mean of i's batch midpoints is at least
(1/O_i) sum_s D_is t_s; its batches are distinct and chronological, each at least k0 + its own work,
so its completion is at least that mean plus (1/O_i) sum_k d_k (k - 1/2) >= S_i (docstring of
`spacing`). Hence, for every schedule,

    latency_i >= (1/O_i) sum_s D_is t_s + S_i - a_i,   and latency_i >= i's time alone.

Each request's slots end at a_i + window x its time alone (+ 1 s); its batches after that are one
bucket at that time, with no slot capacity (a relaxation). KV and token limits are left out.
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from kvbound import load_case
from kvbound.alone import time_alone, token_work
from kvbound.objective import Objective
from kvbound.workload import Instance


def spacing(k0: float, first: float, later: float, O: int) -> float:
    """(1/O) sum_{k=1..O} d_k (k - 1/2) with d_1 >= k0 + first and d_k >= k0 + later (k >= 2): the least
    gap from the mean midpoint of O chronological batches to the end of the last (e_O - mid_k >=
    d_k / 2 + the later batches' durations)."""
    return ((k0 + first) * 0.5 + (k0 + later) * ((O * O - 1) / 2.0)) / O


def mean_busy_bound(inst: Instance, delta: float, window: float, verbose: bool = True, cumulative: bool = True) -> float:
    cost, reqs = inst.cost, inst.requests
    N = len(reqs)
    k0 = cost.intercept
    chunk = min(inst.system.max_batch_tokens, inst.system.max_prefill_tokens)
    arrival = np.array([r.arrival for r in reqs])
    alone = time_alone(inst, Objective("mean_latency"))
    t0 = float(arrival.min())
    horizon = arrival + window * alone + 1.0
    S = int(math.ceil((horizon.max() - t0) / delta)) + 1
    starts = t0 + delta * np.arange(S)
    # per request: its slots [first, last), then one bucket
    cols_D, cols_G, cols_W = [], [], []
    n = 0
    spans = []
    for i, r in enumerate(reqs):
        first = int(math.floor((r.arrival - t0) / delta))
        last = min(S, int(math.ceil((horizon[i] - t0) / delta)))
        k = last - first
        spans.append((first, last, n))
        n += 3 * (k + 1) + k  # D, G, W for each slot and for the bucket; X (ticks so far) for each slot
    nY = S
    nL = N
    nvar = n + nY + nL
    yoff, loff = n, n + nY
    c = np.zeros(nvar)
    lb = np.zeros(nvar)
    ub = np.full(nvar, np.inf)
    rows_ub, cols_ub, vals_ub, rhs_ub = [], [], [], []
    rows_eq, cols_eq, vals_eq, rhs_eq = [], [], [], []
    nub = neq = 0
    cap_rows = {}  # slot -> list of (col, coef)
    for s in range(S):
        cap_rows[s] = [(yoff + s, k0)]
    c[loff:] = 1.0 / N
    for i, r in enumerate(reqs):
        first, last, base = spans[i]
        k = last - first
        O = r.output
        tw = token_work(r, cost, chunk)
        w = float(tw[1:].min()) if O >= 2 else 0.0
        first_work = float(cost.work(1.0, r.prompt - 1.0, decode=False))
        least = float(tw.sum())
        Dc = base + np.arange(k + 1)
        Gc = base + (k + 1) + np.arange(k + 1)
        Wc = base + 2 * (k + 1) + np.arange(k + 1)
        # sum D = O ; sum G <= 1 ; sum W = least
        rows_eq += [neq] * (k + 1); cols_eq += Dc.tolist(); vals_eq += [1.0] * (k + 1); rhs_eq.append(O); neq += 1
        rows_ub += [nub] * (k + 1); cols_ub += Gc.tolist(); vals_ub += [1.0] * (k + 1); rhs_ub.append(1.0); nub += 1
        rows_eq += [neq] * (k + 1); cols_eq += Wc.tolist(); vals_eq += [1.0] * (k + 1); rhs_eq.append(least); neq += 1
        for j in range(k + 1):
            # G <= D ; w (D - G) - W <= 0
            rows_ub += [nub, nub]; cols_ub += [Gc[j], Dc[j]]; vals_ub += [1.0, -1.0]; rhs_ub.append(0.0); nub += 1
            rows_ub += [nub, nub, nub]; cols_ub += [Dc[j], Gc[j], Wc[j]]; vals_ub += [w, -w, -1.0]; rhs_ub.append(0.0); nub += 1
            if j < k:
                s = first + j
                # D <= Y_s ; capacity
                rows_ub += [nub, nub]; cols_ub += [Dc[j], yoff + s]; vals_ub += [1.0, -1.0]; rhs_ub.append(0.0); nub += 1
                cap_rows[s].append((Wc[j], 1.0))
        # X_j = ticks in slots first..first+j; the rest, rem = O - X_j, lie after the slot's end e and each
        # lasts >= k0 + w_lo, so C_i >= e + rem (k0 + w_lo) where rem > 0; with lo = min(e, a_i + alone_i)
        # (<= C_i when rem = 0), C_i >= lo + rem ((k0 + w_lo) + (e - lo) / O) holds for every rem in [0, O]
        if cumulative:
            Xc = base + 3 * (k + 1) + np.arange(k)
            w_lo = min(w, first_work) if O >= 2 else first_work
            for j in range(k):
                prev = [Xc[j - 1]] if j else []
                rows_eq += [neq] * (2 + len(prev)); cols_eq += [Xc[j], Dc[j]] + prev
                vals_eq += [1.0, -1.0] + [-1.0] * len(prev); rhs_eq.append(0.0); neq += 1
                e = starts[first + j] + delta
                lo = min(e, r.arrival + alone[i])
                slope = (k0 + w_lo) + (e - lo) / O
                # L_i + a_i >= lo + (O - X_j) slope  ->  -slope X_j - L_i <= a_i - lo - slope O
                rows_ub += [nub, nub]; cols_ub += [Xc[j], loff + i]; vals_ub += [-slope, -1.0]
                rhs_ub.append(r.arrival - lo - slope * O); nub += 1
        # L_i >= (1/O) sum_s D t_s + S_i - a_i  ->  (1/O) sum D t - L <= a_i - S_i
        t_of = np.r_[starts[first:last], [t0 + delta * last]]  # the bucket: at or after its window
        rows_ub += [nub] * (k + 2); cols_ub += Dc.tolist() + [loff + i]; vals_ub += (t_of / O).tolist() + [-1.0]
        rhs_ub.append(r.arrival - spacing(k0, first_work, w, O)); nub += 1
        lb[loff + i] = alone[i]
    for s in range(S):
        for col, coef in cap_rows[s]:
            rows_ub.append(nub); cols_ub.append(col); vals_ub.append(coef)
        rhs_ub.append(delta); nub += 1
    A_ub = sp.csr_array((vals_ub, (rows_ub, cols_ub)), shape=(nub, nvar))
    A_eq = sp.csr_array((vals_eq, (rows_eq, cols_eq)), shape=(neq, nvar))
    if verbose:
        print(f"{N} requests, {S} slots of {delta} s, {nvar} columns, {nub + neq} rows")
    t = time.perf_counter()
    res = linprog(c, A_ub=A_ub, b_ub=rhs_ub, A_eq=A_eq, b_eq=rhs_eq, bounds=np.c_[lb, ub], method="highs")
    if verbose:
        print(f"LP {res.status} {res.message} in {time.perf_counter() - t:.1f} s")
    if res.status != 0:
        raise RuntimeError(res.message)
    # HiGHS's dual objective is what certifies; the primal value is within its tolerance of it
    return float(res.fun)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--slot", type=float, default=0.02)
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--limit", type=int, default=None, help="the first N requests only")
    a = ap.parse_args()
    inst = load_case(a.case)
    if a.limit:
        inst = Instance(inst.requests[:a.limit], inst.system, inst.cost)
    alone = time_alone(inst, Objective("mean_latency")).mean()
    print(f"each alone {alone:.6g} s")
    print(f"mean-busy LP {mean_busy_bound(inst, a.slot, a.window):.6g} s")


if __name__ == "__main__":
    main()
