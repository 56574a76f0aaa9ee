"""Re-bound finished benchmark rows: the same best schedules against the library's current analytic bounds.

    python bench/real_rebound.py bench/results/real_srpt_mean.csv [...] --out bench/results/real_rebound.md

Where several CSVs hold the same case and objective, the row of the last one named counts (a
later run of that point), so listing the runs oldest first gives the current figure per case; the
output ends with the median and largest gap per objective, N and arrivals.

A certified lower bound depends on the case alone, so a bound added after a benchmark ran applies
to that run's schedules too: per row (case, objective) this recomputes `analytic_bounds` (the
`kvbound bound` analytic rows) and reports the row's best schedule value, the bound it had
(solver, Lagrangian or analytic), the larger of that and the current analytic bound, and the gap
from each. Nothing is re-solved: the best value is the row's, produced and validated in its run.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvbound import load_case  # noqa: E402
from kvbound.formulation.bounds import analytic_bounds  # noqa: E402

CASES = ROOT / "bench" / "cases_real"


def rebound(row: dict, cases: Path) -> dict:
    inst = load_case(cases / f"{row['case']}.toml")
    bounds = analytic_bounds(inst, row["objective"])
    top = max(bounds, key=lambda b: b.value)
    best, old = float(row["best_value"]), float(row["lower_bound"])
    new = max(old, top.value)
    return {"case": row["case"], "run": row["run"], "objective": row["objective"], "limit s": row["time_limit_s"],
            "best (s)": f"{best:.6g}",
            "bound in run (s)": f"{old:.6g}", "gap in run": f"{_gap(best, old):.2%}",
            "analytic now (s)": f"{top.value:.6g}", "binding now": top.name if top.value > old else row["binding_bound"],
            "gap now": f"{_gap(best, new):.2%}"}


def _gap(best: float, bound: float) -> float:
    """(best - bound) / best, with a rounding-level difference (a bound equal to the schedule's
    value, summed in another order) shown as 0 rather than -0.00%."""
    gap = (best - bound) / best
    return 0.0 if abs(gap) < 1e-9 else gap


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--cases", default=str(CASES))
    ap.add_argument("--arrivals-only", action="store_true", help="only rows with real arrival times")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
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
    lines = [f"Re-bound of {', '.join(args.csv)} (`python bench/real_rebound.py`; no re-solve, see its docstring)", "",
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
