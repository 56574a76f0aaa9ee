"""Probe: a window LP that sees batch congestion with arrival times (issue 33; not part of kvbound).

    python bench/probes/window_congestion.py CASE [--window S] [--horizon S]
    # e.g. bench/cases_real/splitwise_conv_300_loose_arr.toml --window 1 --horizon 110

Measured and not adopted (bench/results/NOTES.md, "a window LP for congestion"). For every schedule,
with N(t) the requests arrived and unfinished at t, k(t) those in the batch running at t and D(t)
the completions by t, sum_r (C_r - a_r) = integral of N, and N >= k, N >= A - D. Cut time into
windows w of length L and let I_w be the span of the batches that start in w: the I_w tile the
time line, so the integral of N is at least sum_w max(integral over I_w of k, of A - D). Over I_w:

* integral of k = sum_j k_j d_j >= k0 E_w + R_w^2 / B_w (B_w batches, E_w entries (request, batch),
  R_w the sum of sqrt(work) over the entries: k_j W_j >= (sum_q sqrt(w_q))^2 by Cauchy-Schwarz);
* integral of A - D >= (A(tau_w) - D_w)(L - Zmax) (D_w: completions by the end of I_w, Zmax: the
  longest batch, which bounds how far I_w can start into w) and >= the same integral with each
  request alone (finished no earlier than a_r + T_r);
* the batches of w take k0 B_w + W_w <= L + Z_w - Z_{w-1} (Z: overhang into the next window);
  W_w >= R_w^2 / E_w; completions need resources: D_w is at most the number of requests that could
  finish by then whose least entries (O_r), sum of sqrt(token work) and least work fit in the
  windows so far (the smallest first, a concave envelope; one line per breakpoint kept).

The convex terms enter as tangent cuts (each LP a relaxation: every value is a bound); HiGHS.
"""
from __future__ import annotations

import argparse
import math
import time

import highspy
import numpy as np

from kvbound.alone import largest_chunk, time_alone, token_work
from kvbound.io.cases import load_case
from kvbound.objective import Objective

#: per window: batches, entries, sum of sqrt(work), work, overhang, completions, k-part epigraph,
#: the window's lower bound z, and the cumulative entries, sqrt-work and work
B_, E_, R_, W_, Z_, D_, S_, Zt, Ec, Rc, Wc = range(11)
NV = 11


def window_bound(inst, window: float, horizon: float | None, lines: int = 64, rounds: int = 30) -> dict:
    cost, reqs = inst.cost, inst.requests
    k0, N = cost.intercept, len(reqs)
    chunk = largest_chunk(inst)
    arrivals = np.array([r.arrival for r in reqs])
    alone = time_alone(inst, Objective("mean_latency"))
    works = [token_work(r, cost, chunk) for r in reqs]
    need_e = np.array([r.output for r in reqs], float)  # >= one entry a token
    need_w = np.array([w.sum() for w in works])
    need_r = np.array([np.sqrt(w).sum() for w in works])  # a prefill's chunks: sum of sqrt >= sqrt of sum
    system = inst.system
    held = np.array([r.prompt + r.output - 1 for r in reqs], float)
    C = system.max_batch_tokens
    kv = min(system.kv_capacity, held.sum())
    zmax = cost.batch_time(C, kv, C * C + 2 * C * held.max(), kv, min(N, C))
    horizon = horizon or float(arrivals.max() + alone.sum())
    K = int(math.ceil(horizon / window))
    tau = np.arange(K + 1) * window
    finish_alone = arrivals + alone

    def integral(times, a, b):  # of #{times <= t} over [a, b]
        return np.clip(b - np.maximum(times, a), 0, None).sum()

    inf = highspy.kHighsInf
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    n = NV * K + 1  # and the entries after the horizon
    lo, hi, c = np.zeros(n), np.full(n, inf), np.zeros(n)
    col = lambda w, k: w * NV + k  # noqa: E731
    for w in range(K):
        hi[col(w, Z_)], hi[col(w, D_)], c[col(w, Zt)] = zmax, N, 1.0
    c[-1] = k0
    h.addVars(n, lo, hi)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), c)

    def row(lb, ub, idx, val):
        h.addRow(lb, ub, len(idx), np.array(idx, dtype=np.int32), np.array(val, dtype=float))

    for w in range(K):
        for x, cum in ((E_, Ec), (R_, Rc), (W_, Wc)):
            row(0, 0, [col(w, cum), col(w, x)] + ([col(w - 1, cum)] if w else []), [1.0, -1.0] + ([-1.0] if w else []))
        row(-inf, window, [col(w, B_), col(w, W_), col(w, Z_)] + ([col(w - 1, Z_)] if w else []),
            [k0, 1.0, -1.0] + ([1.0] if w else []))
        row(-inf, 0, [col(w, E_), col(w, B_)], [1.0, -C])
        row(-inf, 0, [col(w, B_), col(w, E_)], [1.0, -1.0])
        row(-inf, 0, [col(w, E_), col(w, R_)], [math.sqrt(cost.per_token), -1.0])
        row(0, inf, [col(w, W_), col(w, E_)], [1.0, -cost.per_token])
        row(0, inf, [col(w, Zt), col(w, E_), col(w, S_)], [1.0, -k0, -1.0])
        start = tau[w] + (zmax if w else 0.0)
        lc = tau[w + 1] - start
        row((arrivals <= tau[w]).sum() * lc, inf, [col(w, Zt), col(w, D_)], [1.0, lc])
        row(integral(arrivals, start, tau[w + 1]) - integral(finish_alone, start, tau[w + 1]), inf, [col(w, Zt)], [1.0])
        eligible = finish_alone <= tau[w + 1]
        m = int(eligible.sum())
        row(-inf, m, [col(w, D_)], [1.0])
        if not m:
            continue
        for need, cum in ((need_e, Ec), (need_r, Rc), (need_w, Wc)):
            xs = np.sort(need[eligible])
            before = np.r_[0.0, np.cumsum(xs)]
            for k in np.unique(np.linspace(0, m - 1, min(lines, m)).astype(int)):
                row(-inf, k - before[k] / xs[k], [col(w, D_), col(w, cum)], [1.0, -1.0 / xs[k]])
    row(need_e.sum(), inf, [n - 1] + [col(w, E_) for w in range(K)], [1.0] * (K + 1))
    best, t0 = -inf, time.time()
    for _ in range(rounds):
        h.run()
        value = h.getInfo().objective_function_value
        best = max(best, value)
        x = np.array(h.getSolution().col_value)
        added = 0
        for w in range(K):
            b, e, r, wk, s = (x[col(w, k)] for k in (B_, E_, R_, W_, S_))
            if r <= 1e-12:
                continue
            if s < r * r / max(b, 1e-12) * (1 - 1e-6):
                g = r / max(b, 1e-9)
                row(0, inf, [col(w, S_), col(w, R_), col(w, B_)], [1.0, -2 * g, g * g])
                added += 1
            if wk < r * r / max(e, 1e-12) * (1 - 1e-6):
                g = r / max(e, 1e-9)
                row(0, inf, [col(w, W_), col(w, R_), col(w, E_)], [1.0, -2 * g, g * g])
                added += 1
        if not added:
            break
    return {"mean": best / N, "each_alone": float(alone.mean()), "windows": K, "zmax": zmax, "seconds": time.time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--horizon", type=float, default=None)
    args = ap.parse_args()
    out = window_bound(load_case(args.case), args.window, args.horizon)
    print(f"window LP: mean latency >= {out['mean']:.5f} s (each request alone {out['each_alone']:.5f} s; "
          f"{out['windows']} windows, longest batch {out['zmax']:.4f} s, {out['seconds']:.1f} s)")


if __name__ == "__main__":
    main()
