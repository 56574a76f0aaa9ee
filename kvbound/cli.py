"""Command-line interface: a thin layer over the Python API.

Bad input ends with one `error: ...` line on stderr and exit status 2; an invalid
schedule given to `validate` is exit status 1.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from . import __version__
from .errors import KvboundError
from .schedule import Metrics, Schedule, ScheduleError, validate, write_json_atomic
from .schedulers import SCHEDULERS, run_scheduler
from .workload import load_case


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2, like every other bad input
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def positive(kind):
    """An argparse type: a finite number > 0 of `kind` (nan, inf, 0 and negatives are bad input, exit 2)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (math.isfinite(v) and v > 0):  # integers say it as the case files do
            raise argparse.ArgumentTypeError(f"must be >= 1, got {v}" if kind is int else f"must be a finite number > 0, got {text}")
        return v
    return parse


def _metrics_json(metrics: Metrics) -> dict:
    return metrics.to_dict()


def _print_metrics(title: str, metrics: Metrics) -> None:
    d = metrics.to_dict()
    print(title)
    rows = [
        ("total latency", f"{d['total_latency']:.6g} s"),
        ("mean latency", f"{d['mean_latency']:.6g} s  (p50 {d['p50_latency']:.6g}, p99 {d['p99_latency']:.6g})"),
        ("mean TTFT", f"{d['mean_ttft']:.6g} s  (p50 {d['p50_ttft']:.6g}, p99 {d['p99_ttft']:.6g})"),
        ("mean TPOT", f"{d['mean_tpot']:.6g} s  (p50 {d['p50_tpot']:.6g}, p99 {d['p99_tpot']:.6g})"),
        ("batches", str(d["batches"])),
        ("evictions", str(d["evictions"])),
        ("recomputed tokens", str(d["recomputed_tokens"])),
        ("peak KV", f"{d['peak_kv']} tokens"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def cmd_simulate(args) -> int:
    instance = load_case(args.case)
    result = run_scheduler(instance, args.scheduler)
    schedule_json = result.schedule.to_json()
    # every schedule is checked by the validator, from its JSON form, before it is reported
    replay = validate(instance, Schedule.from_json(schedule_json))
    if args.out:
        write_json_atomic(args.out, schedule_json)
    if args.json:
        json.dump({"scheduler": result.policy, "metrics": _metrics_json(replay.metrics), "schedule": schedule_json},
                  sys.stdout)
        print()
    else:
        name = instance.name or args.case
        _print_metrics(f"{name}: scheduler {result.policy}, {len(instance)} requests", replay.metrics)
        if args.out:
            print(f"schedule written to {args.out}")
    return 0


def cmd_validate(args) -> int:
    instance = load_case(args.case)
    schedule = Schedule.load(args.schedule)
    try:
        replay = validate(instance, schedule)
    except ScheduleError as exc:
        if args.json:
            print(json.dumps({"valid": False, "error": str(exc)}))
        else:
            print(f"invalid: {exc}")
        return 1
    if args.json:
        print(json.dumps({"valid": True, "metrics": _metrics_json(replay.metrics)}))
    else:
        _print_metrics(f"valid: {args.schedule} on {instance.name or args.case}", replay.metrics)
    return 0


def cmd_schedulers(args) -> int:
    width = max(len(n) for n in SCHEDULERS)
    for name, desc in SCHEDULERS.items():
        print(f"{name:<{width}}  {desc}")
    return 0


def cmd_generate(args) -> int:
    from .generate import generate_case_text, write_text_atomic

    text = generate_case_text(args.requests, args.seed, rate=args.rate, kv_capacity=args.kv_capacity,
                              max_batch_tokens=args.max_batch_tokens, preset=args.preset, context=args.context,
                              name=args.name, out=args.out)
    write_text_atomic(args.out, text)
    print(f"wrote {args.out}: {args.requests} requests")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvbound", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvbound {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("simulate", help="run one heuristic scheduler on a case and print its metrics")
    p.add_argument("case")
    p.add_argument("--scheduler", required=True, help="a name from `kvbound schedulers`, optionally name:key=value,...")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", help="write the schedule JSON here")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("validate", help="replay a schedule under the semantics; exit 1 if it breaks a rule")
    p.add_argument("case")
    p.add_argument("schedule")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("schedulers", help="list the schedulers")
    p.set_defaults(func=cmd_schedulers)

    p = sub.add_parser("generate", help="write a seeded synthetic case file with trace-like lengths")
    p.add_argument("--requests", type=int, required=True, help="number of requests")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--rate", type=float, help="Poisson arrivals, requests per second (default: offline)")
    p.add_argument("--kv-capacity", type=int, default=100_000, help="M, tokens (default 100000)")
    p.add_argument("--max-batch-tokens", type=int, default=4096, help="C (default 4096)")
    p.add_argument("--preset", default="llama2-7b-a100", help="cost preset (default llama2-7b-a100)")
    p.add_argument("--context", type=int, default=4096, help="prompt + output <= this (default 4096, Llama-2)")
    p.add_argument("--name", help="the case's name (default synthetic-N-seedS)")
    p.add_argument("--out", required=True, help="case file to write (atomically)")
    p.set_defaults(func=cmd_generate)

    _add_later_commands(sub)
    return parser


def _add_later_commands(sub) -> None:
    """Commands of the solver, the executor and the analysis tools register here.

    Each module's `register(sub)` adds its subcommands; none may import torch at import time,
    so that the solver works without the `executor` extra.
    """
    from .analysis import cli as analysis_cli
    from .engine_bridge import cli as executor_cli
    from .solvers import cli as solver_cli

    for module in (solver_cli, executor_cli, analysis_cli):
        module.register(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KvboundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
