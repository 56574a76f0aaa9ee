"""Argument helpers every command family shares: the parser class, number types, and the solver
options (`--objective`, `--time-limit`, `--solver`, `--formulation`) with their defaults written once."""
from __future__ import annotations

import argparse
import math

from ..backends import AUTO, BACKENDS, SOLVERS, chosen_backends
from ..backends.race import RACE_LIMIT
from ..errors import InputError
from ..formulation import FORMULATION_KINDS
from ..objective import OBJECTIVES, Objective
from ..solvers.options import DEFAULT_TIME_LIMIT, FORMULATIONS, SEARCH, SEARCH_ALIAS, SolveOptions
from ..units import BACKENDS as UNIT_BACKENDS
from ..units import UnitRunner
from ..workload import MAX_INT


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2, like every other bad input
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


#: the longest --time-limit, seconds (about 11.6 days)
MAX_TIME_LIMIT = 1e6


def number(kind, low: float, high: float, *, low_open: bool = False, what: str = ""):
    """An argparse type: a finite `kind` in [low, high] ((low, high] with `low_open`); anything else
    (nan, inf, out of range, too large for the solvers) is bad input, exit 2."""
    def parse(text: str):
        try:
            v = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (math.isfinite(v) and (v > low if low_open else v >= low)):
            bound = f"{'>' if low_open else '>='} {low:g}"
            kind_text = what or ("" if kind is int else "a finite number")
            raise argparse.ArgumentTypeError(f"must be {kind_text + ' ' if kind_text else ''}{bound}, got {text}")
        if v > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:g}, got {text}")
        return v
    return parse


def positive(kind, high: float | None = None):
    """An argparse type: a finite number > 0 of `kind`, at most `high` (integers: < 2^53)."""
    if kind is int:
        return number(int, 1, MAX_INT if high is None else high)
    return number(float, 0, MAX_TIME_LIMIT if high is None else high, low_open=True)


def seed(text: str) -> int:
    """A random seed: an integer in [0, 2^32 - 1] (numpy's range)."""
    return number(int, 0, 2 ** 32 - 1, what="an integer seed")(text)


def percent(text: str) -> float:
    """A percentage improvement: 0 <= X < 100 (100% better would be a latency of 0)."""
    v = number(float, 0, 100, what="a percentage")(text)
    if v >= 100:
        raise argparse.ArgumentTypeError(f"must be a percentage >= 0 and < 100, got {text}")
    return v


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
                   help=f"{help}, > 0 and <= {MAX_TIME_LIMIT:g} (default {DEFAULT_TIME_LIMIT:g}); the whole command "
                        "keeps to it within max(2 s, 10%%)")


def add_backend(p, help: str | None = None) -> None:
    """`--solver` and `--formulation`: which backend solves which model."""
    racers = " and ".join(b.name for b in BACKENDS.values() if b.races)
    solvers = "; ".join([f"{AUTO} (default): {racers} side by side on a model of up to {RACE_LIMIT:,} variables, "
                         f"sharing solutions, the first proof wins; else {chosen_backends(AUTO, math.inf, BACKENDS)[0].name}"]
                        + [f"{b.name}: {b.summary}" for b in BACKENDS.values()])
    p.add_argument("--solver", default=SolveOptions.backend, choices=SOLVERS, help=help or solvers)
    models = "; ".join(f"{k.name}: {k.summary}" for k in FORMULATION_KINDS.values())
    p.add_argument("--formulation", default=SolveOptions.formulation, choices=FORMULATIONS,
                   help=f"{models}; {SEARCH} (or {SEARCH_ALIAS}): no model, a Lagrangian bound (mean objectives), "
                        "the configuration LP and packing (total latency) and a search over admission orders until "
                        f"the time limit; auto (default): the first model small enough, else {SEARCH}")


def add_units(p, what: str) -> None:
    """`--backend`, `--address` and `--workers`: where independent units of work run (`kvbound.units`)."""
    p.add_argument("--backend", choices=UNIT_BACKENDS, default="local",
                   help=f"{what}: local: a process pool (default); ray: Ray tasks")
    p.add_argument("--address", help="with --backend ray: the cluster to join (e.g. auto or ray://host:10001); "
                                     "default: start a local Ray instance")
    p.add_argument("--workers", type=positive(int), help="units at once (default: the CPU count)")


def unit_runner(args) -> UnitRunner:
    return UnitRunner(args.backend, args.workers, args.address)


def solve_options(args, **more) -> SolveOptions:
    """The SolveOptions of a command's `--objective`, `--solver`, `--formulation`, `--time-limit` and,
    where it has them, `--backend`, `--address` and `--workers`."""
    if hasattr(args, "address"):  # the commands with add_units
        more.setdefault("units", unit_runner(args))
    return SolveOptions(objective=Objective.parse(args.objective, "", "objective"), backend=args.solver,
                        formulation=args.formulation, time_limit=args.time_limit, **more)


def with_flag(exc: InputError, flags) -> InputError:
    """The library names a bad argument by its field (e.g. `shape`); on the command line it is `--shape`."""
    flag = "--" + exc.field.replace("_", "-")
    if exc.source or flag not in flags:
        return exc
    return InputError(flag, "", exc.problem)
