"""`kvbound capacity`: effective throughput of a scheduler under an SLO (kvbound.analysis.capacity)."""
from __future__ import annotations

import json
import sys

from ..io.cases import load_case
from ..analysis.capacity import MAX_TOLERANCE, MIN_TOLERANCE
from .args import number, positive, slo_type


def register(sub) -> None:
    p = sub.add_parser("capacity", help="the highest request rate at which a scheduler keeps a share of requests within an SLO",
                       description="Scales the case's arrival times by a rate factor (bisection on the factor) and "
                                   "reports the largest factor whose SLO attainment is >= --attainment, as JSON "
                                   "{scheduler, rate_factor, requests_per_second, slo_attainment, capped}; progress on "
                                   "stderr. The factors tried stay within [2^-20, 2^20]: capped is true (and stderr "
                                   "says so) when the search ends at that cap instead of measuring the capacity.")
    p.add_argument("case")
    p.add_argument("--scheduler", required=True, help="a name from `kvbound schedulers`, optionally name:key=value,...")
    p.add_argument("--slo", type=slo_type, required=True, metavar="ttft=S,tbt=S",
                   help="TTFT and per-request P99 TBT limits, seconds")
    p.add_argument("--attainment", type=positive(float), default=0.7, help="share of requests within the SLO (default 0.7)")
    p.add_argument("--tolerance", type=number(float, MIN_TOLERANCE, MAX_TOLERANCE), default=0.01,
                   help=f"relative width of the final bracket, {MIN_TOLERANCE:g} to {MAX_TOLERANCE:g} (default 0.01)")
    p.set_defaults(func=cmd_capacity)


def cmd_capacity(args) -> int:
    from ..analysis.capacity import capacity

    instance = load_case(args.case)

    def progress(factor: float, attained: float) -> None:
        print(f"rate factor {factor:.6g}: {100 * attained:.2f}% within the SLO", file=sys.stderr, flush=True)

    result = capacity(instance, args.scheduler, args.slo, args.attainment, rel_tol=args.tolerance, progress=progress)
    if result.capped:
        print(f"capped: {result.cap_note}", file=sys.stderr, flush=True)
    if result.interrupted:
        print("interrupted: the best rate factor measured by then", file=sys.stderr, flush=True)
    print(json.dumps(result.to_json()))
    return 0
