"""Re-bound finished benchmark rows: the same best schedules against the library's current bounds.

    python bench/real_cases.py                      # the cases first (bench/cases_real/, git-ignored; reads ../shared/data)
    python bench/real_rebound.py                    # the runs in bench/results/runs/real_runs.txt -> bench/results/real_rebound.md
    python bench/real_rebound.py A.csv B.csv --out F.md

Where several CSVs hold the same case and objective, the row of the last one named counts (a
later run of that point), so listing the runs oldest first gives the current figure per case
(runs/real_runs.txt lists every benchmark run of the suite that way, by file name in runs/; append
a new run at its end); the output ends with the median and largest gap per objective, N and arrivals.

A certified lower bound depends on the case alone, so a bound added after a benchmark ran applies
to that run's schedules too: per row (case, objective) this recomputes `analytic_bounds` (the
`kvbound bound` analytic rows), for mean latency with every request arriving together the
window-rank bound (with its share of the row's limit, as in a solve), for total latency the
configuration LP's batch bound, and
reports the row's best schedule value, the bound it had (solver, Lagrangian or analytic), the
larger of that and the current bounds, and the gap from each. Nothing is re-solved: the best value
is the row's, produced and validated in its run.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from kvbound import load_case
from kvbound.deadline import Deadline
from kvbound.alone import minimum_work
from kvbound.bounds.analytic import analytic_bounds
from kvbound.bounds.configuration_lp import configuration_batches
from kvbound.bounds.window_ranks import NAME as WINDOW_RANKS, WindowRanks, window_rank_bound
from kvbound.objective import Objective

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "bench" / "cases_real"
RESULTS = ROOT / "bench" / "results"
RUNS = RESULTS / "runs" / "real_runs.txt"  # the run logs (bench/bench_real.py --out) lie beside it
#: the configuration LP's time per total-latency row (it converges in 0.1-12 s on the suite's cases)
CONFIGURATION_SECONDS = 60.0


def rebound(row: dict, cases: Path) -> dict:
    inst = load_case(cases / f"{row['case']}.toml")
    bounds = [(b.value, b.name) for b in analytic_bounds(inst, Objective(row["objective"]))]
    if row["objective"] == "mean_latency" and WindowRanks().skip_reason(_Known(inst, row["objective"])) is None:
        # as in a solve: its share of the row's limit, not split below the analytic bounds
        method = WindowRanks()
        value, _ = window_rank_bound(inst, Deadline(method.share * float(row["time_limit_s"])),
                                     split_above=max(bounds)[0])
        bounds.append((value, WINDOW_RANKS))
    if row["objective"] == "total_latency":  # the configuration LP's batch count (converges in seconds)
        config = configuration_batches(inst, Deadline(CONFIGURATION_SECONDS))
        bounds.append((config.batches * inst.cost.intercept + minimum_work(inst),
                       f"configuration LP ({config.batches} batches)"))
    top_value, top_name = max(bounds)
    best, old = float(row["best_value"]), float(row["lower_bound"])
    new = max(old, top_value)
    return {"case": row["case"], "run": row["run"], "objective": row["objective"], "limit s": row["time_limit_s"],
            "best (s)": f"{best:.6g}",
            "bound in run (s)": f"{old:.6g}", "gap in run": f"{_gap(best, old):.2%}",
            "bound now (s)": f"{top_value:.6g}", "binding now": top_name if top_value > old else row["binding_bound"],
            "gap now": f"{_gap(best, new):.2%}"}


class _Known:
    """What a bound's skip_reason reads: the case and the objective."""

    def __init__(self, instance, objective: str):
        self.instance, self.objective = instance, Objective(objective)


def _gap(best: float, bound: float) -> float:
    """(best - bound) / best, with a rounding-level difference (a bound equal to the schedule's
    value, summed in another order) shown as 0 rather than -0.00%."""
    gap = (best - bound) / best
    return 0.0 if abs(gap) < 1e-9 else gap


def _shown(path: str) -> str:
    """A run's path as the README names it: from the repository root where it lies inside."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="*", help=f"runs, oldest first (default: those listed in {RUNS.relative_to(ROOT)})")
    ap.add_argument("--cases", default=str(CASES))
    ap.add_argument("--arrivals-only", action="store_true", help="only rows with real arrival times")
    ap.add_argument("--out", default=str(RESULTS / "real_rebound.md"))
    args = ap.parse_args(argv)
    if not args.csv:
        args.csv = [str(RUNS.parent / line.strip()) for line in RUNS.read_text(encoding="utf-8").splitlines()
                    if line.strip() and not line.startswith("#")]
    latest = {}
    for path in args.csv:
        for r in csv.DictReader(open(path, encoding="utf-8")):
            if r.get("best_value") and (not args.arrivals_only or r["arrivals"] == "arr"):
                latest[r["case"], r["objective"]] = {**r, "run": Path(path).name}
    rows = list(latest.values())
    out = [rebound(r, Path(args.cases)) for r in rows]
    if not out:
        ap.error("no finished rows")
    cols = list(out[0])
    shown = ", ".join(_shown(path) for path in args.csv)
    lines = [f"Re-bound of {shown} (`python bench/real_rebound.py`; no re-solve, see its docstring)", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in out]
    lines += ["", "| objective | N | arrivals | points | median gap now | max gap now |", "|---|---:|---|---:|---:|---:|"]
    groups: dict[tuple, list[float]] = {}
    for r, row in zip(out, rows):
        gap = float(r["gap now"].rstrip("%"))
        for arr in (row["arrivals"], "all"):
            groups.setdefault((row["objective"], int(row["requests"]), arr), []).append(gap)
    for (objective, n, arr), gaps in sorted(groups.items()):
        lines.append(f"| {objective} | {n} | {arr} | {len(gaps)} | {statistics.median(gaps):.2f}% | {max(gaps):.2f}% |")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
