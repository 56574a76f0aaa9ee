"""A live progress line on a terminal (stderr): elapsed time, best schedule, bound and gap, one line
updated in place (a carriage return and an erase-line escape, as tqdm draws its bars), cut to the
terminal's width so that it never wraps. Phases `report()` what they know; `line()` shows it while a
command runs, and is silent when stderr is not a terminal (or when the command prints JSON).

Backends report in model units (`incumbent`, `bound`); `solve_with` reports the `scale` that turns
them into seconds, and the best validated schedule (`best`, seconds) and the analytic bound.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import threading
import time

_fields: dict = {}
_active = {"on": False, "muted": 0}


def report(**fields) -> None:
    """Tell the progress line what is known now (cheap, and a no-op when no line is shown)."""
    if _active["on"] and not _active["muted"]:
        _fields.update(fields)


@contextlib.contextmanager
def muted():
    """Reports inside are dropped: a solve of part of the instance (`phases.periods`) would show its
    own values as the whole's."""
    before = _active["muted"]
    _active["muted"] = before + 1
    try:
        yield
    finally:
        _active["muted"] = before


def _text(started: float) -> str:
    f = dict(_fields)
    scale = f.get("scale") or 1.0
    best = f.get("best")
    incumbent = f.get("incumbent")
    if incumbent is not None and math.isfinite(incumbent):
        best = incumbent / scale if best is None else min(best, incumbent / scale)
    bounds = [f.get("analytic", -math.inf)]
    if f.get("bound") is not None and f.get("bound_certified", True):
        bounds.append(f["bound"] / scale)
    bound = max(b for b in bounds if b is not None)
    parts = [f"{time.monotonic() - started:6.1f} s", f.get("phase", "")]
    parts.append(f"best {best:.6g} s" if best is not None else "best n/a")
    parts.append(f"bound {bound:.6g} s" if math.isfinite(bound) else "bound n/a")
    if best is not None and math.isfinite(bound) and best > 0:
        parts.append(f"gap {max(0.0, (best - bound) / best):.2%}")
    return "  ".join(p for p in parts if p)


def width(stream) -> int:
    """The terminal's width in columns, read at every update (a resized window): $COLUMNS if set, else the
    terminal `stream` is on, else the one stdout is on (`shutil.get_terminal_size`; 80 if none)."""
    if not os.environ.get("COLUMNS", "").strip().isdigit():
        try:
            return os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            pass
    return shutil.get_terminal_size().columns


def fit(text: str, columns: int) -> str:
    """`text` cut to fit in one line of `columns`: a line as long as the terminal is wide would wrap on
    some terminals (and then every update would add a line), so at most columns - 1 characters."""
    return text[:max(columns - 1, 0)]


@contextlib.contextmanager
def line(enabled: bool = True, stream=None, every: float = 0.5):
    """Show the progress line on `stream` (stderr) while the block runs, if it is a terminal."""
    stream = stream or sys.stderr
    if not enabled or not getattr(stream, "isatty", lambda: False)():
        yield
        return
    _fields.clear()
    _active["on"] = True
    started = time.monotonic()
    stop = threading.Event()

    def show(text: str) -> None:  # one line, rewritten in place (carriage return, erase to the end)
        stream.write("\r" + fit(text, width(stream)) + "\x1b[K")
        stream.flush()

    def refresh():
        while not stop.wait(every):
            show(_text(started))

    thread = threading.Thread(target=refresh, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1)
        show("")
        stream.write("\r")
        stream.flush()
        _active["on"] = False
        _fields.clear()
