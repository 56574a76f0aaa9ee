"""Command-line interface: a thin layer over the Python API.

Bad input ends with one `error: ...` line on stderr and exit status 2; an invalid
schedule given to `validate` is exit status 1.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from .. import __version__, interrupt
from ..errors import InputError, KvboundError
from ..fileio import check_paths, guarded_stdout
from ..interrupt import Stopped
from . import analysis, basic, capacity, executor, headroom, solve
from .args import Parser, with_flag

#: the command families, in the order `kvbound --help` lists them; none imports torch at import time,
#: so that the solver works without the `executor` extra
FAMILIES = (basic, solve, executor, analysis, capacity, headroom)


def build_parser() -> Parser:
    parser = Parser(prog="kvbound", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvbound {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for family in FAMILIES:
        family.register(sub)
    for command in sub.choices.values():  # lets main() name a bad argument by its flag
        command.set_defaults(flags=frozenset(command._option_string_actions))
    return parser


#: (command, argument) -> the suffixes a file kvbound writes must have (the format it writes); every
#: `--out`, `--export` and `--plot` is checked before the command starts work
IMAGE = (".png", ".svg", ".pdf")
OUT_SUFFIXES = {("simulate", "out"): (".json",), ("solve", "out"): (".json",), ("solve", "export"): (".mps", ".lp"),
                ("export", "out"): (".json",), ("import", "out"): (".json",), ("plot", "out"): IMAGE,
                ("compare", "plot"): IMAGE, ("generate", "out"): (".toml",), ("profile", "out"): (".csv",),
                ("calibrate", "out"): (".toml",), ("calibrate", "plot"): IMAGE, ("replay", "plot"): IMAGE,
                ("headroom", "plot"): IMAGE}
#: arguments naming a folder rather than a file
OUT_FOLDERS = {("sweep", "out"), ("headroom", "out")}
#: command -> (argument, what it is) for each file it reads; no output may be one of them
IN_FILES = {"simulate": (("case", "case file"),), "validate": (("case", "case file"), ("schedule", "schedule")),
            "solve": (("case", "case file"),), "bound": (("case", "case file"),), "prove": (("case", "case file"),),
            "compare": (("case", "case file"),), "capacity": (("case", "case file"),),
            "headroom": (("case", "case file"),),
            "plot": (("schedule", "schedule"), ("case", "case file")),
            "export": (("schedule", "schedule"), ("case", "case file")),
            "import": (("precomputed", "precomputed schedule"), ("case", "case file")),
            "calibrate": (("profile", "profile"),), "sweep": (("spec", "sweep spec"),),
            "replay": (("case", "case file"), ("schedule", "schedule"), ("cost", "cost file"))}
#: a case file up to this size is read once more before the command starts, for the trace it names
_TRACE_PROBE_BYTES = 1 << 20


def _trace_of(case: str) -> str | None:
    """The trace a (small) case file's [workload] names, or None; the command's own reading reports any problem."""
    from ..io.cases import read_toml

    try:
        if os.path.getsize(case) > _TRACE_PROBE_BYTES:
            return None
        trace = read_toml(case).get("workload", {}).get("trace")
    except (OSError, KvboundError, AttributeError):
        return None
    return os.path.join(os.path.dirname(case), trace) if isinstance(trace, str) else None


def check_outputs(args) -> None:
    """Every output path of the command, checked before any work starts (a result is never lost to a bad
    path, an input never overwritten): not empty, not one of the command's input files (the case's trace
    included) nor another output, a file name with the suffix of the format written, in a writable folder."""
    outputs, folders = [], []
    for field in ("out", "export", "plot"):
        value = getattr(args, field, None)
        if value is None:
            continue
        if (args.command, field) in OUT_FOLDERS:
            folders.append((f"--{field}", value))
        else:
            outputs.append((f"--{field}", value, OUT_SUFFIXES.get((args.command, field))))
    if not outputs and not folders:
        return
    inputs = [(what, getattr(args, name, None)) for name, what in IN_FILES.get(args.command, ())]
    if outputs and getattr(args, "case", None):
        inputs.append(("trace of the case file", _trace_of(args.case)))
    check_paths(inputs, outputs, folders)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    interrupt.install()  # Ctrl-C and SIGTERM: the command stops, reports what it knows, exits 130 / 143 (one
    # caught while the command started, kvbound.interrupt.at_startup, included; any other earlier one is forgotten)
    rc = 0
    try:
        check_outputs(args)
        with guarded_stdout():  # a full disk or an encoding without the characters: one error line
            rc = args.func(args)
            sys.stdout.flush()  # a failed write of the last output is reported here, not at exit
        rc = interrupt.exit_status() if interrupt.requested() is not None else rc
    except InputError as exc:
        print(f"error: {with_flag(exc, args.flags)}", file=sys.stderr)
        rc = 2
    except KvboundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        rc = 2
    except (Stopped, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        rc = interrupt.exit_status()
    except BrokenPipeError:
        rc = 0
    except OSError as exc:  # a write (or read) that no reader or writer turned into an InputError: one line
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        rc = 2
    finally:
        interrupt.cleanup()
        if interrupt.abandoned():  # a solver thread that would not stop: end without waiting for it
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
        if threading.current_thread() is threading.main_thread():
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        interrupt.uninstall()
    return rc
