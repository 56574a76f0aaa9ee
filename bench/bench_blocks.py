"""The block bound (issue 33, item 2) against today's bounds: the ground-truth set and real cases with arrivals.

    python bench/bench_blocks.py gt   [--sizes 3,4] [--exact-seconds 4] [--limit 30] [--cases NAME,...]
    python bench/bench_blocks.py real [--sizes 2,3,4,6,8] [--limit 60] [--cases NAME,...]
    python bench/bench_blocks.py solve [--cases NAME:LIMIT,...]   # `kvbound solve --objective mean_latency --json`
    python bench/bench_blocks.py report          # bench/results/blocks.md from bench/results/runs/blocks.json

gt: for every instance of bench/results/ground_truth.json and both mean objectives, as shares of
its optimum (or of the chain MIP's best where not proven: then upper estimates of the shares):
*today* (the best certified bound of the auto and search solves recorded there), *pairwise* (each
request alone + pairwise work waits, the family with no block), *blocks* (`kvbound.bounds.blocks.
block_bound` with its default pricing, the analytic, Lagrangian and completion-master bounds of each
block, `--limit` seconds in all), *blocks, MIP-priced* (each block priced by the chain MIP's
certified bound, `kvbound.solve(..., formulation="chain")`, at most `--exact-seconds` a block), and
*blocks at their best* (each block "priced" at its share of the optimal schedule restricted to it:
NOT a bound, an upper estimate of what exact pricing of these blocks could give).

real: bench/cases_real cases with arrivals (`python bench/real_cases.py` builds them): today's
analytic mean bounds and the block bound with its default pricing in `--limit` seconds, as shares of
the best schedule known (bench/results/real_rebound.md's, else the best of a few fast heuristics).

solve: `kvbound solve bench/cases_real/NAME.toml --objective mean_latency --time-limit LIMIT --json`
(the block bound as the search runs it), its block row beside the pairwise bound and the best, and
the run recorded in bench/results/real_rebound.md before the block bound (same limit).

Each run adds its rows to bench/results/runs/blocks.json (keyed by case, objective and kind) and rewrites
bench/results/blocks.md. One process, no parallelism (the machine is shared).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import re
import sys
import time
from pathlib import Path

from kvbound.bounds.analytic import analytic_bounds
from kvbound.bounds.blocks import BlockFamily, block_bound, restricted
from kvbound.deadline import Deadline
from kvbound.errors import SchedulerRefused, SchedulerStuck
from kvbound.io.cases import load_case
from kvbound.io.schedules import schedule_from_json
from kvbound.objective import Objective
from kvbound.schedule import validate
from kvbound.schedulers import run_scheduler
from kvbound.solvers.driver import solve

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
OUT_JSON, OUT_MD = RESULTS / "runs" / "blocks.json", RESULTS / "blocks.md"
REAL_CASES = ("splitwise_code_30_loose_arr", "splitwise_conv_100_loose_arr", "splitwise_code_300_loose_arr")
OBJECTIVES = (Objective.MEAN_LATENCY, Objective.MEAN_TTFT)


def load_results() -> dict:
    return json.loads(OUT_JSON.read_text()) if OUT_JSON.exists() else {"rows": {}}


def save(results: dict) -> None:
    OUT_JSON.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    OUT_MD.write_text(report(results))


def mip_pricer(objective: Objective, seconds: float):
    def price(sub, members, deadline):
        limit = max(0.1, min(seconds, deadline.remaining()))
        r = solve(sub, objective.value, "highs", limit, formulation="chain")
        return len(sub) * max(0.0, r.lower_bound) if math.isfinite(r.lower_bound) else 0.0
    return price


def at_best_pricer(objective: Objective, schedule, instance):
    def price(sub, members, deadline):  # NOT a bound: the optimum's restriction, an upper estimate
        return len(sub) * objective.of(validate(sub, restricted(schedule, members, sub)).metrics)
    return price


def run_gt(args) -> None:
    truth = json.loads((RESULTS / "ground_truth.json").read_text())["cases"]
    results = load_results()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    for name, case in truth.items():
        if args.cases and name not in args.cases.split(","):
            continue
        instance = load_case(REPO / case["case"])
        for objective in OBJECTIVES:
            rec = case["objectives"].get(objective.value)
            if rec is None:
                continue
            opt = rec["optimum"]
            schedule = schedule_from_json(rec["schedule"], name)
            assert math.isclose(objective.of(validate(instance, schedule).metrics), opt, rel_tol=1e-9)
            today = {k: rec["today"][k]["lower_bound"] if rec.get("today", {}).get(k, {}).get("bound_certified")
                     else -math.inf for k in ("auto", "search")}
            pairwise = BlockFamily(instance, objective).value
            t = time.perf_counter()
            default, fam = block_bound(instance, objective, Deadline(args.limit), schedule, sizes=sizes)
            t_default = time.perf_counter() - t
            t = time.perf_counter()
            mip, fam_mip = block_bound(instance, objective, Deadline(None), schedule, sizes=sizes,
                                       pricer=mip_pricer(objective, args.exact_seconds))
            t_mip = time.perf_counter() - t
            ceiling, _ = block_bound(instance, objective, Deadline(None), schedule, sizes=sizes,
                                     pricer=at_best_pricer(objective, schedule, instance))
            assert default <= opt * (1 + 1e-6) and mip <= opt * (1 + 1e-6), (name, objective, default, mip, opt)
            row = {"set": "gt", "case": name, "objective": objective.value, "N": len(instance),
                   "arrivals": case["arrivals"], "reference": opt, "proven": bool(rec.get("proven")),
                   "today_auto": today["auto"], "today_search": today["search"], "pairwise": pairwise, "blocks": default, "blocks_seconds": round(t_default, 1),
                   "blocks_mip": mip, "blocks_mip_seconds": round(t_mip, 1), "at_best": ceiling,
                   "blocks_priced": len(fam.blocks), "used": fam.used(), "used_mip": fam_mip.used(),
                   "sizes": list(sizes), "limit": args.limit, "exact_seconds": args.exact_seconds}
            results["rows"][f"gt/{name}/{objective.value}"] = row
            print(json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            save(results)


def rebound_best() -> dict:
    """(case, objective) -> the best schedule's value in bench/results/real_rebound.md (the smallest)."""
    out = {}
    for line in (RESULTS / "real_rebound.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 5 and re.match(r"^[a-z]", cells[0]) and cells[2] in ("mean_latency", "mean_ttft"):
            try:
                value = float(cells[4])
            except ValueError:
                continue
            key = (cells[0], cells[2])
            out[key] = min(out.get(key, math.inf), value)
    return out


def run_real(args) -> None:
    results = load_results()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    known = rebound_best()
    for name in (args.cases.split(",") if args.cases else REAL_CASES):
        instance = load_case(REPO / "bench" / "cases_real" / f"{name}.toml")
        for objective in OBJECTIVES:
            best_schedule, best, source = None, math.inf, ""
            for heuristic in ("sarathi", "vllm", "rank-i", "mcsf"):
                try:
                    sim = run_scheduler(instance, heuristic)
                except (SchedulerRefused, SchedulerStuck):
                    continue
                value = objective.of(validate(instance, sim.schedule).metrics)
                if value < best:
                    best_schedule, best, source = sim.schedule, value, heuristic
            reference, ref_source = best, f"best of fast heuristics ({source})"
            if (name, objective.value) in known and known[(name, objective.value)] < reference:
                reference, ref_source = known[(name, objective.value)], "real_rebound.md"
            today = max(b.value for b in analytic_bounds(instance, objective) if b.certified and b.found)
            t = time.perf_counter()
            value, fam = block_bound(instance, objective, Deadline(args.limit), best_schedule, sizes=sizes)
            seconds = time.perf_counter() - t
            assert value <= best * (1 + 1e-6)
            row = {"set": "real", "case": name, "objective": objective.value, "N": len(instance), "arrivals": "arr",
                   "reference": reference, "reference_source": ref_source, "today": today,
                   "pairwise": fam.base / len(instance), "blocks": value, "blocks_seconds": round(seconds, 1),
                   "blocks_priced": len(fam.blocks), "used": fam.used(), "sizes": list(sizes), "limit": args.limit}
            results["rows"][f"real/{name}/{objective.value}"] = row
            print(json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            save(results)


SOLVE_CASES = "splitwise_code_100_loose_arr:120,splitwise_code_300_loose_arr:300"


def record_solve(results: dict, name: str, limit: float, data: dict) -> dict:
    """One row from `kvbound solve --json`'s output `data`."""
    rows = {b["name"]: b for b in data["bounds"]}
    block = next((b for n, b in rows.items() if n.startswith("blocks")), None)
    pairwise = rows.get("each request alone + pairwise work waits", {}).get("value")
    before = rebound_rows().get((name, "mean_latency"))
    row = {"set": "solve", "case": name, "objective": "mean_latency", "limit": limit, "best": data["objective"],
           "bound": data["lower_bound"], "gap": data["gap"], "pairwise": pairwise,
           "blocks": block["value"] if block else None, "blocks_seconds": round(block["seconds"], 1) if block else None,
           "blocks_note": block["note"] if block else "", "before": before}
    results["rows"][f"solve/{name}/mean_latency"] = row
    return row


def rebound_rows() -> dict:
    """(case, objective) -> (limit, best, bound) of real_rebound.md's row with the best value."""
    out = {}
    for line in (RESULTS / "real_rebound.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 10 and cells[2] in ("mean_latency", "mean_ttft"):
            try:
                limit, best, bound = float(cells[3]), float(cells[4]), float(cells[5])
            except ValueError:
                continue
            key = (cells[0], cells[2])
            if key not in out or best < out[key][1]:
                out[key] = (limit, best, bound)
    return out


def run_solve(args) -> None:
    import subprocess
    results = load_results()
    for spec in (args.cases or SOLVE_CASES).split(","):
        name, limit = spec.split(":")
        out = subprocess.run(["kvbound", "solve", str(REPO / "bench" / "cases_real" / f"{name}.toml"), "--objective",
                              "mean_latency", "--time-limit", limit, "--json"], capture_output=True, text=True, check=True)
        row = record_solve(results, name, float(limit), json.loads(out.stdout))
        print(json.dumps(row), flush=True)
        save(results)


def _pct(v, ref) -> str:
    return f"{100 * v / ref:.2f}%" if v is not None and math.isfinite(v) and ref else "-"


def report(results: dict) -> str:
    rows = results["rows"]
    lines = ["# The block bound against today's bounds (issue 33, item 2)", "",
             f"Made by `bench/bench_blocks.py` (its docstring says what each column is) on {platform.machine()}, "
             "2 cores shared with other jobs; every figure is a share of the reference (the optimum on the "
             "ground-truth set; the best schedule known on the real cases). Bounds: higher is better, "
             "at most 100%.", ""]
    gt = [r for k, r in sorted(rows.items()) if r["set"] == "gt"]
    if gt:
        lines += ["## Ground-truth set (bench/results/ground_truth.md)", "",
                  "| case | objective | N | optimum (s) | proven | today, auto | today, search | pairwise | blocks (s) | blocks, MIP-priced (s) "
                  "| blocks at their best (not a bound) | blocks weighted (default / MIP) |",
                  "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in gt:
            ref = r["reference"]
            lines.append(f"| {r['case']} | {r['objective']} | {r['N']} | {ref:.6g} | {'yes' if r['proven'] else 'NO'} "
                         f"| {_pct(r['today_auto'], ref)} | {_pct(r['today_search'], ref)} | {_pct(r['pairwise'], ref)} "
                         f"| {_pct(r['blocks'], ref)} ({r['blocks_seconds']}) "
                         f"| {_pct(r['blocks_mip'], ref)} ({r['blocks_mip_seconds']}) | {_pct(r['at_best'], ref)} "
                         f"| {r['used']} / {r['used_mip']} of {r['blocks_priced']} |")
        sizes = sorted({tuple(r["sizes"]) for r in gt})
        lines += ["", f"Block sizes {', '.join(str(list(s)) for s in sizes)}; default pricing limit "
                  f"{sorted({r['limit'] for r in gt})} s in all, MIP pricing at most "
                  f"{sorted({r['exact_seconds'] for r in gt})} s a block.", ""]
    real = [r for k, r in sorted(rows.items()) if r["set"] == "real"]
    if real:
        lines += ["## Real cases with arrival times (bench/cases_real)", "",
                  "| case | objective | N | best known (s) | its source | today's analytic | pairwise | blocks | seconds "
                  "| blocks priced / weighted |", "|---|---|---:|---:|---|---:|---:|---:|---:|---|"]
        for r in real:
            ref = r["reference"]
            lines.append(f"| {r['case']} | {r['objective']} | {r['N']} | {ref:.6g} | {r['reference_source']} "
                         f"| {_pct(r['today'], ref)} | {_pct(r['pairwise'], ref)} | {_pct(r['blocks'], ref)} "
                         f"| {r['blocks_seconds']} | {r['blocks_priced']} / {r['used']} |")
        lines += ["", f"Block sizes {sorted({tuple(r['sizes']) for r in real})}, default pricing, "
                  f"{sorted({r['limit'] for r in real})} s in all.", ""]
    solved = [r for k, r in sorted(rows.items()) if r["set"] == "solve"]
    if solved:
        lines += ["## In a solve (`kvbound solve CASE --objective mean_latency --json`, the search with the block bound)", "",
                  "| case | limit s | best (s) | bound (s) | gap | pairwise (s) | block row (s) | its seconds | its note "
                  "| before (real_rebound.md): best / bound / gap |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in solved:
            b = r["before"]
            before = f"{b[1]:.6g} / {b[2]:.6g} / {100 * (b[1] - b[2]) / b[1]:.2f}% ({b[0]:g} s)" if b else "-"
            lines.append(f"| {r['case']} | {r['limit']:g} | {r['best']:.6g} | {r['bound']:.6g} | {100 * r['gap']:.2f}% "
                         f"| {r['pairwise']:.6g} | {r['blocks']:.6g} | {r['blocks_seconds']} | {r['blocks_note']} | {before} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("gt", "real", "solve", "report"))
    ap.add_argument("--sizes", default=None)
    ap.add_argument("--limit", type=float, default=None)
    ap.add_argument("--exact-seconds", type=float, default=4.0)
    ap.add_argument("--cases", default="")
    args = ap.parse_args()
    if args.what == "gt":
        args.sizes, args.limit = args.sizes or "3,4", args.limit or 30.0
        run_gt(args)
    elif args.what == "real":
        args.sizes, args.limit = args.sizes or "2,3,4,6,8", args.limit or 60.0
        run_real(args)
    elif args.what == "solve":
        run_solve(args)
    else:
        OUT_MD.write_text(report(load_results()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
