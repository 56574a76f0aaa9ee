"""Requests, system limits and instances; case-file and trace loading with validation.

A case file (TOML) is the contract documented in README.md and docs/semantics.md.
Every problem with one is raised as `InputError(file, field, problem)`.
"""
from __future__ import annotations

import csv
import math
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path

import numpy as np

from .accounting import round_to_blocks
from .costs import FEATURES, PRESETS, CostModel
from .errors import InputError
from .fileio import check_in_path, read_user_text


@dataclass(frozen=True)
class Request:
    prompt: int  # I >= 1
    output: int  # O >= 1, tokens to generate including the final one
    arrival: float = 0.0  # seconds

    @property
    def peak_kv(self) -> int:
        """Largest KV a request ever holds: the final token is generated, never cached."""
        return self.prompt + self.output - 1


@dataclass(frozen=True)
class SystemConfig:
    kv_capacity: int  # M, tokens
    max_batch_tokens: int  # C
    max_prefill_tokens: int | None = None  # P, default C
    block_size: int = 1  # b

    def __post_init__(self):
        if self.max_prefill_tokens is None:
            object.__setattr__(self, "max_prefill_tokens", self.max_batch_tokens)

    @property
    def prefill_per_batch(self) -> int:
        """The most prefill-type tokens one batch can process: min(P, C)."""
        return min(self.max_prefill_tokens, self.max_batch_tokens)

    def blocks(self, tokens: int) -> int:
        """KV tokens charged for `tokens` cached tokens: rounded up to whole blocks."""
        return round_to_blocks(tokens, self.block_size)


@dataclass(frozen=True)
class Instance:
    requests: tuple[Request, ...]
    system: SystemConfig
    cost: CostModel
    name: str = ""
    description: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "requests", tuple(self.requests))
        check_instance(self, self.source)

    def __len__(self) -> int:
        return len(self.requests)

    @cached_property
    def prompts(self) -> np.ndarray:
        return np.array([r.prompt for r in self.requests], dtype=np.int64)

    @cached_property
    def outputs(self) -> np.ndarray:
        return np.array([r.output for r in self.requests], dtype=np.int64)

    @cached_property
    def arrivals(self) -> np.ndarray:
        return np.array([r.arrival for r in self.requests], dtype=float)

    @property
    def offline(self) -> bool:
        return bool((self.arrivals == 0).all())

    def with_system(self, **changes) -> "Instance":
        s = self.system
        values = dict(kv_capacity=s.kv_capacity, max_batch_tokens=s.max_batch_tokens,
                      max_prefill_tokens=s.max_prefill_tokens, block_size=s.block_size)
        values.update(changes)
        return Instance(self.requests, SystemConfig(**values), self.cost, self.name, self.description, self.source)


# --------------------------------------------------------------------------- validation

#: limits on what a case may ask for, checked when it is read (before any memory is spent on it):
#: every integer below 2^53 (exact in the float models HiGHS and CBC solve)
MAX_INT = 2 ** 53 - 1
#: at most this many requests (a `count` beyond it is refused before the list is made)
MAX_REQUESTS = 1_000_000
#: a request's prompt + output, tokens (the simulator and the models grow with them)
MAX_REQUEST_TOKENS = 2 ** 24
#: all requests' prompt + output together, tokens (shipped cases: at most 26.5 million)
MAX_TOTAL_TOKENS = 2 ** 28
#: cost coefficients are finite and at most this (seconds per unit of their feature)
MAX_COST = 1e3
#: arrivals are finite and at most this many seconds (about 31.7 years)
MAX_ARRIVAL = 1e9


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_int(source: str, name: str, value, most: int = MAX_INT) -> int:
    if not _is_int(value):
        raise InputError(source, name, f"must be an integer, got {value!r}")
    if value < 1:
        raise InputError(source, name, f"must be >= 1, got {value}")
    if value > most:
        raise InputError(source, name, f"must be <= {most:,}, got {value:,}" + (" (integers must stay below 2^53)"
                                                                               if most == MAX_INT else ""))
    return value


def _nonneg_number(source: str, name: str, value, most: float = math.inf) -> float:
    if not _is_number(value):
        raise InputError(source, name, f"must be a number, got {value!r}")
    if _is_int(value) and abs(value) > MAX_INT:
        raise InputError(source, name, f"must be <= {most:g}, got {value:.3g}")
    if not math.isfinite(value):
        raise InputError(source, name, f"must be finite, got {value}")
    if value < 0:
        raise InputError(source, name, f"must be >= 0, got {value}")
    if value > most:
        raise InputError(source, name, f"must be <= {most:g}, got {value:g}")
    return float(value)


def check_instance(inst: Instance, source: str = "") -> None:
    """Raise InputError unless the instance can be served by some schedule under the semantics."""
    s = inst.system
    for name in ("kv_capacity", "max_batch_tokens", "max_prefill_tokens", "block_size"):
        _positive_int(source, f"system.{name}", getattr(s, name))
    if s.max_prefill_tokens > s.max_batch_tokens:
        raise InputError(source, "system.max_prefill_tokens",
                         f"P = {s.max_prefill_tokens} exceeds max_batch_tokens C = {s.max_batch_tokens}")
    if not inst.requests:
        raise InputError(source, "requests", "the request list is empty")
    if len(inst.requests) > MAX_REQUESTS:
        raise InputError(source, "requests", f"{len(inst.requests):,} requests; at most {MAX_REQUESTS:,}")
    for k, value in enumerate(inst.cost.coefficients):
        if not (math.isfinite(value) and 0 <= value <= MAX_COST):
            raise InputError(source, f"cost.{FEATURES[k]}", f"must be finite, >= 0 and <= {MAX_COST:g}, got {value!r}")
    total = 0
    for i, r in enumerate(inst.requests):
        _positive_int(source, f"request {i}: prompt", r.prompt, MAX_REQUEST_TOKENS)
        _positive_int(source, f"request {i}: output", r.output, MAX_REQUEST_TOKENS)
        _nonneg_number(source, f"request {i}: arrival", r.arrival, MAX_ARRIVAL)
        if r.prompt + r.output > MAX_REQUEST_TOKENS:
            raise InputError(source, f"request {i}", f"prompt + output = {r.prompt + r.output:,} tokens; "
                             f"at most {MAX_REQUEST_TOKENS:,}")
        total += r.prompt + r.output
        peak = s.blocks(r.peak_kv)
        if peak > s.kv_capacity:
            raise InputError(source, f"request {i}",
                             f"peak KV {peak} tokens (prompt {r.prompt} + output {r.output} - 1"
                             f"{', in blocks of %d' % s.block_size if s.block_size > 1 else ''})"
                             f" exceeds kv_capacity {s.kv_capacity}")
    if total > MAX_TOTAL_TOKENS:
        raise InputError(source, "requests", f"{total:,} tokens of prompt and output in all; at most {MAX_TOTAL_TOKENS:,}")


# --------------------------------------------------------------------------- case files

_TOP_KEYS = {"name", "description", "system", "cost", "requests", "workload"}
_SYSTEM_KEYS = {"kv_capacity", "max_batch_tokens", "max_prefill_tokens", "block_size"}
_COST_KEYS = set(FEATURES) | {"preset", "token_knees", "per_token_above"}
_REQUEST_KEYS = {"prompt", "output", "count", "arrival"}
_WORKLOAD_KEYS = {"trace", "limit", "offset", "time_scale"}


def _check_keys(source: str, where: str, table, allowed: set[str]) -> None:
    if not isinstance(table, dict):
        raise InputError(source, where, f"must be a table, got {type(table).__name__}")
    for key in table:
        if key not in allowed:
            hint = _closest(key, allowed)
            raise InputError(source, f"{where}.{key}" if where else key,
                             "unknown key" + (f" (did you mean '{hint}'?)" if hint else "")
                             + f"; allowed: {', '.join(sorted(allowed))}")


def _closest(key: str, allowed: set[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
    return match[0] if match else None


def parse_cost(source: str, table: dict) -> CostModel:
    _check_keys(source, "cost", table, _COST_KEYS)
    values: dict[str, float] = {}
    if "preset" in table:
        name = table["preset"]
        if not isinstance(name, str) or name not in PRESETS:
            raise InputError(source, "cost.preset", f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        values = PRESETS[name].as_dict()
    for name in FEATURES:
        if name in table:
            values[name] = _nonneg_number(source, f"cost.{name}", table[name], MAX_COST)
    if values.get("intercept", 0.0) <= 0:
        raise InputError(source, "cost.intercept", "must be > 0 (set it or name a preset)")
    if "token_knees" in table or "per_token_above" in table:
        values.update(_parse_kinks(source, table))
    try:
        return CostModel(**values)
    except ValueError as exc:
        raise InputError(source, "cost", str(exc).removeprefix("cost.")) from None


def _parse_kinks(source: str, table: dict) -> dict:
    """`token_knees = [256]` and `per_token_above = [2.1e-5]`: equally long arrays (docs/semantics.md)."""
    out = {}
    for key in ("token_knees", "per_token_above"):
        values = table.get(key)
        if not isinstance(values, list):
            raise InputError(source, f"cost.{key}", f"must be an array (with one entry per knee), got {values!r}")
        out[key] = tuple(_positive_int(source, f"cost.{key}[{k}]", v) if key == "token_knees"
                         else _nonneg_number(source, f"cost.{key}[{k}]", v) for k, v in enumerate(values))
    return out


def parse_system(source: str, table: dict) -> SystemConfig:
    _check_keys(source, "system", table, _SYSTEM_KEYS)
    for key in ("kv_capacity", "max_batch_tokens"):
        if key not in table:
            raise InputError(source, f"system.{key}", "missing")
    vals = {k: _positive_int(source, f"system.{k}", v) for k, v in table.items()}
    return SystemConfig(**vals)


def _parse_requests(source: str, entries) -> list[Request]:
    if not isinstance(entries, list):
        raise InputError(source, "requests", "must be an array of tables ([[requests]])")
    out: list[Request] = []
    if len(entries) > MAX_REQUESTS:
        raise InputError(source, "requests", f"{len(entries):,} entries; at most {MAX_REQUESTS:,} requests")
    for k, entry in enumerate(entries):
        where = f"requests[{k}]"
        _check_keys(source, where, entry, _REQUEST_KEYS)
        for key in ("prompt", "output"):
            if key not in entry:
                raise InputError(source, f"{where}.{key}", "missing")
        prompt = _positive_int(source, f"{where}.prompt", entry["prompt"], MAX_REQUEST_TOKENS)
        output = _positive_int(source, f"{where}.output", entry["output"], MAX_REQUEST_TOKENS)
        count = _positive_int(source, f"{where}.count", entry.get("count", 1), MAX_REQUESTS - len(out))
        arrival = _nonneg_number(source, f"{where}.arrival", entry.get("arrival", 0.0), MAX_ARRIVAL)
        out.extend(Request(prompt, output, arrival) for _ in range(count))
    return out


def load_case(path: str | Path) -> Instance:
    """Read and validate a case file."""
    path = Path(path)
    return parse_case(read_toml(path), str(path), base_dir=path.parent)


#: largest TOML file read (a case with a million [[requests]] entries is about 60 MB)
MAX_TOML_BYTES = 256 << 20


def read_toml(path: str | Path) -> dict:
    """A TOML file's tables; an unreadable file or malformed TOML is bad input naming the file."""
    source = str(path)
    text = read_user_text(path, MAX_TOML_BYTES)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, "", f"malformed TOML: {exc}") from None


def load_cost_file(path: str | Path) -> CostModel:
    """The [cost] table of a TOML file (a `kvbound calibrate` output or a case file)."""
    data = read_toml(path)
    if not isinstance(data.get("cost"), dict):
        raise InputError(str(path), "cost", "missing section [cost]")
    return parse_cost(str(path), data["cost"])


def parse_case(data: dict, source: str = "<case>", base_dir: Path | None = None) -> Instance:
    _check_keys(source, "", data, _TOP_KEYS)
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise InputError(source, key, f"must be a string, got {data[key]!r}")
    if "system" not in data:
        raise InputError(source, "system", "missing section [system]")
    if "cost" not in data:
        raise InputError(source, "cost", "missing section [cost]")
    system = parse_system(source, data["system"])
    cost = parse_cost(source, data["cost"])
    has_requests, has_workload = "requests" in data, "workload" in data
    if has_requests and has_workload:
        raise InputError(source, "workload", "give either [[requests]] or [workload], not both")
    if not has_requests and not has_workload:
        raise InputError(source, "requests", "missing: give [[requests]] or [workload] trace = ...")
    if has_requests:
        requests = _parse_requests(source, data["requests"])
    else:
        requests = _parse_workload(source, data["workload"], base_dir or Path("."))
    return Instance(tuple(requests), system, cost, data.get("name", ""), data.get("description", ""), source)


def _parse_workload(source: str, table, base_dir: Path) -> list[Request]:
    _check_keys(source, "workload", table, _WORKLOAD_KEYS)
    if "trace" not in table:
        raise InputError(source, "workload.trace", "missing")
    trace = table["trace"]
    if not isinstance(trace, str):
        raise InputError(source, "workload.trace", f"must be a path string, got {trace!r}")
    limit = table.get("limit")
    if limit is not None:
        limit = _positive_int(source, "workload.limit", limit, MAX_REQUESTS)
    offset = table.get("offset", 0)
    if not _is_int(offset) or not 0 <= offset <= MAX_INT:
        raise InputError(source, "workload.offset", f"must be an integer >= 0 and < 2^53, got {offset!r}")
    time_scale = _nonneg_number(source, "workload.time_scale", table.get("time_scale", 1.0), MAX_ARRIVAL)
    path = Path(trace)
    if not path.is_absolute():
        path = base_dir / path
    return load_trace(path, limit=limit, offset=offset, time_scale=time_scale)


# --------------------------------------------------------------------------- traces

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
    return value


def load_trace(path: str | Path, *, limit: int | None = None, offset: int = 0, time_scale: float = 1.0) -> list[Request]:
    """Requests from a Splitwise/Vidur, Azure LLM-inference or length-only CSV trace.

    Arrivals are shifted so that the first selected request arrives at 0, then scaled
    by `time_scale` (0 makes an offline workload).
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
    t0 = rows[0][0]
    return [Request(p, o, max(0.0, (t - t0) * time_scale)) for t, p, o in rows]
