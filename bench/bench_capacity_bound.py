"""The certified capacity bound (issue 35, item 2) beside each scheduler's own capacity, both Splitwise traces.

    python bench/bench_capacity_bound.py [--cases NAME,...] [--schedulers vllm-v1,sarathi,larry,srpt]
                                         [--within 2] [--objectives mean_latency,mean_ttft] [--bound-only]

For each case of bench/cases_real (`python bench/real_cases.py` builds them; default: the 300- and
1,000-request windows of both Splitwise traces with their arrival times, tight M) and objective:
the limit (`--within` x the unloaded value, the mean of each request alone: `kvbound headroom`'s
yardstick), each scheduler's capacity (`kvbound.analysis.capacity.latency_capacity`, 1% bracket,
every schedule replayed by the validator) and the certified factor
(`kvbound.analysis.capacity_bound.capacity_upper_bound`) above which no schedule stays within the
limit, with the seconds each took. Writes bench/results/capacity_bound.md and
bench/results/runs/capacity_bound.json. `--bound-only`: recompute the certified factor only, keeping
the schedulers' capacities of runs/capacity_bound.json (they do not depend on the bound's code).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from kvbound.analysis.capacity import base_rate, latency_capacity
from kvbound.analysis.capacity_bound import capacity_upper_bound
from kvbound.analysis.headroom import unloaded_value
from kvbound.io.cases import load_case

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "bench" / "cases_real"
OUT = ROOT / "bench" / "results"
DEFAULT_CASES = ("splitwise_conv_300_tight_arr", "splitwise_code_300_tight_arr",
                 "splitwise_conv_1000_tight_arr", "splitwise_code_1000_tight_arr")


def run_case(name: str, objective: str, schedulers: list[str], within: float, kept: dict | None = None) -> dict:
    inst = load_case(CASES / f"{name}.toml")
    limit = within * unloaded_value(inst, objective)
    t0 = time.perf_counter()
    bound = capacity_upper_bound(inst, objective, limit)
    row = {"case": name, "requests": len(inst), "objective": objective, "base_rate": base_rate(inst),
           "limit": limit, "within": within, "upper_bound": bound.factor, "covered_by": bound.covered_by,
           "bound_seconds": round(time.perf_counter() - t0, 2), "schedulers": {}}
    if kept is not None:
        row["schedulers"] = kept["schedulers"]
        schedulers = []
    for s in schedulers:
        t0 = time.perf_counter()
        cap = latency_capacity(inst, s, objective, limit, rel_tol=0.01)
        row["schedulers"][s] = {"factor": cap.rate_factor, "note": cap.cap_note,
                                "seconds": round(time.perf_counter() - t0, 2)}
        print(f"{name} {objective} {s}: {cap.rate_factor}", flush=True)
    print(f"{name} {objective}: certified {bound.factor} ({bound.covered_by})", flush=True)
    return row


def report(rows: list[dict]) -> str:
    lines = ["# The certified capacity bound beside the schedulers' capacities (issue 35, item 2)", "",
             "`python bench/bench_capacity_bound.py` (cases from `python bench/real_cases.py`: the first 300 and 1,000 "
             "rows of each Splitwise trace with their arrival times, tight M, llama2-7b-h100). A capacity is a rate "
             "factor f (arrival times divided by f, `kvbound headroom`'s and `kvbound capacity`'s scaling): each "
             "scheduler's, the largest f whose objective stays within the limit (`--within` x the unloaded value, the "
             "mean of each request alone), by bisection to a 1% bracket, every schedule replayed by the validator; "
             "*certified*: at this factor and every larger one **no schedule** stays within the limit "
             "(docs/analysis.md, \"The certified capacity bound\"). *gap*: certified / best scheduler's. "
             f"Machine: {platform.machine()}, 2 cores, shared.", "",
             "| case | N | req/s at f = 1 | objective | limit (s) | " + "capacity: " + " | ".join(
                 rows[0]["schedulers"]) + " | certified upper bound | gap | covered by | bound s |",
             "|---|---:|---:|---|---:|" + "---:|" * len(rows[0]["schedulers"]) + "---:|---:|---|---:|"]
    for r in rows:
        caps = [v["factor"] for v in r["schedulers"].values()]
        best = max((c for c in caps if c is not None), default=None)
        gap = f"{r['upper_bound'] / best:.2f}x" if best and r["upper_bound"] else "-"
        cells = [f"{c:.3g}" if c is not None else "-" for c in caps]
        up = f"{r['upper_bound']:.3g}" if r["upper_bound"] is not None else "none"
        lines.append(f"| {r['case']} | {r['requests']} | {r['base_rate']:.3g} | {r['objective']} | {r['limit']:.4g} | "
                     + " | ".join(cells) + f" | **{up}** | {gap} | {r['covered_by']} | {r['bound_seconds']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--schedulers", default="vllm-v1,sarathi,larry,srpt")
    ap.add_argument("--objectives", default="mean_latency,mean_ttft")
    ap.add_argument("--within", type=float, default=2.0)
    ap.add_argument("--bound-only", action="store_true")
    args = ap.parse_args()
    kept = {}
    if args.bound_only:
        kept = {(r["case"], r["objective"]): r for r in json.loads((OUT / "runs" / "capacity_bound.json").read_text())}
    rows = [run_case(c, o, args.schedulers.split(","), args.within, kept[(c, o)] if args.bound_only else None)
            for c in args.cases.split(",") for o in args.objectives.split(",")]
    (OUT / "runs").mkdir(parents=True, exist_ok=True)
    (OUT / "runs" / "capacity_bound.json").write_text(json.dumps(rows, indent=1) + "\n")
    (OUT / "capacity_bound.md").write_text(report(rows))
    print(report(rows))


if __name__ == "__main__":
    main()
