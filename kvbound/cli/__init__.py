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
from ..fileio import check_out_folder, check_out_path
from ..interrupt import Stopped
from . import analysis, basic, capacity, executor, solve
from .args import Parser, with_flag

#: the command families, in the order `kvbound --help` lists them; none imports torch at import time,
#: so that the solver works without the `executor` extra
FAMILIES = (basic, solve, executor, analysis, capacity)


def build_parser() -> Parser:
    parser = Parser(prog="kvbound", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvbound {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for family in FAMILIES:
        family.register(sub)
    for command in sub.choices.values():  # lets main() name a bad argument by its flag
        command.set_defaults(flags=frozenset(command._option_string_actions))
    return parser


#: (command, argument) -> the suffixes a file kvbound writes must have (None: any); every `--out`,
#: `--export` and `--plot` is checked before the command starts work
IMAGE = (".png", ".svg", ".pdf")
OUT_SUFFIXES = {("solve", "export"): (".mps", ".lp"), ("compare", "plot"): IMAGE, ("plot", "out"): IMAGE,
                ("calibrate", "plot"): IMAGE, ("replay", "plot"): IMAGE}
#: arguments naming a folder rather than a file
OUT_FOLDERS = {("sweep", "out")}


def check_outputs(args) -> None:
    """Every output path of the command, checked before any work starts (a result is never lost to a bad path)."""
    for field in ("out", "export", "plot"):
        value = getattr(args, field, None)
        if not value:
            continue
        if (args.command, field) in OUT_FOLDERS:
            check_out_folder(value, f"--{field}")
        else:
            check_out_path(value, f"--{field}", OUT_SUFFIXES.get((args.command, field)))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    interrupt.reset()
    interrupt.install()  # Ctrl-C and SIGTERM: the command stops, reports what it knows, exits 130 / 143
    rc = 0
    try:
        check_outputs(args)
        rc = args.func(args)
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
