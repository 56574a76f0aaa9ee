"""Probe (issue 33): where a schedule's mean latency goes, against what the pairwise bound certifies.

    python bench/probes/latency_split.py CASE.toml SCHEDULE.json

Replays the schedule (the validator) and splits each request's latency, its window [a_i, C_i], into
its own batches' intercepts and work, others' work in its window, intercepts of batches it skipped,
the batch running at its arrival and idle time (means over requests, seconds). Then the work each pair
shares, X_qr + X_rq (each one's work inside the other's window), counted at the pair's later arrival q
as the bound counts it, against the bound's terms for q (`analytic.pair_terms`: the pairs' work waits
plus q's intercept part), and the requests where they differ most. A measurement for
bench/results/NOTES.md, not a bound.
"""
from __future__ import annotations

import argparse

import numpy as np

from kvbound import load_case, validate
from kvbound.accounting import account_batch
from kvbound.alone import time_alone
from kvbound.bounds.analytic import pair_terms
from kvbound.io import load_schedule
from kvbound.objective import Objective
from kvbound.schedule import ReplayState


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("schedule")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    inst = load_case(args.case)
    schedule = load_schedule(args.schedule)
    replay = validate(inst, schedule)
    k0, n = inst.cost.intercept, len(inst)
    starts, ends = replay.batch_start, replay.batch_end
    arrivals, completion = replay.arrivals, replay.completion
    # each request's work in each batch (its batch time alone above the intercept), from the replayed state
    state, work = ReplayState(inst), []
    for batch in schedule.batches:
        evicted = set(batch.evict)
        work.append({i: account_batch({i: c}, state.m, state.n, state.prompt, evicted, inst.system.block_size)
                     .time(inst.cost) - k0 for i, c in batch.tokens.items()})
        state.apply(batch)
    split = dict.fromkeys(("own intercepts", "own work", "others' work", "skipped intercepts", "running at arrival",
                           "idle"), 0.0)
    inside = np.zeros((n, n))  # inside[i, j]: j's work inside i's window
    for q in range(n):
        seen = 0.0
        for j in range(len(starts)):
            if ends[j] <= arrivals[q] + 1e-12 or starts[j] >= completion[q] - 1e-12:
                continue
            if starts[j] < arrivals[q] - 1e-12:
                split["running at arrival"] += ends[j] - arrivals[q]
                seen += ends[j] - arrivals[q]
                continue
            length = ends[j] - starts[j]
            seen += length
            mine = work[j].get(q)
            split["own intercepts" if mine is not None else "skipped intercepts"] += k0
            split["own work"] += mine or 0.0
            split["others' work"] += length - k0 - (mine or 0.0)
            for i, w in work[j].items():
                if i != q:
                    inside[q, i] += w
        split["idle"] += completion[q] - arrivals[q] - seen
    objective = Objective.MEAN_LATENCY
    print(f"mean latency {replay.metrics.mean_latency:.6g} s; each alone {time_alone(inst, objective).mean():.6g} s")
    for key, value in split.items():
        print(f"  {key:<20} {value / n:.6g} s")
    order, rows, extra = pair_terms(inst, objective)
    position = np.empty(n, dtype=int)
    position[order] = np.arange(n)
    certified = np.zeros(n)
    for k, (later, pair) in enumerate(rows):
        certified[order[later]] += pair
    certified[order] += extra
    shared = np.zeros(n)
    for q in range(n):
        earlier = position < position[q]
        shared[q] = float((inside[q, earlier] + inside[earlier, q]).sum())
    print(f"work shared with earlier partners, a request: {shared.mean():.6g} s; the bound's terms: {certified.mean():.6g} s")
    for q in np.argsort(certified - shared)[:args.top]:
        r = inst.requests[q]
        print(f"  request {q}: arrival {r.arrival:.6g} s, I {r.prompt}, O {r.output}: shared {shared[q]:.4g} s, "
              f"bound {certified[q]:.4g} s (intercept part {extra[position[q]]:.4g} s)")


if __name__ == "__main__":
    main()
