"""How fast `solve` proves small cases: seeded hypothesis draws of 2-3 requests (the oracle's
tiny instances), every objective, against the brute-force oracle; plus the named regression cases.

    python bench/bench_small_proofs.py [--draws 40] [--time-limit 10] [--solver highs] [--out bench/results/small_proofs.md]

Each row: the instance, the objective, the oracle's optimum, the status `solve` ends with, its
seconds and which backend proved it. The table is cited in bench/results/NOTES.md (issue 37).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _oracle():
    """tests/oracle.py, loaded by file as the ground-truth script loads it (this directory is the
    script's, so its sibling imports as is)."""
    from ground_truth import load_module

    return load_module("kvbound_tests_oracle", ROOT / "tests" / "oracle.py")


#: draws made per draw kept: hypothesis's consecutive examples are near copies of each other, so the
#: kept ones are spread over SPREAD times as many
SPREAD = 10


def draws(oracle, count: int, seed: int) -> list:
    """`count` instances of the oracle's strategy, the same ones on every run (derandomised)."""
    from hypothesis import HealthCheck, given, seed as hseed, settings

    out = []

    @hseed(seed)
    @settings(max_examples=count * SPREAD, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck), phases=["generate"])
    @given(oracle.tiny_instances())
    def collect(instance):
        out.append(instance)

    collect()
    seen, unique = set(), []
    for inst in out:
        key = repr(inst)
        if key not in seen:
            seen.add(key)
            unique.append(inst)
    return unique[::max(1, len(unique) // count)][:count]


def describe(inst) -> str:
    s = inst.system
    reqs = " ".join(f"{r.prompt}/{r.output}" + (f"@{r.arrival:g}" if r.arrival else "") for r in inst.requests)
    return f"{inst.name.split('/')[-1]}: {reqs}; M={s.kv_capacity} C={s.max_batch_tokens} P={s.max_prefill_tokens} b={s.block_size}"


def agrees(status: str, best: float | None, bound: float, exact: float) -> bool:
    """The solve is consistent with the oracle: no schedule below the optimum, no bound above it, and
    a proven optimum equal to it."""
    tol = 1e-9 * max(1.0, abs(exact))
    if bound > exact + tol or (best is not None and best < exact - tol):
        return False
    return status != "optimal" or abs(best - exact) <= tol


def report(rows: list[dict], args, argv: list[str]) -> None:
    """The summary line (printed), and with --out the markdown table and the JSON rows."""
    proven = [r for r in rows if r["status"] == "optimal"]
    times = sorted(r["seconds"] for r in rows)
    summary = (f"{len(proven)}/{len(rows)} proven optimal; seconds median {statistics.median(times):.2f}, "
               f"max {max(times):.2f}; {sum(r['seconds'] > 10 for r in rows)} over 10 s; "
               f"{sum(not r['agrees'] for r in rows)} disagree with the oracle")
    print(summary)
    if not args.out:
        return
    out = Path(args.out)
    lines = [f"# Small cases: proofs ({args.solver}, {args.time_limit:g} s limit, {args.draws} seeded draws, seed {args.seed})",
             "", f"`python bench/bench_small_proofs.py {' '.join(argv)}`", "",
             summary, "", "| case | objective | optimum (oracle) | status | seconds | proved by |", "|---|---|---:|---|---:|---|"]
    for r in rows:
        opt = "-" if r["optimum"] is None else f"{r['optimum']:.6g}"
        lines.append(f"| {r['case']} | {r['objective']} | {opt} | {r['status']} | {r['seconds']:.2f} | {r['proved_by']} |")
    out.write_text("\n".join(lines) + "\n")
    rows_file = out.parent / "runs" / out.with_suffix(".json").name  # the rows: run data, in the runs folder
    rows_file.parent.mkdir(exist_ok=True)
    rows_file.write_text(json.dumps(rows, indent=1) + "\n")


def _prover(res) -> str:
    """What proved (or last worked on) the answer: the exhaustive search's bound, the analytic bounds
    where no model was needed, or the backend (a race's winner)."""
    from kvbound.bounds.base import meets
    from kvbound.solvers.phases.exhaust import NAME

    if res.objective is not None and any(b.name == NAME and b.certified and meets(res.objective, b.value)
                                         for b in res.bounds):
        return "exhaustive search"
    return "analytic bound" if res.skipped and res.status == "optimal" else res.solver


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--solver", default="highs")
    parser.add_argument("--cases", nargs="*", default=[], help="case files solved too (no oracle: too large)")
    parser.add_argument("--out", default=None, help="markdown table here (and its rows as .json in the runs/ folder beside it)")
    args = parser.parse_args(argv)

    from kvbound.io import load_case
    from kvbound.solvers.driver import solve

    oracle = _oracle()
    rows = []
    todo = [(inst, obj) for inst in draws(oracle, args.draws, args.seed) for obj in oracle.OBJECTIVES]
    todo += [(load_case(path), obj) for path in args.cases for obj in oracle.OBJECTIVES]
    for n, (inst, obj) in enumerate(todo):
        exact = oracle.brute_force(inst, obj).value if inst.name.startswith("tiny") else None
        t0 = time.perf_counter()
        res = solve(inst, obj, backend=args.solver, time_limit=args.time_limit)
        secs = time.perf_counter() - t0
        ok = exact is None or agrees(res.status, res.objective, res.lower_bound, exact)
        row = dict(case=describe(inst), objective=obj, optimum=exact, status=res.status, best=res.objective,
                   bound=res.lower_bound, seconds=round(secs, 3), proved_by=_prover(res),
                   agrees=ok)
        rows.append(row)
        print(f"[{n + 1}/{len(todo)}] {row['status']:>9} {secs:6.2f} s {obj:13} {row['case']}", flush=True)
    report(rows, args, argv if argv is not None else sys.argv[1:])
    return 0 if all(r["agrees"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
