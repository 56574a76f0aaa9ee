"""Realistic benchmark (issue 14, item 5): best heuristic, best schedule, certified bound and gap per real-trace case.

    python bench/real_cases.py                      # build the cases first (bench/cases_real/, git-ignored)
    python bench/bench_real.py [--time-limit S] [--sizes 30,100] [--traces splitwise_conv,arxiv]
                               [--objectives total_latency,mean_latency] [--regimes tight,loose] [--arrivals t0,arr]

Per case and objective one point, run in a fresh child process (so that its peak memory,
`ru_maxrss` of itself and of its CP-SAT children, is its own):

1. the fast heuristics (`kvbound.schedulers.FAST_HEURISTICS`, through
   `kvbound.solvers.phases.heuristics.heuristic_candidates`), timed on their own: the best one's name and value;
2. `kvbound.solvers.solve_with(instance, SolveOptions(objective, time_limit=...))`, exactly
   what `kvbound solve` runs (it runs the heuristics again inside its own time limit): the best
   schedule (value and source), the certified lower bound, the gap (best - bound) / best,
   the status, the formulation or why none was built, seconds used against the limit;
3. the analytic bounds (`kvbound bound`'s first rows) with the binding one named.

The default time limit is the issue's: 120 s for N <= 100, 300 s for N = 300, 600 s for
N = 1000; `--time-limit` replaces it for every point. Rows are appended to
bench/results/runs/real.csv (or `--out`) as each point finishes (`kvbound.analysis.sweep.ResultsTable`:
an interrupted run loses nothing and a re-run skips the finished points; the time limit is part of a
point's key), and the .md beside it is rewritten from the CSV.

Every run is a log in bench/results/runs/. The README's table is bench/results/real_rebound.md, made
by `python bench/real_rebound.py` from the runs listed in bench/results/runs/real_runs.txt: to make a
new run count there, write it with `--out bench/results/runs/NAME.csv`, append NAME.csv to that list
and run bench/real_rebound.py again.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from kvbound.analysis.sweep import ResultsTable
from kvbound.fileio import write_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RUNS = RESULTS / "runs"  # every run's CSV and .md (the run logs)
CASES = ROOT / "bench" / "cases_real"
TRACES = ("splitwise_conv", "splitwise_code", "arxiv")
SIZES = (30, 100, 300, 1000)
OBJECTIVES = ("total_latency", "mean_latency")
COLUMNS = ("case", "trace", "requests", "m_regime", "kv_capacity", "arrivals", "objective", "time_limit_s",
           "best_heuristic", "best_heuristic_value", "heuristics_s", "best_value", "best_source", "lower_bound",
           "certified", "gap", "status", "formulation", "model", "analytic_bound", "binding_bound", "solver_bound",
           "backend_status", "seconds", "unused_s", "peak_rss_mb", "load_before", "load_after", "machine", "error")
MACHINE = f"{os.cpu_count()}-core CPU"


def default_limit(n: int) -> float:
    return 120.0 if n <= 100 else 300.0 if n <= 300 else 600.0


def parse_name(stem: str) -> dict | None:
    """`splitwise_conv_100_tight_arr` -> trace, N, regime, arrivals (None for other files)."""
    parts = stem.rsplit("_", 3)
    if len(parts) != 4 or parts[0] not in TRACES or not parts[1].isdigit():
        return None
    return {"trace": parts[0], "requests": int(parts[1]), "m_regime": parts[2], "arrivals": parts[3]}


def _key(row) -> tuple:
    return (row["case"], row["objective"], f"{float(row['time_limit_s']):g}")


# ----------------------------------------------------------------------------- one point (child process)

def run_point(case: str, objective: str, time_limit: float) -> dict:
    from kvbound import interrupt, load_case
    from kvbound.bounds.analytic import analytic_bounds
    from kvbound.objective import Objective
    from kvbound.solvers import SolveOptions, solve_with
    from kvbound.solvers.phases.heuristics import heuristic_candidates

    path = Path(case)
    inst = load_case(path)
    obj = Objective.parse(objective)
    row = {**(parse_name(path.stem) or {"trace": "", "requests": len(inst), "m_regime": "", "arrivals": ""}),
           "case": path.stem, "requests": len(inst), "kv_capacity": inst.system.kv_capacity,
           "objective": objective, "time_limit_s": f"{time_limit:g}", "machine": MACHINE,
           "load_before": f"{os.getloadavg()[0]:.2f}"}
    t0 = time.perf_counter()
    cands = heuristic_candidates(inst, SolveOptions(obj))
    row["heuristics_s"] = f"{time.perf_counter() - t0:.2f}"
    heur = [c for c in cands if c.name != "serial"] or cands
    if heur:
        best_h = min(heur, key=lambda c: obj.of(c.metrics))
        row["best_heuristic"], row["best_heuristic_value"] = best_h.name, f"{obj.of(best_h.metrics):.9g}"
    bounds = analytic_bounds(inst, obj)
    top = max(bounds, key=lambda b: b.value)
    row["analytic_bound"], row["binding_bound"] = f"{top.value:.9g}", top.name
    res = solve_with(inst, SolveOptions(objective, time_limit=time_limit))
    stats = res.stats
    if "skipped" in stats:
        model = f"skipped: {stats['skipped']}"
    elif "search" in stats:
        model = (f"no model, Lagrangian search: {stats.get('lagrangian_passes', 0)} bound passes, "
                 f"{stats.get('patterns_simulated', 0)} admission patterns simulated")
        if stats.get("packing") and "greedy_makespan" in stats["packing"]:  # with arrivals: on a clock
            packing = stats["packing"]
            model += (f", timed packing {packing['greedy_makespan']:.6g} s (greedy) -> "
                      f"{packing['order_search_makespan']:.6g} s ({packing['order_search_moves']} moves)")
        elif stats.get("packing"):
            packing = stats["packing"]
            model += (f", packing {packing['greedy_batches']} batches (greedy)"
                      + (f" -> {packing['order_search_batches']} (search over orders)"
                         if packing.get("order_search_batches") else "")
                      + (f" -> {packing['cpsat_batches']} (CP-SAT)" if packing.get("cpsat_batches") else ""))
    elif "stopped" in stats:
        model = f"stopped: {stats['stopped']}"
    else:
        model = f"{(res.model or {}).get('variables', '?')} variables, J = {res.horizon}"
    solver_bound = res.solver_bound  # the backend's own bound (-inf: none); lost in 82cc7cf's rewrite
    binding = max((b for b in res.bounds if b.certified and math.isfinite(b.value)), key=lambda b: b.value, default=None)
    if binding is not None and binding.value >= top.value * (1 + 1e-9):  # an analytic one keeps its own name
        row["binding_bound"] = f"{binding.name} ({binding.note})" if binding.note else binding.name
    row.update({
        "best_value": "" if res.objective is None else f"{res.objective:.9g}", "best_source": res.source,
        "lower_bound": f"{res.lower_bound:.9g}", "certified": str(res.bound_certified),
        "gap": "" if res.gap is None else f"{res.gap:.6f}", "status": res.status, "formulation": res.formulation,
        "model": model, "solver_bound": f"{solver_bound:.9g}" if math.isfinite(solver_bound) else "",
        "backend_status": res.backend_status, "seconds": f"{res.seconds:.2f}",
        "unused_s": f"{max(0.0, time_limit - res.seconds):.2f}",
        "peak_rss_mb": f"{max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024:.0f}",
        "load_after": f"{os.getloadavg()[0]:.2f}",
        # HiGHS did not stop when asked (a phase without callbacks) and its thread was left running
        "error": "HiGHS thread abandoned after the deadline" if interrupt.abandoned() else "",
    })
    return row


def run_child(case: Path, objective: str, time_limit: float) -> dict:
    """The point in a fresh interpreter; a crash or overrun becomes a row that says so."""
    cmd = [sys.executable, __file__, "--point", str(case), objective, f"{time_limit:g}"]
    meta = parse_name(case.stem) or {}
    base = {**dict.fromkeys(COLUMNS, ""), **meta, "case": case.stem, "objective": objective,
            "time_limit_s": f"{time_limit:g}", "machine": MACHINE, "load_before": f"{os.getloadavg()[0]:.2f}"}
    t0 = time.perf_counter()
    try:
        # the whole point: heuristics once outside the solve (at most the limit again) + the solve
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * time_limit + 120)
    except subprocess.TimeoutExpired:
        return {**base, "status": "killed", "error": f"overran {3 * time_limit + 120:g} s",
                "seconds": f"{time.perf_counter() - t0:.2f}"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {**base, "status": "error", "error": f"exit {proc.returncode}: {tail}",
                "seconds": f"{time.perf_counter() - t0:.2f}"}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- the table

def _num(v, digits=6):
    try:
        return f"{float(v):.{digits}g}"
    except (TypeError, ValueError):
        return str(v or "")


def _f(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _order(r: dict) -> tuple:
    order = {t: k for k, t in enumerate(TRACES)}
    return (int(r["requests"] or 0), order.get(r["trace"], 9), r["m_regime"] != "tight", r["arrivals"] != "t0",
            r["objective"] != "total_latency", _f(r["time_limit_s"]) or 0)


def _kind(r: dict) -> str:
    """What the solve did instead of (or with) a model: proven (a heuristic meets the bound, nothing
    built), skipped (too large, nothing else), search (the Lagrangian search), built."""
    model = r["model"]
    if "meets the analytic bound" in model:
        return "proven"
    if model.startswith("skipped"):
        return "skipped"
    if model.startswith("no model, Lagrangian search"):
        return "search"
    return "built" if model else ""


def summary(rows: list[dict]) -> list[str]:
    """Per objective, N and time limit: points, proven, skipped models, gaps (median, max), time used, peak memory."""
    out = ["", "## Summary (from the rows above)", "",
           "| objective | N | limit s | points | optimal | proven without a model | model skipped | search (no model) "
           "| model built | median gap | max gap | solve lost a better heuristic | median share of the limit used "
           "| max peak MB |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    groups: dict = {}
    for r in rows:
        if r["status"] in ("error", "killed"):
            continue
        groups.setdefault((r["objective"], int(r["requests"]), float(r["time_limit_s"])), []).append(r)
    for (obj, n, limit), rs in sorted(groups.items()):
        gaps = sorted(_f(r["gap"]) for r in rs if _f(r["gap"]) is not None)
        used = sorted(_f(r["seconds"]) / _f(r["time_limit_s"]) for r in rs)
        lost = sum(1 for r in rs if _f(r["best_heuristic_value"]) is not None
                   and _f(r["best_value"]) > _f(r["best_heuristic_value"]) * (1 + 1e-9))
        out.append(f"| {obj} | {n} | {limit:g} | {len(rs)} | {sum(r['status'] == 'optimal' for r in rs)} | "
                   f"{sum(_kind(r) == 'proven' for r in rs)} | "
                   f"{sum(_kind(r) == 'skipped' for r in rs)} | {sum(_kind(r) == 'search' for r in rs)} | "
                   f"{sum(_kind(r) == 'built' for r in rs)} | "
                   f"{100 * gaps[len(gaps) // 2]:.2f}% | {100 * gaps[-1]:.2f}% | {lost} | "
                   f"{100 * used[len(used) // 2]:.0f}% | "
                   f"{max(int(r['peak_rss_mb'] or 0) for r in rs)} |")
    return out


def write_markdown(rows: list[dict], path: Path, header: list[str]) -> None:
    rows = sorted(rows, key=_order)
    lines = header + [
        "",
        "## Results",
        "",
        "*best heuristic*: the best of FAST_HEURISTICS run without a deadline (outside the solve); *best*: what "
        "`solve_with` reported (a † marks a solve whose heuristics, cut at half the time limit, missed the better "
        "heuristic schedule); *bound*: the certified lower bound and *binding bound* which bound it is; "
        "*gap* = (best - bound) / best; *used / limit*: seconds of the solve against its limit; *heur s*: the "
        "heuristics without a deadline; *peak MB*: the larger maxrss of the child process and of its own children (CP-SAT's); *load*: 1-minute load average "
        "before and after the point.",
        "",
        "| trace | N | M | arr | objective | best heuristic | best (s) | source | bound (s) | binding bound | gap "
        "| status | model | used / limit s | heur s | peak MB | load |",
        "|---|---:|---|---|---|---|---:|---|---:|---|---:|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        gap = f"{100 * float(r['gap']):.2f}%" if r["gap"] not in ("", None) else ""
        heur = f"{r['best_heuristic']} {_num(r['best_heuristic_value'])}" if r["best_heuristic"] else ""
        lost = (_f(r["best_heuristic_value"]) is not None and _f(r["best_value"]) is not None
                and _f(r["best_value"]) > _f(r["best_heuristic_value"]) * (1 + 1e-9))
        model = r["model"] or r["error"]
        if _kind(r) == "proven":
            model = "none needed: a heuristic meets the bound"
        elif model.startswith("skipped"):
            size = model.split("~", 1)[-1].split(" ", 1)[0]
            model = f"skipped: model too large (~{size} vars)"
        if r["error"] and r["model"]:
            model += f"; {r['error']}"
        binding = r["binding_bound"]
        if _kind(r) == "search" and (_f(r["lower_bound"]) or 0) > (_f(r["analytic_bound"]) or 0) * (1 + 1e-9):
            binding = "Lagrangian"  # rows written before the column named it
        lines.append(f"| {r['trace']} | {r['requests']} | {r['m_regime']} {r['kv_capacity']} | {r['arrivals']} | "
                     f"{r['objective']} | {heur} | {_num(r['best_value'])}{' †' if lost else ''} | {r['best_source']} | "
                     f"{_num(r['lower_bound'])} | {binding} | {gap} | {r['status']} | {model} | "
                     f"{r['seconds']} / {r['time_limit_s']} | {r['heuristics_s']} | {r['peak_rss_mb']} | "
                     f"{r['load_before']}-{r['load_after']} |")
    lines += summary(rows)
    write_atomic(path, "\n".join(lines) + "\n")


def select_cases(folder: Path, traces, sizes, regimes, arrivals) -> list[Path]:
    out = []
    for p in sorted(folder.glob("*.toml")):
        meta = parse_name(p.stem)
        if meta and meta["trace"] in traces and meta["requests"] in sizes and meta["m_regime"] in regimes \
                and meta["arrivals"] in arrivals:
            out.append(p)
    order = {t: k for k, t in enumerate(TRACES)}
    return sorted(out, key=lambda p: (parse_name(p.stem)["requests"], order[parse_name(p.stem)["trace"]], p.stem))


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 5 and sys.argv[1] == "--point":
        print(json.dumps(run_point(sys.argv[2], sys.argv[3], float(sys.argv[4]))), flush=True)
        # an abandoned HiGHS thread would abort a normal interpreter exit (std::terminate, exit -6,
        # "terminate called without an active exception"): leave at once, as the CLI does
        os._exit(0)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds per solve for every point (default: 120 for N <= 100, 300 for 300, 600 for 1000)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--objectives", default=",".join(OBJECTIVES))
    ap.add_argument("--regimes", default="tight,loose")
    ap.add_argument("--arrivals", default="t0,arr")
    ap.add_argument("--cases", default=str(CASES), help="folder built by bench/real_cases.py")
    ap.add_argument("--out", default=str(RUNS / "real.csv"))
    ap.add_argument("--header", default=None,
                    help="a file whose text heads the .md (default: bench/results/runs/real_header.md for the default --out)")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the .md beside --out from every row of the CSV")
    args = ap.parse_args(argv)
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    traces, objectives = split(args.traces), split(args.objectives)
    bad = [t for t in traces if t not in TRACES]
    if bad:
        ap.error(f"unknown trace {bad[0]!r}; choose from {', '.join(TRACES)}")
    sizes = [int(s) for s in split(args.sizes)]
    folder = Path(args.cases)
    if not folder.is_dir():
        ap.error(f"{folder} does not exist: run python bench/real_cases.py first")
    cases = select_cases(folder, traces, sizes, split(args.regimes), split(args.arrivals))
    points = [(c, o, args.time_limit or default_limit(parse_name(c.stem)["requests"])) for c in cases for o in objectives]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = ResultsTable(out, COLUMNS, key=_key)
    pkey = lambda p: (p[0].stem, p[1], f"{p[2]:g}")  # noqa: E731
    todo = [] if args.report_only else [p for p in points if pkey(p) not in table.done]
    print(f"{len(points)} points, {len(points) - len(todo)} already in {out}", file=sys.stderr)
    for k, p in enumerate(todo, 1):
        t0 = time.time()
        row = run_child(*p)
        table.append([row])  # on disk before the next point starts
        print(f"[{k}/{len(todo)}] {p[0].stem} {p[1]} limit {p[2]:g}: {row['status']} gap {row['gap']} "
              f"in {time.time() - t0:.1f} s (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    if args.header is None and out.resolve() == (RUNS / "real.csv").resolve():
        args.header = str(RUNS / "real_header.md")
    header = (Path(args.header).read_text(encoding="utf-8").rstrip("\n").splitlines()
              if args.header and Path(args.header).is_file() else
              ["# Realistic benchmark", "", f"`python bench/bench_real.py`; {MACHINE}. See bench/bench_real.py."])
    write_markdown(table.rows, out.with_suffix(".md"), header)
    print(f"wrote {out} and {out.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
