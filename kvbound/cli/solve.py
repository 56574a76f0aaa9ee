"""`kvbound solve`, `kvbound bound` and `kvbound prove`."""
from __future__ import annotations

import json
import math
import sys

from .. import interrupt, progress
from ..deadline import Deadline
from ..errors import InputError
from ..fileio import write_user_json
from ..constraints import Constraints
from ..schedulers import FAST_HEURISTICS, SCHEDULERS
from ..solvers.driver import lower_bounds, solve_with
from ..io.cases import load_case
from .args import add_backend, add_objective, add_time_limit, add_units, percent, positive, solve_options


def register(sub) -> None:
    p = sub.add_parser("solve", help="optimal schedule and certified lower bound (MILP)")
    _common(p)
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
    _common(p, solver_help="backend for the MILP dual bound")
    p.set_defaults(func=cmd_bound)

    p = sub.add_parser("prove", help="prove or refute a hypothesis with a witness schedule or a bound")
    _common(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--better-than", metavar="SCHEDULER",
                   help="hypothesis: a schedule at least --by percent better than this scheduler exists")
    g.add_argument("--compare", metavar="A",
                   help="hypothesis: constraint set A is strictly better than --vs B; sets are '+'-joined from "
                        "default, no-evict, no-chunk, no-hybrid, batch<=K")
    p.add_argument("--by", type=percent, default=0.0,
                   help="percent improvement for --better-than, 0 <= X < 100 (default 0: strictly better)")
    p.add_argument("--vs", metavar="B", help="the other constraint set for --compare")
    p.set_defaults(func=cmd_prove)


def _common(p, solver_help: str | None = None) -> None:
    p.add_argument("case")
    add_objective(p)
    add_time_limit(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_backend(p, solver_help)
    add_units(p, "where independent units run (a bound's blocks, the busy periods' windows)")


def _warm(text: str):
    if text.strip().lower() == "none":
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    for n in names:
        if n.split(":")[0] not in SCHEDULERS:
            raise InputError("--warm-start", n, "unknown scheduler; `kvbound schedulers` lists them")
    return names


def _fmt(v, unit: str = " s") -> str:
    """A value with its unit (seconds unless told); n/a without one."""
    return "n/a" if v is None else ("inf" if v == math.inf else f"{v:.6g}") + unit


def cmd_solve(args) -> int:
    constraints = Constraints(no_evict=args.no_evict, no_chunk=args.no_chunk, no_hybrid=args.no_hybrid,
                              max_batch_size=args.max_batch_size)
    options = solve_options(args, warm_start=_warm(args.warm_start), horizon=args.horizon, constraints=constraints,
                            verbose=args.verbose, export=args.export)
    deadline = Deadline(options.time_limit)  # from here: reading the case counts too
    instance = load_case(args.case)
    with progress.line(not args.json):
        res = solve_with(instance, options, deadline)
    with interrupt.deferred():  # an interrupt now changes nothing: the result is written and printed
        return _report_solve(args, instance, options, res)


def _report_solve(args, instance, options, res) -> int:
    failed = None
    if args.out and res.schedule is not None:
        try:
            write_user_json(args.out, res.schedule.json_form())
        except InputError as exc:  # checked before solving; still, the result is printed before the error
            failed = exc
    if args.json:
        sys.stdout.write(json.dumps(res.to_json()) + "\n")  # one write: json.dump writes piece by piece
        return _failed_write(failed) or _failed_export(args, res)
    print(f"{instance.name or args.case}: {options.objective}, solver {res.solver}, formulation {res.formulation}")
    print(f"  status       {res.status}" + (f" ({res.message.removeprefix('infeasible: ')})" if res.status == "infeasible" else ""))
    print(f"  objective    {_fmt(res.objective)}  (best schedule from {res.source or 'none'}, exact by the validator)")
    print(f"  lower bound  {_fmt(res.lower_bound)}  ({'certified' if res.bound_certified else 'conditional on the horizon'})")
    print(f"  gap          {'n/a' if res.gap is None else f'{100 * res.gap:.3f}%'}")
    print(f"  horizon      J = {res.horizon}: {res.horizon_reason}")
    if res.constraints:
        print(f"  constraints  {'; '.join(res.constraints)}")
    if res.skipped:
        print(f"  solver       not run: {res.skipped}")  # the reason names the bound that proved it
    print(f"  warm start   {res.warm_start or 'none'} (accepted by the solver: {res.warm_start_accepted})")
    race = res.stats.get("race")
    if race:
        others = [f"{name} {each['status']}" + (f" at {each['seconds']:.2f} s" if "seconds" in each else "")
                  for name, each in race.items() if isinstance(each, dict)]
        print(f"  race         {race['winner']} won ({'; '.join(others)})")
    print(f"  time         {res.seconds:.2f} s (model build {res.build_seconds:.2f} s)")
    if res.exported:
        print(f"  model written to {res.exported}")
    if args.out and res.schedule is not None and failed is None:
        print(f"  schedule written to {args.out}")
    return _failed_write(failed) or _failed_export(args, res)


def _failed_export(args, res) -> int:
    """After the result is printed: a model asked for and not written is one error line, exit 1."""
    if not res.export_problem:
        return 0
    sys.stdout.flush()
    print(f"error: {args.export}: export: not written: {res.export_problem}", file=sys.stderr)
    return 1


def _failed_write(failed: InputError | None) -> int:
    """After the result is printed: a write that failed anyway is one error line, exit 2."""
    if failed is None:
        return 0
    sys.stdout.flush()
    print(f"error: {failed}", file=sys.stderr)
    return 2


def cmd_bound(args) -> int:
    options = solve_options(args)
    deadline = Deadline(options.time_limit)
    objective = options.objective
    instance = load_case(args.case)
    with progress.line(not args.json):
        bounds, res = lower_bounds(instance, options, deadline)
    with interrupt.deferred():  # an interrupt now changes nothing: what was computed is printed (main: exit 130)
        return _report_bounds(args, instance, objective, bounds, res)


def _report_bounds(args, instance, objective, bounds, res) -> int:
    """`bound`'s output; `status` is the solve's (as in `solve --json`), "interrupted" after Ctrl-C or SIGTERM."""
    certified = [b.value for b in bounds if b.certified and math.isfinite(b.value)]
    best = max(certified) if certified else None
    if args.json:
        print(json.dumps({"objective_name": objective, "bounds": [b.to_json() for b in bounds], "best": best,
                          "best_known": res.objective, "status": res.status}))
        return 0
    print(f"{instance.name or args.case}: lower bounds on {objective}")
    width = max((len(b.name) for b in bounds), default=0)
    for b in bounds:
        if not math.isfinite(b.value):  # none computed: say why instead of printing -inf
            print(f"  {b.name:<{width}}  none  [{b.seconds:.2f} s]  ({b.note})")
            continue
        tag = "" if b.certified else f"  (conditional: {b.conditions or 'not certified'})"
        note = f"  ({b.note})" if b.note else ""
        print(f"  {b.name:<{width}}  {_fmt(b.value)}  [{b.seconds:.2f} s]{tag}{note}")
    print(f"  best certified bound: {_fmt(best)}; best known schedule: {_fmt(res.objective)}")
    if res.status == "interrupted":
        print("  interrupted: the bounds above are those computed before it")
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
            if flags["max_batch_size"] < 1:
                raise InputError("--compare/--vs", part, "batch<=K needs K >= 1 (a batch holds at least one request)")
        elif part in _SETS:
            flags[part.replace("-", "_")] = True
        else:
            raise InputError("--compare/--vs", part, "unknown constraint; use default, no-evict, no-chunk, no-hybrid, batch<=K")
    return Constraints(**flags)


def cmd_prove(args) -> int:
    from ..solvers.prove import better_than, compare_sets

    options = solve_options(args)
    deadline = Deadline(options.time_limit)
    instance = load_case(args.case)
    if args.compare and not args.vs:
        raise InputError("--vs", "", "--compare needs --vs B")
    sets = None if args.better_than else (parse_constraint_set(args.compare), parse_constraint_set(args.vs))
    with progress.line(not args.json):
        if args.better_than:
            out = better_than(instance, args.better_than, args.by, options, deadline)
        else:
            out = compare_sets(instance, args.compare, sets[0], args.vs, sets[1], options, deadline)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"hypothesis: {out['hypothesis']}")
    print(f"verdict:    {out['verdict'].upper()}")
    print(f"because:    {out['reason']}")
    for key, val in out["evidence"].items():
        if isinstance(val, dict):
            val = ", ".join(f"{k} {_fmt(v, '') if isinstance(v, float) else v}" for k, v in val.items() if k != "schedule")
        print(f"  {key}: {val}")
    if out.get("status") == "interrupted":
        print("interrupted: the verdict stands on what was known then")
    return 0
