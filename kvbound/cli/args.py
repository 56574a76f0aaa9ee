"""Argument helpers every command family shares: the parser class, number types, and the solver
options (`--objective`, `--time-limit`, `--solver`, `--formulation`) with their defaults written once."""
from __future__ import annotations

import argparse
import math

from ..errors import InputError
from ..objective import OBJECTIVES, Objective
from ..solvers.api import FORMULATIONS
from ..solvers.backends import BACKENDS
from ..solvers.options import DEFAULT_TIME_LIMIT, SolveOptions


class Parser(argparse.ArgumentParser):
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


def slo_type(text: str):
    """An argparse type: `ttft=S,tbt=S` (seconds) as a kvbound.schedule.Slo."""
    from ..schedule import Slo

    try:
        return Slo.parse(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def add_slo(p) -> None:
    p.add_argument("--slo", type=slo_type, metavar="ttft=S,tbt=S",
                   help="also report slo_attainment: the share of requests with TTFT <= S and their own P99 TBT "
                        "(99th percentile of their gaps between consecutive tokens) <= S, as in Apt-Serve")


def add_objective(p, help: str | None = None) -> None:
    p.add_argument("--objective", default=SolveOptions.objective.value, choices=OBJECTIVES, help=help)


def add_time_limit(p, help: str = "seconds") -> None:
    p.add_argument("--time-limit", type=positive(float), default=DEFAULT_TIME_LIMIT,
                   help=f"{help} (default {DEFAULT_TIME_LIMIT:g})")


def add_backend(p, help: str | None = None) -> None:
    """`--solver` and `--formulation`: which backend solves which model."""
    p.add_argument("--solver", default=SolveOptions.backend, choices=BACKENDS, help=help)
    p.add_argument("--formulation", default=SolveOptions.formulation, choices=FORMULATIONS,
                   help="chain: per-class state network with one arc per token (strong, size ~ I); network: one "
                        "arc per chunk (size ~ I^2); bigm: the seed paper's model; auto (default): chain while it "
                        "is small enough, else bigm")


def solve_options(args, **more) -> SolveOptions:
    """The SolveOptions of a command's `--objective`, `--solver`, `--formulation` and `--time-limit`."""
    return SolveOptions(objective=Objective.parse(args.objective, "", "objective"), backend=args.solver,
                        formulation=args.formulation, time_limit=args.time_limit, **more)


def with_flag(exc: InputError, flags) -> InputError:
    """The library names a bad argument by its field (e.g. `shape`); on the command line it is `--shape`."""
    flag = "--" + exc.field.replace("_", "-")
    if exc.source or flag not in flags:
        return exc
    return InputError(flag, "", exc.problem)
