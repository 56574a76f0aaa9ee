"""Probe: a completion-rank profile of batches and tokens for mean latency, every request at 0 (issue 33;
not part of kvbound).

    python bench/probes/rank_profile.py CASE [CASE ...]          # the LP and the order search
    python bench/probes/rank_profile.py CASE --schedule-limit 60 # also a solve's best schedule, rank by rank

Measured and not adopted (bench/results/NOTES.md, "a rank profile of batches and tokens"). Let B_k be the
batch in which the k-th request completes and T_k the tokens processed in batches 1..B_k. Every batch costs
the intercept a and at least per_token p for each token it processes, and each request's other work
(attention, KV reads; `extras`: per token the cheaper of a decode and a refill) is done by its completion, so

    C_(k) >= a B_k + p T_k + (the k smallest extras),

with T_k >= the k smallest token counts (I + O - 1), B_k >= the capacity floor (`kv_items.CompletionFloor`)
and the k-th smallest batches alone, and the batches between two completions processing at most C tokens
each: B_k - B_(k-1) >= (T_k - T_(k-1)) / C. The LP over (B, T, C) adds the capacity coupling (a request that
decodes in batches without others' prefills leaves their capacity unused, which later ranks pay in batches)
to the k-th completion bound (`analytic.completion_order_bounds`, also a row: C_(k) >= c_k).

`order search`: the same terms with the ranks' requests one order (B_k the longest of the first k alone,
T_k their tokens): a local search over orders gives an upper estimate of what the nesting of the ranks'
sets could add (the true least over orders is at most it).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import lil_matrix

from kvbound.alone import batches_alone, first_prefill_work, largest_chunk
from kvbound.bounds.analytic import completion_order_bounds
from kvbound.bounds.kv_items import CompletionFloor
from kvbound.io import load_case
from kvbound.objective import Objective

MEAN = Objective.MEAN_LATENCY
#: the order search is cubic per pass: larger cases get the LP only
ORDER_SEARCH_UP_TO = 100


def extras(instance) -> np.ndarray:
    """Per request, its least work beyond per_token x the tokens it processes."""
    cost, chunk = instance.cost, largest_chunk(instance)
    p = cost.per_token
    out = []
    for r in instance.requests:
        m = r.prompt + np.arange(2, r.output + 1) - 2.0
        decode = cost.work(1.0, m, decode=True) - p
        refill = cost.work(m + 1, 0.0, decode=False) - p * (m + 1)
        first = first_prefill_work(r.prompt, cost, chunk) - p * r.prompt
        out.append(float(first + np.minimum(decode, refill).sum()))
    return np.array(out)


def rank_lp(instance) -> tuple[float, np.ndarray]:
    """(the LP's mean latency, its (B, T, C) per rank)."""
    n, cost = len(instance), instance.cost
    a, p, C = cost.intercept, cost.per_token, instance.system.max_batch_tokens
    S = np.cumsum(np.sort(np.array([r.peak_kv for r in instance.requests], dtype=float)))
    floor = np.maximum(CompletionFloor(instance).floor, np.sort(batches_alone(instance, MEAN))).astype(float)
    E = np.cumsum(np.sort(extras(instance)))
    c = completion_order_bounds(instance, MEAN)
    A, b, row = lil_matrix((3 * n, 3 * n)), np.zeros(3 * n), 0
    for k in range(n):  # columns: B 0..n-1, T n..2n-1, C 2n..3n-1
        A[row, n + k], A[row, k] = 1 / C, -1
        if k:
            A[row, n + k - 1], A[row, k - 1] = -1 / C, 1
        row += 1
        A[row, k], A[row, n + k], A[row, 2 * n + k], b[row] = a, p, -1, -E[k]
        row += 1
        if k:
            A[row, n + k - 1], A[row, n + k] = 1, -1
            row += 1
    bounds = [(f, None) for f in floor] + [(s, None) for s in S] + [(v, None) for v in c]
    res = linprog(np.r_[np.zeros(2 * n), np.ones(n)], A_ub=A.tocsr()[:row], b_ub=b[:row], bounds=bounds,
                  method="highs")
    return res.fun / n, res.x.reshape(3, n)


def order_search(instance) -> float:
    """The least over orders found by insertion moves from three starts (an upper estimate)."""
    n, cost = len(instance), instance.cost
    a, p, C = cost.intercept, cost.per_token, instance.system.max_batch_tokens
    b = batches_alone(instance, MEAN).astype(float)
    t = np.array([r.peak_kv for r in instance.requests], dtype=float)
    e, c = extras(instance), completion_order_bounds(instance, MEAN)

    def value(order):
        T = np.cumsum(t[order])
        B = np.maximum(np.maximum.accumulate(b[order]), np.ceil(T / C))
        return float(np.maximum(a * B + p * T + np.cumsum(e[order]), c).sum()) / n

    best = np.inf
    for start in (np.argsort(t), np.argsort(b), np.argsort(a * b + p * t + e)):
        order, current, moved = list(start), value(start), True
        while moved:
            moved = False
            for i in range(n):
                for j in range(n):
                    trial = order[:i] + order[i + 1:]
                    trial.insert(j, order[i])
                    v = value(np.array(trial))
                    if v < current - 1e-12:
                        order, current, moved = trial, v, True
        best = min(best, current)
    return best


def schedule_profile(instance, limit: float) -> None:
    """A solve's best schedule: each rank's request, batch B_k, tokens T_k and completion, beside the LP's."""
    from kvbound.schedule import validate
    from kvbound.solvers.driver import solve

    result = solve(instance, "mean_latency", time_limit=limit)
    replay = validate(instance, result.schedule)
    tokens = np.cumsum([sum(batch.tokens.values()) for batch in result.schedule.batches])
    at = np.searchsorted(replay.batch_end, replay.completion - 1e-12)
    _, (B, T, Cl) = rank_lp(instance)
    print(f"best {result.objective:.6g} s, bound {result.lower_bound:.6g} s")
    print("rank (I, O)          schedule: B_k  T_k     C_k   | LP: B_k  T_k     C_k")
    for k, i in enumerate(np.argsort(replay.completion)):
        print(f"{k + 1:4d} ({instance.prompts[i]}, {instance.outputs[i]})".ljust(22)
              + f"{at[i] + 1:12d} {int(tokens[at[i]]):7d} {replay.completion[i]:.3f} | {B[k]:7.1f} {T[k]:7.0f} {Cl[k]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--schedule-limit", type=float, default=None)
    args = ap.parse_args()
    for path in args.cases:
        instance = load_case(path)
        began = time.perf_counter()
        lp, _ = rank_lp(instance)
        kth = float(completion_order_bounds(instance, MEAN).sum()) / len(instance)
        orders = f"order search <= {order_search(instance):.6g} s" if len(instance) <= ORDER_SEARCH_UP_TO else ""
        print(f"{instance.name}: k-th completion {kth:.6g} s, rank LP {lp:.6g} s ({time.perf_counter() - began:.2f} s) "
              + orders, flush=True)
        if args.schedule_limit:
            schedule_profile(instance, args.schedule_limit)


if __name__ == "__main__":
    main()
