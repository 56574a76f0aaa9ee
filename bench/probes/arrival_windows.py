"""Probe: mean latency with arrival times, the requests cut into windows of consecutive arrivals, each window
solved as an instance of its own (issue 33; not part of kvbound).

    python bench/probes/arrival_windows.py CASE [--size 30] [--limit 20]
    python bench/probes/arrival_windows.py CASE --heuristics [--size 8,16,32,64]

Measured and not adopted (bench/results/NOTES.md, "a rank profile of batches and tokens", the arrivals
part). Restricting a schedule to a set of requests keeps it valid (fewer tokens and KV per batch; every
batch starts no later), so for a partition of the requests into windows, sum_i (C_i - a_i) >= the sum over
windows of each window's least sum of latencies, with its own arrival times: `kvbound solve`'s certified
bound on each window gives a bound on the whole. `--heuristics`: the best of three schedulers per window
instead, an upper estimate of what the partition could give even with every window priced exactly.
"""
from __future__ import annotations

import argparse

import numpy as np

from kvbound import Instance, load_case, run_scheduler
from kvbound.solvers.driver import solve


def windows(instance: Instance, size: int):
    order = np.argsort(instance.arrivals, kind="stable")
    for start in range(0, len(instance), size):
        members = order[start:start + size]
        yield Instance(tuple(instance.requests[i] for i in members), instance.system, instance.cost,
                       name=f"{instance.name}[{start}:{start + len(members)}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--size", default="30", help="window sizes, comma separated")
    ap.add_argument("--limit", type=float, default=20.0, help="seconds of `solve` per window")
    ap.add_argument("--heuristics", action="store_true")
    args = ap.parse_args()
    instance = load_case(args.case)
    n = len(instance)
    for size in (int(s) for s in args.size.split(",")):
        bound = best = 0.0
        for window in windows(instance, size):
            if args.heuristics:
                best += min(float(run_scheduler(window, spec).replay.latencies.sum())
                            for spec in ("srpt", "vllm-v1", "sarathi"))
                continue
            result = solve(window, "mean_latency", time_limit=args.limit)
            bound += result.lower_bound * len(window)
            best += result.objective * len(window)
            print(f"  {window.name}: bound {result.lower_bound:.5g} s, best {result.objective:.5g} s", flush=True)
        what = "windows' best heuristics (upper estimate)" if args.heuristics else f"partition bound {bound / n:.6g} s, windows' best"
        print(f"{instance.name}, windows of {size}: {what} {best / n:.6g} s", flush=True)


if __name__ == "__main__":
    main()
