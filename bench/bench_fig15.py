"""Figure 15 study: is evicting strictly better than any eviction-free schedule, per prompt length I?

    python bench/bench_fig15.py [--time-limit 600] [--formulation auto] [--cases cases/fig15/fig15_I1.toml,...]

Each case runs `kvbound prove CASE --compare default --vs no-evict` (each side gets half the time)
and records both optima (or bounds) and the verdict. Rows are appended to
bench/results/fig15.csv as each case finishes (a re-run skips finished ones) and
bench/results/fig15.md is rewritten from the CSV, atomically.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

from kvbound import load_case
from kvbound.analysis.sweep import ResultsTable
from kvbound.fileio import write_atomic
from kvbound.constraints import Constraints
from kvbound.solvers.options import SolveOptions
from kvbound.solvers.prove import compare_sets

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
FIG15 = [f"cases/fig15/fig15_I{2 ** k}.toml" for k in range(11)]
COLUMNS = ("case", "I", "time_limit_s", "formulation", "evict_status", "evict_objective_s", "evict_bound_s",
           "evict_evictions", "no_evict_status", "no_evict_objective_s", "no_evict_bound_s", "verdict", "seconds",
           "machine")
MACHINE = f"{os.cpu_count()}-core CPU"


def run_case(case: str, time_limit: float, formulation: str) -> dict:
    inst = load_case(ROOT / case)
    t0 = time.perf_counter()
    options = SolveOptions("total_latency", "highs", formulation, time_limit)
    out = compare_sets(inst, "default", Constraints(), "no-evict", Constraints(no_evict=True), options)
    a, b = out["evidence"]["default"], out["evidence"]["no-evict"]
    return {"case": case, "I": inst.requests[0].prompt, "time_limit_s": time_limit, "formulation": a["formulation"],
            "evict_status": a["status"], "evict_objective_s": a["objective"], "evict_bound_s": a["lower_bound"],
            "evict_evictions": a["evictions"], "no_evict_status": b["status"], "no_evict_objective_s": b["objective"],
            "no_evict_bound_s": b["lower_bound"], "verdict": out["verdict"], "seconds": f"{time.perf_counter() - t0:.1f}",
            "machine": MACHINE}


def write_markdown(rows: list[dict], path: Path) -> None:
    def num(v):
        try:
            return f"{float(v):.6g}"
        except (TypeError, ValueError):
            return str(v)

    lines = ["# Figure 15: evictions allowed vs forbidden", "",
             f"`python bench/bench_fig15.py`; {MACHINE}; `kvbound prove CASE --compare default --vs no-evict` "
             "(total_latency, HiGHS, each side half the time limit). *proved*: evicting is strictly better than "
             "every eviction-free schedule; *refuted*: an eviction-free schedule reaches the certified bound of "
             "all schedules, so the optimum needs no eviction.", "",
             "| I | with evictions: best (s) | status | bound (s) | evictions | no evictions: optimum (s) | status | verdict | seconds |",
             "|---:|---:|---|---:|---:|---:|---|---|---:|"]
    for r in sorted(rows, key=lambda r: int(r["I"])):
        lines.append(f"| {r['I']} | {num(r['evict_objective_s'])} | {r['evict_status']} | {num(r['evict_bound_s'])} | "
                     f"{r['evict_evictions']} | {num(r['no_evict_objective_s'])} | {r['no_evict_status']} | "
                     f"**{r['verdict']}** | {r['seconds']} |")
    write_atomic(path, "\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds per case, both sides together")
    ap.add_argument("--formulation", default="auto")
    ap.add_argument("--cases", default=",".join(FIG15))
    ap.add_argument("--out", default=str(RESULTS / "fig15.csv"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    cases = args.cases.split(",")
    out.parent.mkdir(parents=True, exist_ok=True)
    table = ResultsTable(out, COLUMNS, key="case")  # a re-run skips the cases already there
    for case in tqdm([c for c in cases if c not in table.done], desc="fig15 cases", unit="pt"):
        table.append([run_case(case, args.time_limit, args.formulation)])  # on disk before the next case starts
    done = {row["case"]: row for row in table.rows}
    write_markdown([done[c] for c in cases if c in done], out.with_suffix(".md"))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
