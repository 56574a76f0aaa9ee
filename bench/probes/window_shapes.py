"""Probe: the shapes of the schedules of a case's largest busy window, and the waits for the batch in
progress (not part of kvbound; bench/results/NOTES.md, "Code 300 with arrivals: where the 152-request
window's gap sits").

    python bench/probes/window_shapes.py CASE [--time-limit 90] [--schedulers sjf-mc,srpt:ratio=2]

The window is the largest of `busy_windows` over sjf-mc's schedule of the case, arrivals from 0. For each
scheduler named, and for `solve` on the window alone, the mean latency and the batches by kind: mixed (a
prefill chunk and a decode), prefill only, decode only, and the decodes a batch.

The waits: batch starts are at least (intercept + per_token) apart, and each request waits at least until
the first start at or after its arrival, so sum_i (time alone_i + that wait) bounds the sum of latencies.
The least sum of waits is found here by a dynamic program over candidate starts r_j + m d (m < --chains):
an upper estimate of the least sum (exact once the chains of starts pushed by the spacing are shorter),
enough to show whether the term matters.
"""
from __future__ import annotations

import argparse

import numpy as np

from kvbound import load_case, validate
from kvbound.alone import time_alone
from kvbound.objective import Objective
from kvbound.schedulers import run_scheduler
from kvbound.solvers import solve
from kvbound.solvers.phases.periods import busy_windows, window_instance


def largest_window(instance):
    replay = validate(instance, run_scheduler(instance, "sjf-mc").schedule)
    windows = busy_windows(np.asarray(instance.arrivals), np.asarray(replay.completion))
    return window_instance(instance, max(windows, key=len))[0]


def shape(instance, schedule) -> dict:
    """Mean latency and batches by kind (a request's tokens before its prompt is done are prefill)."""
    metrics = validate(instance, schedule).metrics
    done = np.zeros(len(instance), dtype=np.int64)
    prompts = [r.prompt for r in instance.requests]
    kinds = {"mixed": 0, "prefill only": 0, "decode only": 0}
    decodes = []
    for batch in schedule.batches:
        prefill = decode = 0
        for i, tokens in batch.tokens.items():
            if done[i] < prompts[i]:
                prefill += tokens
            else:
                decode += 1
            done[i] += tokens
        kinds["mixed" if prefill and decode else "prefill only" if prefill else "decode only"] += 1
        decodes.append(decode)
    return {"mean latency": metrics.mean_latency, "batches": len(schedule.batches), **kinds,
            "decodes a batch": float(np.mean(decodes))}


def least_waits(arrivals: np.ndarray, spacing: float, chains: int) -> float:
    """min over start sequences (>= spacing apart) on the grid r_j + m spacing of the sum of waits."""
    r = np.sort(arrivals)
    starts = np.unique((r[:, None] + spacing * np.arange(chains)[None, :]).ravel())
    served = np.searchsorted(r, starts, side="right")  # requests arrived by each start
    prefix = np.r_[0.0, np.cumsum(r)]
    best_ending = np.full(len(starts), np.inf)
    for k, (start, count) in enumerate(zip(starts, served)):
        value = count * start - prefix[count]  # the first start
        earlier = np.searchsorted(starts, start - spacing, side="right")
        if earlier:
            before = served[:earlier]
            value = min(value, float(np.min(best_ending[:earlier] + (count - before) * start
                                             - (prefix[count] - prefix[before]))))
        best_ending[k] = value
    return float(best_ending[served == len(r)].min())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--time-limit", type=float, default=90.0)
    parser.add_argument("--schedulers", default="sjf-mc,sjf-mc:prefill_limit=512,srpt:ratio=2")
    parser.add_argument("--chains", type=int, default=40)
    args = parser.parse_args()
    whole = load_case(args.case)
    window = largest_window(whole)
    print(f"window: {len(window)} requests over {float(np.max(window.arrivals)):.3f} s")
    for name in args.schedulers.split(","):
        print(name, shape(window, run_scheduler(window, name).schedule))
    result = solve(window, "mean_latency", time_limit=args.time_limit)
    print(f"solve: bound {result.lower_bound:.6g}", shape(window, result.schedule))
    alone = time_alone(whole, Objective.MEAN_LATENCY)
    spacing = whole.cost.intercept + whole.cost.per_token
    waits = least_waits(np.asarray(whole.arrivals, dtype=float), spacing, args.chains)
    print(f"whole case: mean alone {alone.mean():.6g} s, + least waits (upper estimate) {waits / len(whole):.6g} s")


if __name__ == "__main__":
    main()
