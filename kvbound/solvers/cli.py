"""`kvbound solve`, `kvbound bound` and `kvbound prove`."""
from __future__ import annotations

import json
import math
import sys

from ..cli import positive
from ..errors import InputError
from ..formulation.base import Constraints
from ..objective import OBJECTIVES
from ..schedule import write_json_atomic
from ..schedulers import FAST_HEURISTICS, SCHEDULERS
from ..workload import load_case
from .api import FORMULATIONS, solve
from .backends import BACKENDS


def register(sub) -> None:
    p = sub.add_parser("solve", help="optimal schedule and certified lower bound (MILP)")
    _common(p)
    p.add_argument("--solver", default="highs", choices=BACKENDS)
    p.add_argument("--formulation", default="auto", choices=FORMULATIONS,
                   help="chain: per-class state network with one arc per token (strong, size ~ I); network: one "
                        "arc per chunk (size ~ I^2); bigm: the seed paper's model; auto (default): chain while it "
                        "is small enough, else bigm")
    p.add_argument("--warm-start", default=",".join(FAST_HEURISTICS),
                   help="heuristics whose best valid schedule seeds the solver (comma list), or none")
    p.add_argument("--no-evict", action="store_true", help="forbid evictions")
    p.add_argument("--no-chunk", action="store_true", help="forbid chunked prefill")
    p.add_argument("--no-hybrid", action="store_true", help="forbid batches mixing prefill- and decode-type requests")
    p.add_argument("--max-batch-size", type=positive(int), help="at most this many requests per batch")
    p.add_argument("--horizon", type=positive(int), help="batch horizon J (default: derived so that the bound is certified)")
    p.add_argument("--export", help="also write the model as MPS or LP (by suffix) for other solvers")
    p.add_argument("--out", help="write the best schedule JSON here")
    p.add_argument("--verbose", action="store_true", help="show the solver log")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("bound", help="lower bounds on the optimal latency, cheapest first")
    _common(p)
    p.add_argument("--solver", default="highs", choices=BACKENDS, help="backend for the MILP dual bound")
    p.add_argument("--formulation", default="auto", choices=FORMULATIONS)
    p.set_defaults(func=cmd_bound)

    p = sub.add_parser("prove", help="prove or refute a hypothesis with a witness schedule or a bound")
    _common(p)
    p.add_argument("--solver", default="highs", choices=BACKENDS)
    p.add_argument("--formulation", default="auto", choices=FORMULATIONS)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--better-than", metavar="SCHEDULER",
                   help="hypothesis: a schedule at least --by percent better than this scheduler exists")
    g.add_argument("--compare", metavar="A",
                   help="hypothesis: constraint set A is strictly better than --vs B; sets are '+'-joined from "
                        "default, no-evict, no-chunk, no-hybrid, batch<=K")
    p.add_argument("--by", type=float, default=0.0, help="percent improvement for --better-than (default 0: strictly better)")
    p.add_argument("--vs", metavar="B", help="the other constraint set for --compare")
    p.set_defaults(func=cmd_prove)


def _common(p) -> None:
    p.add_argument("case")
    p.add_argument("--objective", default="total_latency", choices=OBJECTIVES)
    p.add_argument("--time-limit", type=positive(float), default=60.0, help="seconds (default 60)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _warm(text: str):
    if text.strip().lower() == "none":
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    for n in names:
        if n.split(":")[0] not in SCHEDULERS:
            raise InputError("--warm-start", n, "unknown scheduler; `kvbound schedulers` lists them")
    return names


def _fmt(v) -> str:
    return "n/a" if v is None else ("inf" if v == math.inf else f"{v:.6g}")


def cmd_solve(args) -> int:
    instance = load_case(args.case)
    cons = Constraints(no_evict=args.no_evict, no_chunk=args.no_chunk, no_hybrid=args.no_hybrid,
                       max_batch_size=args.max_batch_size)
    res = solve(instance, args.objective, args.solver, args.time_limit, _warm(args.warm_start), args.formulation,
                cons, args.horizon, verbose=args.verbose, export=args.export)
    if args.out and res.schedule is not None:
        write_json_atomic(args.out, res.schedule.to_json())
    if args.json:
        json.dump(res.to_json(), sys.stdout)
        print()
        return 0
    print(f"{instance.name or args.case}: {args.objective}, solver {res.solver}, formulation {res.formulation}")
    print(f"  status       {res.status}")
    print(f"  objective    {_fmt(res.objective)} s  (best schedule from {res.source or 'none'}, exact by the validator)")
    print(f"  lower bound  {_fmt(res.lower_bound)} s  ({'certified' if res.bound_certified else 'conditional on the horizon'})")
    print(f"  gap          {'n/a' if res.gap is None else f'{100 * res.gap:.3f}%'}")
    print(f"  horizon      J = {res.stats['horizon']}: {res.stats['horizon_reason']}")
    if res.stats.get("constraints"):
        print(f"  constraints  {'; '.join(res.stats['constraints'])}")
    if res.stats.get("skipped"):
        print(f"  solver       not run: {res.stats['skipped']}; the bound is analytic")
    print(f"  warm start   {res.stats['warm_start'] or 'none'} (accepted by the solver: {res.stats['warm_start_accepted']})")
    print(f"  time         {res.seconds:.2f} s (model build {res.stats['build_seconds']:.2f} s)")
    if args.export:
        print(f"  model written to {args.export}")
    if args.out and res.schedule is not None:
        print(f"  schedule written to {args.out}")
    return 0


def cmd_bound(args) -> int:
    from ..formulation.bounds import analytic_bounds
    from .relaxation import lp_bound

    instance = load_case(args.case)
    bounds = list(analytic_bounds(instance, args.objective))
    res = None
    # the LP and MILP need an upper bound for a certified horizon: the MILP run provides it
    res = solve(instance, args.objective, args.solver, args.time_limit, formulation=args.formulation)
    if res.objective is not None:
        bounds.append(lp_bound(instance, args.objective, res.objective, args.time_limit))
    milp = res.stats.get("solver_bound")
    from ..formulation.bounds import Bound

    bounds.append(Bound(f"MILP dual bound ({args.solver}, {res.formulation}, {args.time_limit:g} s)",
                        milp if isinstance(milp, (int, float)) else -math.inf, res.stats["backend_seconds"],
                        res.bound_certified, f"horizon J = {res.stats['horizon']}"))
    certified = [b.value for b in bounds if b.certified and math.isfinite(b.value)]
    best = max(certified) if certified else None
    if args.json:
        print(json.dumps({"objective_name": args.objective, "bounds": [b.to_json() for b in bounds], "best": best,
                          "best_known": res.objective}))
        return 0
    print(f"{instance.name or args.case}: lower bounds on {args.objective}")
    width = max(len(b.name) for b in bounds)
    for b in bounds:
        tag = "" if b.certified else "  (conditional)"
        print(f"  {b.name:<{width}}  {_fmt(b.value)} s  [{b.seconds:.2f} s]{tag}")
    print(f"  best certified bound: {_fmt(best)} s; best known schedule: {_fmt(res.objective)} s")
    return 0


_SETS = {"default", "no-evict", "no-chunk", "no-hybrid"}


def parse_constraint_set(text: str) -> Constraints:
    flags = {}
    for part in text.split("+"):
        part = part.strip()
        if part == "default":
            continue
        if part.startswith("batch<="):
            try:
                flags["max_batch_size"] = int(part[7:])
            except ValueError:
                raise InputError("--compare/--vs", part, "batch<=K needs an integer K") from None
        elif part in _SETS:
            flags[part.replace("-", "_")] = True
        else:
            raise InputError("--compare/--vs", part, "unknown constraint; use default, no-evict, no-chunk, no-hybrid, batch<=K")
    return Constraints(**flags)


def cmd_prove(args) -> int:
    from .prove import compare_sets, better_than

    instance = load_case(args.case)
    if args.better_than:
        out = better_than(instance, args.better_than, args.by, args.objective, args.solver, args.time_limit,
                          args.formulation)
    else:
        if not args.vs:
            raise InputError("--vs", "", "--compare needs --vs B")
        out = compare_sets(instance, args.compare, parse_constraint_set(args.compare), args.vs,
                           parse_constraint_set(args.vs), args.objective, args.solver, args.time_limit, args.formulation)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"hypothesis: {out['hypothesis']}")
    print(f"verdict:    {out['verdict'].upper()}")
    print(f"because:    {out['reason']}")
    for key, val in out["evidence"].items():
        if isinstance(val, dict):
            val = ", ".join(f"{k} {_fmt(v) if isinstance(v, float) else v}" for k, v in val.items() if k != "schedule")
        print(f"  {key}: {val}")
    return 0
