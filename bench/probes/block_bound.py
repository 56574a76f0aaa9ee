"""Probe (issue 33): the block decomposition bound on mean latency, every request at 0, with each
block priced by the chain MIP with the block's own objective, against the ground truth's optima.

    python bench/probes/block_bound.py [CASE.toml ...] [--sizes 2,3,4] [--limit 20]

For blocks S of m requests (every m-subset, weight y = 1/C(N-2, m-2), own share f = (m-1)/(N-1):
each request's shares sum to 1 and each pair is covered once),

    sum_i C_i >= sum_S y V_S,   V_S = min over schedules of S alone of sum_j [f a U_j + (U_j - 1 + f) R_j]

(U_j: requests of S unfinished before batch j, R_j: batch j's time above the intercept a): the
issue's sum_{i in S} f (a B_i + X_ii) + sum_{i != j in S} X_ij, written per batch. Each V_S is
bounded below by HiGHS's dual bound of the chain model with that objective at a horizon J that
admits an optimum (every batch adds at least f a, so J = floor(V of a valid schedule / (f a))).
A measurement for the issue's notes, not a kvbound bound: see docs/formulation.md once it is one.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import replace
from math import comb
from pathlib import Path

import numpy as np

from kvbound.solvers.driver import solve
from kvbound.backends.highs import solve_highs
from kvbound.deadline import Deadline
from kvbound.formulation.chain import build_chain
from kvbound.io.cases import load_case
from kvbound.objective import Objective
from kvbound.schedule import validate

REPO = Path(__file__).resolve().parents[2]


def block_value(replay, intercept: float, f: float) -> float:
    """V of one schedule of the block: sum over batches of f a U_j + (U_j - 1 + f) R_j."""
    ends = replay.batch_end
    last = np.searchsorted(ends, replay.completion - 1e-12 * np.maximum(1, replay.completion))  # index of i's last batch
    total = 0.0
    for j in range(len(ends)):
        d = replay.batch_end[j] - replay.batch_start[j]
        if d <= 0:
            continue
        U = int(np.sum(last >= j))
        R = d - intercept
        total += f * intercept * U + (U - 1 + f) * R
    return total


def price(sub, f: float, limit: float) -> tuple[float, float, str]:
    """(lower bound on V_S, V of the best schedule known, HiGHS status)."""
    a = sub.cost.intercept
    start = solve(sub, "mean_latency", "highs", min(limit, 3.0), formulation="chain")
    upper = block_value(validate(sub, start.schedule), a, f)
    J = max(len(start.schedule.batches), int(math.floor(upper / (f * a) * (1 + 1e-9))))
    form = build_chain(sub, Objective.MEAN_LATENCY, J)
    md, coef0, per_second = form.model, form.coef[0], form.units.per_second
    u, q, T, y = (md.blocks[name] for name in ("u", "q", "T", "y"))
    bits = u.shape[1]
    weights = np.broadcast_to(2.0 ** np.arange(bits)[None, :], u.shape)
    # sum_j [U_j R_j + f a U_j - (1 - f) R_j], R_j = T_j - a y_j, in model time units
    md.set_objective([(q, weights), (u, f * coef0 * weights), (T, -(1 - f)), (y, (1 - f) * coef0)], 0.0)
    arrays = md.finalize()
    warm = form.warm_start(start.schedule)
    assert arrays.check(warm) == []
    warm_value = float(arrays.objective @ warm) / per_second
    assert abs(warm_value - upper) <= 1e-6 * max(1.0, upper), (warm_value, upper)
    out = solve_highs(arrays, Deadline(limit), warm)
    best = min(upper, out.objective / per_second) if out.objective is not None else upper
    return max(out.bound / per_second, 0.0), best, out.status


def block_bound(instance, m: int, limit: float) -> dict:
    N, a = len(instance), instance.cost.intercept
    assert all(r.arrival == 0 for r in instance.requests), "the probe prices blocks with every request at 0"
    f, weight = (m - 1) / (N - 1), 1 / comb(N - 2, m - 2)
    lower = upper = 0.0
    proven, began = 0, time.perf_counter()
    for S in itertools.combinations(range(N), m):
        sub = replace(instance, requests=tuple(instance.requests[i] for i in S))
        lo, hi, status = price(sub, f, limit)
        lower, upper, proven = lower + weight * lo, upper + weight * hi, proven + (status == "optimal")
    return {"m": m, "blocks": comb(N, m), "proven": proven, "mean_bound": lower / N, "mean_if_exact_at_best": upper / N,
            "seconds": time.perf_counter() - began}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--sizes", default="2,3,4")
    ap.add_argument("--limit", type=float, default=20.0)
    args = ap.parse_args()
    truth = json.loads((REPO / "bench/results/ground_truth.json").read_text())["cases"]
    cases = args.cases or [v["case"] for v in truth.values() if v["arrivals"] == "t0"]
    for case in cases:
        name = Path(case).stem
        opt = truth[name]["objectives"]["mean_latency"]
        if not opt.get("proven"):
            continue
        instance = load_case(REPO / case)
        today = opt["today"]["search"]["lower_bound"] if "today" in opt else float("nan")
        row = [f"{name}: optimum {opt['optimum']:.6g}, today's search bound {100 * today / opt['optimum']:.1f}%"]
        for m in map(int, args.sizes.split(",")):
            r = block_bound(instance, m, args.limit)
            row.append(f"m={m}: {100 * r['mean_bound'] / opt['optimum']:.1f}% ({r['proven']}/{r['blocks']} proven, "
                       f"{r['seconds']:.0f} s)")
        print("; ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
