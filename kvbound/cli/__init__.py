"""Command-line interface: a thin layer over the Python API.

Bad input ends with one `error: ...` line on stderr and exit status 2; an invalid
schedule given to `validate` is exit status 1.
"""
from __future__ import annotations

import sys

from .. import __version__
from ..errors import InputError, KvboundError
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"error: {with_flag(exc, args.flags)}", file=sys.stderr)
        return 2
    except KvboundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
