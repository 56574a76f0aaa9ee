"""Solver benchmark: time to proven optimality, or the gap after a fixed time, per backend and formulation.

    python bench/bench_solvers.py [--time-limit 30] [--backends highs,cpsat,cbc] [--formulations chain,bigm]
                                  [--cases cases/fig15/fig15_I1.toml,...] [--objective total_latency]

Each (case, formulation, backend) point runs `kvbound.solvers.api.solve` with the default
warm start and a certified horizon. Results are appended to bench/results/solvers.csv as
each point finishes (an interrupted run loses nothing; a re-run skips finished points), and
bench/results/solvers.md is rewritten from the CSV, atomically.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tqdm import tqdm

from kvbound import load_case, run_scheduler
from kvbound.analysis.sweep import ResultsTable
from kvbound.fileio import write_atomic
from kvbound.formulation import FORMULATION_KINDS, MODEL_LIMIT
from kvbound.formulation.horizon import horizon_for
from kvbound.objective import Objective
from kvbound.solvers import solve

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
FIG15 = [f"cases/fig15/fig15_I{2 ** k}.toml" for k in range(11)]
MIXES = ["cases/mix46/siso_liso.toml", "cases/mix46/siso_liso_32.toml"]
COLUMNS = ("case", "requests", "objective", "formulation", "backend", "time_limit_s", "status", "objective_s",
           "lower_bound_s", "certified", "gap", "seconds", "time_to_optimal_s", "best_source", "evictions",
           "horizon", "variables", "build_s", "machine")
MACHINE = f"{os.cpu_count()}-core CPU"
#: larger state-network models are not attempted (memory, build time)
SKIP = {"network": (1_000_000, "transition"), "chain": (MODEL_LIMIT, "arc")}


def _key(row) -> tuple:
    return (row["case"], row["objective"], row["formulation"], row["backend"], str(row["time_limit_s"]))


def run_point(case: str, objective: str, formulation: str, backend: str, time_limit: float) -> dict:
    inst = load_case(ROOT / case)
    if formulation in SKIP:
        limit, what = SKIP[formulation]
        ub = min(run_scheduler(inst, s).replay.metrics.total_latency for s in ("vllm-ef", "sarathi-pc-ef"))
        size = FORMULATION_KINDS[formulation].size(inst, horizon_for(inst, Objective(objective), ub, True, True)[0])
        if size > limit:
            return {**dict.fromkeys(COLUMNS, ""), "case": case, "requests": len(inst), "objective": objective,
                    "formulation": formulation, "backend": backend, "time_limit_s": time_limit,
                    "status": f"skipped: ~{size:,} {what} variables", "machine": MACHINE}
    res = solve(inst, objective, backend, time_limit, formulation=formulation)
    return {
        "case": case, "requests": len(inst), "objective": objective, "formulation": formulation, "backend": backend,
        "time_limit_s": time_limit, "status": res.status, "objective_s": res.objective,
        "lower_bound_s": res.lower_bound, "certified": str(res.bound_certified),  # True/False, as the CSV has it
        "gap": "" if res.gap is None else f"{res.gap:.6f}", "seconds": f"{res.seconds:.2f}",
        "time_to_optimal_s": f"{res.seconds:.2f}" if res.status == "optimal" else "",
        "best_source": res.source, "evictions": res.metrics.evictions if res.metrics else "",
        "horizon": res.stats["horizon"], "variables": res.stats["model"]["variables"],
        "build_s": f"{res.stats['build_seconds']:.3f}", "machine": MACHINE,
    }


def write_markdown(rows: list[dict], path: Path) -> None:
    lines = [
        "# Solver benchmark",
        "",
        f"`python bench/bench_solvers.py`; {MACHINE}; each point: `kvbound solve` with the default warm start "
        "(best of the fast heuristics), certified horizon, the given time limit. *time to optimal* is empty when the "
        "solver did not prove optimality within the limit; *gap* is (best schedule - certified lower bound) / best.",
        "",
        "| case | N | objective | formulation | backend | limit s | status | best (s) | bound (s) | gap | time to optimal s | evictions | J | vars |",
        "|---|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        def num(v):
            try:
                return f"{float(v):.6g}"
            except (TypeError, ValueError):
                return str(v)
        gap = f"{100 * float(r['gap']):.2f}%" if r["gap"] not in ("", None) else ""
        lines.append(f"| {Path(r['case']).stem} | {r['requests']} | {r['objective']} | {r['formulation']} | {r['backend']} | "
                     f"{r['time_limit_s']} | {r['status']} | {num(r['objective_s'])} | {num(r['lower_bound_s'])} | {gap} | "
                     f"{r['time_to_optimal_s']} | {r['evictions']} | {r['horizon']} | {r['variables']} |")
    lines += _speedups(rows)
    write_atomic(path, "\n".join(lines) + "\n")


def _speedups(rows: list[dict]) -> list[str]:
    """Time to optimality of each formulation against bigm on the same backend, same run; when
    bigm does not finish, the ratio is at least limit / time."""
    by = {(r["case"], r["backend"], r["formulation"]): r for r in rows}
    out = ["", "## Speed-up over bigm (same backend, same run)", "",
           "| case | backend | formulation | time to optimal s | bigm | speed-up |", "|---|---|---|---:|---|---:|"]
    for (case, backend, form), r in by.items():
        base = by.get((case, backend, "bigm"))
        if form == "bigm" or base is None or not r["time_to_optimal_s"]:
            continue
        t = float(r["time_to_optimal_s"])
        if base["time_to_optimal_s"]:
            ratio, what = f"{float(base['time_to_optimal_s']) / t:.1f}x", f"optimal, {base['time_to_optimal_s']} s"
        else:
            gap = f", gap {100 * float(base['gap']):.1f}%" if base["gap"] else ""
            ratio, what = f">= {float(base['time_limit_s']) / t:.1f}x", f"not proven in {base['time_limit_s']} s{gap}"
        out.append(f"| {Path(case).stem} | {backend} | {form} | {t:.2f} | {what} | {ratio} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--backends", default="highs,cpsat,cbc")
    ap.add_argument("--formulations", default="chain,bigm")
    ap.add_argument("--objective", default="total_latency")
    ap.add_argument("--cases", default=",".join(FIG15 + MIXES))
    ap.add_argument("--out", default=str(RESULTS / "solvers.csv"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    points = [(c, args.objective, f, b, args.time_limit) for c in args.cases.split(",")
              for f in args.formulations.split(",") for b in args.backends.split(",")]
    point_key = lambda p: _key(dict(zip(("case", "objective", "formulation", "backend", "time_limit_s"), p)))  # noqa: E731
    out.parent.mkdir(parents=True, exist_ok=True)
    table = ResultsTable(out, COLUMNS, key=_key)  # a re-run skips the points already there
    for p in tqdm([p for p in points if point_key(p) not in table.done], desc="solver points", unit="pt"):
        table.append([run_point(*p)])  # on disk before the next point starts
    done = {_key(row): row for row in table.rows}
    rows = [done[point_key(p)] for p in points]
    write_markdown(rows, out.with_suffix(".md"))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
