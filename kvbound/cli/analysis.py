"""`kvbound compare`, `kvbound plot`, `kvbound sweep`, `kvbound export`/`import`.

Thin wrappers over kvbound.analysis; matplotlib, tqdm and ray are imported only when a
command needs them. An invalid schedule (plot, export, import) is exit status 1, like
`kvbound validate`; bad input is exit status 2 through main().
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

from .. import interrupt, progress
from ..deadline import Deadline
from ..io.cases import load_case
from ..io.schedules import load_schedule
from ..schedule import ScheduleError
from .args import add_backend, add_objective, add_slo, add_time_limit, add_units, solve_options


def register(sub) -> None:
    p = sub.add_parser(
        "compare", help="every scheduler (and optionally the optimum) on one case: metrics and gaps",
        description="One row per scheduler: latency, TTFT and TPOT (mean and p99), batches, evictions, recomputed "
                    "tokens, peak KV, and two gaps of the row's objective value v: gap_to_bound = (v - L) / v with L "
                    "the best certified lower bound (analytic bounds; with --solve also the solver's), and "
                    "gap_to_best = (v - B) / v with B the best value of any row. A scheduler that cannot serve the "
                    "case keeps its row with empty metrics (null in --json) and says why.")
    p.add_argument("case")
    p.add_argument("--schedulers", default="all", help="all (default) or a comma list, e.g. vllm,sarathi:prefill_limit=256")
    p.add_argument("--solve", action="store_true", help="also solve for the optimum (row 'optimal') and its bound")
    add_objective(p, "the value gaps are measured on")
    add_time_limit(p, "seconds for the whole comparison (with --solve: up to half for the simulations, the rest "
                      "for the solve); a row not simulated in time says so")
    add_backend(p)
    p.add_argument("--plot", metavar="OUT.png", help="also draw a bar chart (.png, .svg or .pdf)")
    add_slo(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON object")
    fmt.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("plot", help="chart a schedule: each request over time, and the KV cache against M",
                       description="Boxes per request and batch: prefill/refill black, decode grey, evicted red, "
                                   "idle holding KV pale blue; below, the KV in use and M. Many batches merge into "
                                   "bars; beyond 250 requests the chart counts requests per state instead.")
    p.add_argument("schedule", help="schedule JSON (kvbound simulate/solve --out)")
    p.add_argument("--case", required=True)
    p.add_argument("--out", required=True, help="image file: .png, .svg or .pdf")
    p.add_argument("--title")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("sweep", help="run a grid of cases x schedulers x objectives (resumable), then plot",
                       description="SPEC.toml is documented in docs/sweeps.md. Results go to DIR/results.csv as "
                                   "each point finishes; a re-run skips finished points.")
    p.add_argument("spec")
    add_units(p, "where the points run")
    p.add_argument("--out", help="results folder (default: sweep-results/NAME)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("export", help="write a schedule in the seed paper's precomputed form (docs/interop.md)")
    p.add_argument("schedule", help="schedule JSON")
    p.add_argument("--case", required=True)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="read a schedule in the seed paper's precomputed form, validate it")
    p.add_argument("precomputed", help="JSON in the precomputed form")
    p.add_argument("--case", required=True)
    p.add_argument("--out", required=True, help="kvbound schedule JSON to write")
    p.set_defaults(func=cmd_import)


def invalid_schedule_exits_1(schedule_arg: str):
    """A command whose schedule (the argument `schedule_arg`) breaks the semantics says so and exits 1."""
    def wrap(command):
        @functools.wraps(command)
        def run(args) -> int:
            try:
                return command(args)
            except ScheduleError as exc:
                print(f"error: {getattr(args, schedule_arg)}: invalid schedule: {exc}", file=sys.stderr)
                return 1
        return run
    return wrap


def cmd_compare(args) -> int:
    from ..analysis.compare import compare
    from ..analysis.plot import check_out_path, plot_comparison

    deadline = Deadline(args.time_limit)
    options = solve_options(args)
    if args.plot:
        check_out_path(args.plot, "plot")  # before a long solve, not after
    instance = load_case(args.case)
    with progress.line(not args.json):  # the whole command keeps to --time-limit (kvbound.analysis.compare)
        table = compare(instance, args.schedulers, solve=args.solve, options=options, deadline=deadline, slo=args.slo)
    with interrupt.deferred():  # an interrupt now changes nothing: the rows finished are printed (main: exit 130)
        if args.json:
            print(json.dumps(table.to_json()), flush=True)
        elif args.markdown:
            print(table.to_markdown(), flush=True)
        else:
            print(f"{instance.name or args.case}, {len(instance)} requests")
            print(table.to_text(), flush=True)
        if args.plot:
            plot_comparison(table, args.plot, title=f"{instance.name or args.case}: {options.objective.replace('_', ' ')}")
            if not args.json and not args.markdown:
                print(f"chart written to {args.plot}")
    return 0


@invalid_schedule_exits_1("schedule")
def cmd_plot(args) -> int:
    from ..analysis.plot import check_out_path, plot_schedule

    check_out_path(args.out)
    instance = load_case(args.case)
    plot_schedule(instance, load_schedule(args.schedule), args.out, title=args.title)
    print(f"chart written to {args.out}")
    return 0


def cmd_sweep(args) -> int:
    from ..analysis.sweep import load_spec, run_sweep
    from ..analysis.sweep.report import written_files
    from ..errors import InputError
    from ..fileio import check_out_folder, same_file

    spec = load_spec(args.spec)
    out = Path(args.out or Path("sweep-results") / spec.name)
    check_out_folder(out, "--out")
    inputs = [("sweep spec", args.spec)] + [("case file", case) for case in spec.grid.get("case", [])]
    for path in written_files(spec, out):  # the sweep's own files in --out may not be its inputs
        for what, source in inputs:
            if same_file(path, source):
                raise InputError(str(source), "--out", f"the sweep writes {path} over this {what}, an input of "
                                                       "the sweep; give another --out folder")
    result = run_sweep(spec, out, backend=args.backend, workers=args.workers, address=args.address)
    points = result.ran + result.skipped
    print(f"sweep {spec.name}: {points} points ({result.skipped} already done, {result.ran} run) "
          f"in {result.seconds:.1f} s, backend {args.backend}")
    if result.interrupted:
        print(f"interrupted: {len(spec.points()) - points} points not run; the summary holds the finished ones, "
              "and a re-run does the rest")
    print(f"results: {out / 'results.csv'}; summary: {out / 'summary.md'}")
    for v in result.verdicts:
        print(f"claim {v.verdict}: {v.claim.text} ({sum(p.holds for p in v.points)} of {len(v.points)} points)")
    for path in result.plots:
        print(f"plot: {path}")
    return 0


@invalid_schedule_exits_1("schedule")
def cmd_export(args) -> int:
    from ..analysis.interop import export_precomputed

    data = export_precomputed(load_case(args.case), args.schedule, args.out)
    print(f"wrote {args.out}: {len(data['batches'])} batches, {len(data['requests'])} requests (precomputed form)")
    return 0


@invalid_schedule_exits_1("precomputed")
def cmd_import(args) -> int:
    from ..analysis.interop import import_precomputed

    instance = load_case(args.case)
    schedule = import_precomputed(instance, args.precomputed, args.out)
    print(f"wrote {args.out}: {len(schedule.batches)} batches, valid on {instance.name or args.case}")
    return 0
