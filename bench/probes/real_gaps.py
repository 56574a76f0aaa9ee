"""Probe: where a real-trace case's gap comes from: the best heuristic schedule against the analytic bound's components.

    python bench/probes/real_gaps.py CASE.toml [CASE.toml ...] [--objective total_latency|mean_latency] [--json]

Total latency (the bound is `min_batches x intercept + minimum_work`, docs/formulation.md):
the schedule's makespan = batches x intercept + its non-intercept work + idle time, so the gap
splits exactly into (batches - bound's batches) x intercept, (work - minimum work) and idle time.
The bound's batch count is the largest of its parts (longest output, tokens / C, prompts / P,
KV area / M, dual-feasible KV packing), all printed; the schedule's mean KV and token use per
batch say whether it is packed (then the bound is what is loose) or not (the schedule is).

Mean latency (the bound is the mean of `completion_order_bounds`, a bound on the k-th smallest
completion for every k): the gap in seconds is the mean over k of (schedule's k-th completion -
bound k); it is printed per quarter of k, so that one sees whether the first or the last requests
to finish carry it.

Only heuristic schedules are compared (the best of kvbound.schedulers.FAST_HEURISTICS for the
objective); in the realistic benchmark the solver rarely improves on them (bench/results/runs/real.md). Its output
on the suite's cases when that was so: bench/results/runs/real_gaps.txt.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from kvbound import load_case
from kvbound.alone import minimum_work
from kvbound.bounds.analytic import analytic_bounds, completion_order_bounds
from kvbound.bounds.kv_items import dff_batches, min_batches
from kvbound.objective import Objective
from kvbound.schedule import validate
from kvbound.solvers import SolveOptions
from kvbound.solvers.phases.heuristics import heuristic_candidates


def anatomy(path: Path, objective: str) -> dict:
    inst = load_case(path)
    obj = Objective.parse(objective)
    cands = [c for c in heuristic_candidates(inst, SolveOptions(obj)) if c.name != "serial"]
    best = min(cands, key=lambda c: obj.of(c.metrics))
    rep = validate(inst, best.schedule)
    s, cost, reqs = inst.system, inst.cost, inst.requests
    value = obj.of(rep.metrics)
    bounds = {b.name: b.value for b in analytic_bounds(inst, obj)}
    lb = max(bounds.values())
    used = rep.batch_features[:, 0] > 0 if rep.batch_features.size else np.array([], bool)
    tokens = rep.batch_features[used, 1] if rep.batch_features.size else np.array([])
    out = {"case": path.stem, "N": len(inst), "M": s.kv_capacity, "objective": objective, "best_heuristic": best.name,
           "value": value, "bound": lb, "gap": (value - lb) / value, "bounds": bounds,
           "batches": int(rep.metrics.batches), "evictions": int(rep.metrics.evictions),
           "recomputed_tokens": int(rep.metrics.recomputed_tokens),
           "mean_kv_use": float(np.mean(rep.batch_kv[used]) / s.kv_capacity) if used.any() else 0.0,
           "mean_token_use": float(np.mean(tokens) / s.max_batch_tokens) if used.any() else 0.0,
           # batches holding less than half of M: where a schedule that keeps the KV full would save batches
           "batches_below_half_kv": int(np.sum(rep.batch_kv[used] < 0.5 * s.kv_capacity)) if used.any() else 0}
    if obj is Objective.TOTAL_LATENCY:
        area = sum(r.output * r.prompt + r.output * (r.output - 1) // 2 for r in reqs)
        parts = {"longest output": max(r.output for r in reqs),
                 "tokens / C": math.ceil(sum(r.peak_kv for r in reqs) / s.max_batch_tokens),
                 "prompts / P": math.ceil(sum(r.prompt for r in reqs) / s.max_prefill_tokens),
                 "KV area / M": math.ceil(area / s.kv_capacity), "dual-feasible KV packing": dff_batches(inst)}
        nb = min_batches(inst)
        busy = float(np.sum(rep.batch_end - rep.batch_start))
        work = busy - rep.metrics.batches * cost.intercept
        out.update({"bound_batches": nb, "bound_batch_parts": parts,
                    "gap_from_batches_s": (rep.metrics.batches - nb) * cost.intercept,
                    "schedule_work_s": work, "minimum_work_s": minimum_work(inst),
                    "gap_from_work_s": work - minimum_work(inst), "idle_s": value - busy})
    else:
        bound_k = completion_order_bounds(inst, obj)
        done = np.sort(rep.first_token if obj.first_token else rep.completion)
        excess = done - bound_k  # >= 0 for every k
        q = np.array_split(np.arange(len(inst)), 4)
        n = len(inst)
        out.update({"ordering_bound": float((bound_k.sum() - inst.arrivals.sum()) / n),
                    "gap_s": float(excess.sum() / n),
                    "gap_s_by_quarter_of_k": [float(excess[ix].sum() / n) for ix in q],
                    "excess_last_k_s": float(excess[-1]), "excess_median_k_s": float(excess[n // 2])})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--objective", default="total_latency", choices=("total_latency", "mean_latency"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for c in args.cases:
        a = anatomy(Path(c), args.objective)
        if args.json:
            print(json.dumps(a))
            continue
        print(f"{a['case']} ({a['objective']}): best heuristic {a['best_heuristic']} {a['value']:.6g} s, "
              f"bound {a['bound']:.6g} s, gap {100 * a['gap']:.2f}%; {a['batches']} batches, {a['evictions']} evictions, "
              f"mean KV use {100 * a['mean_kv_use']:.1f}% of M ({a['batches_below_half_kv']} batches below M/2), mean tokens {100 * a['mean_token_use']:.1f}% of C")
        if "bound_batches" in a and a["bound"] > a["bounds"]["batches x intercept + minimum work"] * (1 + 1e-9):
            b = a["bounds"]["batches x intercept + minimum work"]
            print(f"  binding: latest arrival + own work {a['bound']:.4f} s; the batch-count bound is {b:.4f} s "
                  f"({a['bound_batches']} batches); the schedule: {a['batches']} batches, idle {a['idle_s']:.4f} s, "
                  f"busy {a['value'] - a['idle_s']:.4f} s, work {a['schedule_work_s']:.4f} s vs minimum {a['minimum_work_s']:.4f} s")
        elif "bound_batches" in a:
            print(f"  bound batches {a['bound_batches']} = max({', '.join(f'{k} {v}' for k, v in a['bound_batch_parts'].items())})")
            print(f"  gap {a['value'] - a['bound']:.4f} s = batches {a['gap_from_batches_s']:.4f} s + work "
                  f"{a['gap_from_work_s']:.4f} s (schedule {a['schedule_work_s']:.4f} vs minimum {a['minimum_work_s']:.4f}) "
                  f"+ idle {a['idle_s']:.4f} s")
        else:
            print(f"  bounds: {', '.join(f'{k} {v:.4f}' for k, v in a['bounds'].items())}")
            print(f"  gap {a['gap_s']:.4f} s by quarter of completion rank k: "
                  f"{', '.join(f'{v:.4f}' for v in a['gap_s_by_quarter_of_k'])}; "
                  f"excess at median k {a['excess_median_k_s']:.4f} s, at last k {a['excess_last_k_s']:.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
