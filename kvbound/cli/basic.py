"""`kvbound simulate`, `validate`, `schedulers` and `generate`."""
from __future__ import annotations

import json
import sys

from ..fileio import write_user_file, write_user_json
from ..generate import MAX_RATE, MIN_RATE
from ..workload import MAX_REQUESTS
from ..io.schedules import load_schedule
from ..schedule import Metrics, ScheduleError, validate
from ..schedulers import SCHEDULERS, run_scheduler
from ..io.cases import load_case
from .args import add_slo


def register(sub) -> None:
    p = sub.add_parser("simulate", help="run one heuristic scheduler on a case and print its metrics")
    p.add_argument("case")
    p.add_argument("--scheduler", required=True, help="a name from `kvbound schedulers`, optionally name:key=value,...")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", help="write the schedule JSON here")
    add_slo(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("validate", help="replay a schedule under the semantics; exit 1 if it breaks a rule")
    p.add_argument("case")
    p.add_argument("schedule")
    p.add_argument("--json", action="store_true")
    add_slo(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("schedulers", help="list the schedulers")
    p.set_defaults(func=cmd_schedulers)

    p = sub.add_parser("generate", help="write a seeded synthetic case file with trace-like lengths")
    p.add_argument("--requests", type=int, required=True, help=f"number of requests (at most {MAX_REQUESTS:,})")
    p.add_argument("--seed", type=int, required=True, help="0 to 2^32 - 1")
    p.add_argument("--rate", type=float, help=f"Poisson arrivals, requests per second, {MIN_RATE:g} to {MAX_RATE:g} "
                                              "(default: offline)")
    p.add_argument("--kv-capacity", type=int, default=100_000, help="M, tokens (default 100000)")
    p.add_argument("--max-batch-tokens", type=int, default=4096, help="C (default 4096)")
    p.add_argument("--preset", default="llama2-7b-a100", help="cost preset (default llama2-7b-a100)")
    p.add_argument("--context", type=int, default=4096, help="prompt + output <= this (default 4096, Llama-2)")
    p.add_argument("--name", help="the case's name (default synthetic-N-seedS)")
    p.add_argument("--out", required=True, help="case file to write (atomically)")
    p.set_defaults(func=cmd_generate)


def print_metrics(title: str, metrics: Metrics) -> None:
    d = metrics.to_dict()
    print(title)
    rows = [
        ("total latency", f"{d['total_latency']:.6g} s"),
        ("mean latency", f"{d['mean_latency']:.6g} s  (p50 {d['p50_latency']:.6g}, p99 {d['p99_latency']:.6g})"),
        ("mean TTFT", f"{d['mean_ttft']:.6g} s  (p50 {d['p50_ttft']:.6g}, p99 {d['p99_ttft']:.6g})"),
        ("mean TPOT", f"{d['mean_tpot']:.6g} s  (p50 {d['p50_tpot']:.6g}, p99 {d['p99_tpot']:.6g})"),
        ("TTFT p95", f"{d['p95_ttft']:.6g} s"),
        ("mean TBT", f"{d['mean_tbt']:.6g} s  (p99 {d['p99_tbt']:.6g}, over every gap between tokens)"),
        ("latency / O", f"p50 {d['p50_normalized_latency']:.6g} s, p95 {d['p95_normalized_latency']:.6g} s"),
        ("batches", str(d["batches"])),
        ("evictions", str(d["evictions"])),
        ("recomputed tokens", str(d["recomputed_tokens"])),
        ("peak KV", f"{d['peak_kv']} tokens"),
    ]
    if "slo_attainment" in d:
        rows.append(("SLO attainment", f"{100 * d['slo_attainment']:.4g}% of requests"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def cmd_simulate(args) -> int:
    instance = load_case(args.case)
    result = run_scheduler(instance, args.scheduler)
    replay = result.replay  # the validator's replay of the schedule, batch by batch, as it was made
    replay.apply_slo(args.slo)
    if args.out:
        write_user_json(args.out, result.schedule.json_form())
    if args.json:
        # json.dumps' text, the schedule's from `Schedule.json_text` (0.6 s sooner on the full Splitwise
        # trace), in one write as print would: Ctrl-C leaves no half of it
        head = json.dumps({"scheduler": result.policy, "metrics": replay.metrics.to_dict()})
        sys.stdout.write(f'{head[:-1]}, "schedule": {result.schedule.json_text()}}}\n')
    else:
        name = instance.name or args.case
        print_metrics(f"{name}: scheduler {result.policy}, {len(instance)} requests", replay.metrics)
        if args.out:
            print(f"schedule written to {args.out}")
    return 0


def cmd_validate(args) -> int:
    instance = load_case(args.case)
    schedule = load_schedule(args.schedule)
    try:
        replay = validate(instance, schedule)
        replay.apply_slo(args.slo)
    except ScheduleError as exc:
        if args.json:
            print(json.dumps({"valid": False, "error": str(exc)}))
        else:
            print(f"invalid: {exc}")
        return 1
    if args.json:
        print(json.dumps({"valid": True, "metrics": replay.metrics.to_dict()}))
    else:
        print_metrics(f"valid: {args.schedule} on {instance.name or args.case}", replay.metrics)
    return 0


def cmd_schedulers(args) -> int:
    width = max(len(n) for n in SCHEDULERS)
    for name, desc in SCHEDULERS.items():
        print(f"{name:<{width}}  {desc}")
    return 0


def cmd_generate(args) -> int:
    from ..generate import generate_case_text

    text = generate_case_text(args.requests, args.seed, rate=args.rate, kv_capacity=args.kv_capacity,
                              max_batch_tokens=args.max_batch_tokens, preset=args.preset, context=args.context,
                              name=args.name, out=args.out)
    write_user_file(args.out, text)
    print(f"wrote {args.out}: {args.requests} requests")
    return 0
