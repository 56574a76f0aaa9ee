"""CSV traces: Splitwise/Vidur, Azure LLM-inference and length-only request lists."""
from __future__ import annotations

import csv
import math
from datetime import datetime, timezone
from pathlib import Path

from ..errors import InputError
from ..fileio import check_in_path
from ..workload import MAX_REQUESTS, Request

_TRACE_FORMATS = {
    # name: (arrival column or None, prompt column, output column)
    "splitwise": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "lengths": (None, "num_prefill_tokens", "num_decode_tokens"),
}


def _trace_int(source: str, row: int, col: str, text: str) -> int:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InputError(source, f"row {row}, column {col}", f"not a number: {text!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise InputError(source, f"row {row}, column {col}", f"must be an integer, got {text!r}")
    if value < 1:
        raise InputError(source, f"row {row}, column {col}", f"must be >= 1, got {text!r}")
    return int(value)


def _trace_time(source: str, row: int, col: str, text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = None
    if value is None:
        # Azure timestamps: "2023-11-16 18:15:46.6805900"; fromisoformat takes at most 6 fraction digits
        stamp = text.strip()
        if "." in stamp:
            head, frac = stamp.split(".", 1)
            stamp = f"{head}.{frac[:6]}"
        try:
            when = datetime.fromisoformat(stamp)
        except ValueError:
            raise InputError(source, f"row {row}, column {col}", f"not a time: {text!r}") from None
        if when.tzinfo is None:  # naive stamps are read as UTC, never local time (no DST jumps)
            when = when.replace(tzinfo=timezone.utc)
        return when.timestamp()
    if not math.isfinite(value):
        raise InputError(source, f"row {row}, column {col}", f"must be finite, got {text!r}")
    if value < 0:  # seconds since the trace's start: never before it (a date may be any date)
        raise InputError(source, f"row {row}, column {col}", f"must be >= 0, got {text.strip()}")
    return value


def load_trace(path: str | Path, *, limit: int | None = None, offset: int = 0, time_scale: float = 1.0) -> list[Request]:
    """Requests from a Splitwise/Vidur, Azure LLM-inference or length-only CSV trace.

    The rows `offset .. offset + limit - 1` are selected in file order; their arrivals are shifted
    so that the earliest selected one is 0 (not necessarily the first row's), then scaled by
    `time_scale` (0 makes an offline workload). The requests are returned in arrival order (rows
    with equal arrivals keep their file order). A negative arrival (in seconds) and a column the
    formats read given twice are bad input.
    """
    path = Path(path)
    source = str(path)
    check_in_path(path, what="trace")
    try:
        handle = open(path, newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(source, "", f"cannot read trace: {exc.strerror or exc}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise InputError(source, "", "empty trace file") from None
        except csv.Error as exc:
            raise InputError(source, "", f"malformed CSV: {exc}") from None
        except UnicodeDecodeError as exc:
            raise InputError(source, "", f"cannot read trace: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
        header = [h.strip() for h in header]
        read = {c for cols in _TRACE_FORMATS.values() for c in cols if c}
        twice = sorted({h for h in header if h in read and header.count(h) > 1})
        if twice:
            raise InputError(source, "header", f"column {', '.join(twice)} appears more than once; which one "
                                               "to read is ambiguous")
        for fmt, (t_col, p_col, o_col) in _TRACE_FORMATS.items():
            if p_col in header and o_col in header and (t_col is None or t_col in header):
                break
        else:
            raise InputError(source, "header", "unknown trace format; expected columns "
                             "arrived_at,num_prefill_tokens,num_decode_tokens (Splitwise/Vidur), "
                             "TIMESTAMP,ContextTokens,GeneratedTokens (Azure) or num_prefill_tokens,num_decode_tokens")
        ti = header.index(t_col) if t_col else None
        pi, oi = header.index(p_col), header.index(o_col)
        rows: list[tuple[float, int, int]] = []
        end = None if limit is None else offset + limit
        try:
            for k, row in enumerate(reader):
                if k < offset:
                    continue
                if end is not None and k >= end:
                    break
                if len(rows) >= MAX_REQUESTS:
                    raise InputError(source, "", f"more than {MAX_REQUESTS:,} requests selected; "
                                                 "select fewer with [workload] limit")
                line = k + 2  # 1-based, after the header
                if len(row) != len(header):
                    raise InputError(source, f"row {line}", f"expected {len(header)} fields, got {len(row)}")
                t = _trace_time(source, line, t_col, row[ti]) if ti is not None else 0.0
                rows.append((t, _trace_int(source, line, p_col, row[pi]), _trace_int(source, line, o_col, row[oi])))
        except csv.Error as exc:
            raise InputError(source, "", f"malformed CSV: {exc}") from None
        except UnicodeDecodeError as exc:
            raise InputError(source, "", f"cannot read trace: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if not rows:
        raise InputError(source, "", "no requests selected from the trace")
    t0 = min(t for t, _, _ in rows)  # the earliest selected arrival, wherever its row is
    rows.sort(key=lambda row: row[0])  # stable: equal arrivals keep their file order
    return [Request(p, o, (t - t0) * time_scale) for t, p, o in rows]
