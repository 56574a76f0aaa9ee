"""`kvbound headroom`: latency-load curves of schedulers against the best schedule found and the certified
lower bound, at several rate factors (kvbound.analysis.headroom)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .. import interrupt
from ..fileio import write_user_json
from ..io.cases import load_case
from .args import add_backend, add_slo, add_time_limit, add_units, number


def register(sub) -> None:
    from ..analysis.headroom import DEFAULT_SCHEDULERS, DEFAULT_WITHIN, HEADROOM_OBJECTIVES

    p = sub.add_parser(
        "headroom", help="latency against request rate: schedulers, the best schedule found and the certified bound",
        description="For each rate factor f (every arrival time divided by f, as `kvbound capacity` does): every "
                    "chosen scheduler's mean latency, mean/p50/p95/p99 TTFT, mean TBT (and SLO attainment with "
                    "--slo), the best schedule kvbound finds for the objective (a solve warm-started from the "
                    "schedulers; every schedule replayed by the validator) and the certified lower bound of the "
                    "objective; then each scheduler's capacity. --time-limit is shared by the whole command: "
                    "up to 20%% for the capacity searches, the rest split over the rate points. The capacity "
                    "searches, then the rate points, run on every core (--workers 1: in this process) or on Ray "
                    "(--backend ray), a point getting as many shares of the time as points run at once. docs/analysis.md says what each number is.")
    p.add_argument("case")
    p.add_argument("--rates", required=True, metavar="F,F,...",
                   help="rate factors, comma separated, e.g. 0.25,0.5,1,2,4 (each in [2^-20, 2^20])")
    p.add_argument("--schedulers", default=",".join(DEFAULT_SCHEDULERS),
                   help=f"a comma list of scheduler specs (default {','.join(DEFAULT_SCHEDULERS)})")
    p.add_argument("--objective", default="mean_latency", choices=HEADROOM_OBJECTIVES,
                   help="the value bounded and searched (default mean_latency)")
    add_slo(p)
    p.add_argument("--attainment", type=number(float, 0, 1, low_open=True), default=0.7,
                   help="with --slo: a scheduler's capacity is the largest rate factor with this share of requests "
                        "within the SLO (default 0.7)")
    p.add_argument("--within", type=number(float, 1, 1e6), default=DEFAULT_WITHIN,
                   help="without --slo: a scheduler's capacity is the largest rate factor whose objective stays "
                        f"within this multiple of the unloaded value, each request alone (default {DEFAULT_WITHIN:g})")
    add_time_limit(p, "seconds for the whole command, shared by the capacity searches and the rate points")
    add_backend(p)
    add_units(p, "where the capacity searches and the rate points run")
    p.add_argument("--out", metavar="DIR",
                   help="a folder that keeps each unit as it finishes (DIR/units.csv) and the result (DIR/headroom.json): "
                        "run again with the same folder, after Ctrl-C or with more rate factors or schedulers, and "
                        "the units already there for the same case and settings are taken from it, the time limit "
                        "shared by the rest (a unit cut short by the time limit is not kept)")
    p.add_argument("--plot", metavar="OUT.png", help="also draw the curves (.png, .svg or .pdf)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON object")
    fmt.add_argument("--markdown", action="store_true", help="print a markdown table")
    p.set_defaults(func=cmd_headroom)


def cmd_headroom(args) -> int:
    from tqdm import tqdm

    from ..analysis.headroom import headroom, parse_rates
    from ..analysis.plot import check_out_path, plot_headroom
    from .args import solve_options

    rates = parse_rates(args.rates, "--rates", "")
    if args.plot:
        check_out_path(args.plot, "plot")  # before the work, not after
    instance = load_case(args.case)
    units = len(rates) + len([s for s in args.schedulers.split(",") if s.strip()])
    # a bar on a terminal only, and none with --json
    with tqdm(total=units, desc="headroom", unit="unit", disable=True if args.json else None,
              file=sys.stderr) as bar:
        def progress(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update()

        result = headroom(instance, rates, args.schedulers, objective=args.objective, slo=args.slo,
                          attainment=args.attainment, within=args.within, time_limit=args.time_limit,
                          options=solve_options(args), workers=args.workers, backend=args.backend,
                          address=args.address, progress=progress, out=args.out)
    with interrupt.deferred():  # what is finished is printed, whatever comes now (main: exit 130)
        if args.out:
            write_user_json(Path(args.out) / "headroom.json", result.to_json())
        if args.json:
            print(json.dumps(result.to_json()), flush=True)
        else:
            recorded = f"; {result.recorded} units taken from {args.out}" if result.recorded else ""
            print(f"{instance.name or args.case}, {len(instance)} requests, {result.base_rate:.4g} requests/s "
                  f"at rate factor 1; {result.seconds:.1f} s{recorded}")
            print(result.to_markdown(), flush=True)
        if args.plot:
            plot_headroom(result, args.plot, title=f"{instance.name or args.case}: "
                                                   f"{args.objective.replace('_', ' ').replace('ttft', 'TTFT')} under load")
            if not args.json:
                print(f"chart written to {args.plot}")
    return 0
