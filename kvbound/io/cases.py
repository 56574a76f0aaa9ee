"""Case files: TOML read and checked into an `Instance` (the contract in README.md and docs/semantics.md).

Every problem with one is raised as `InputError(file, field, problem)`; a [workload] table reads
its trace through `kvbound.io.traces`.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from ..costs import FEATURES, PRESETS, CostModel
from ..costs.model import coefficient_problem
from ..errors import InputError
from ..fileio import MAX_NESTING, nesting_problem, read_user_text
from ..workload import (MAX_ARRIVAL, MAX_INT, MAX_REQUEST_TOKENS, MAX_REQUESTS, Instance, Request, SystemConfig,
                        is_int, nonneg_number, positive_int)
from .traces import load_trace

_TOP_KEYS = {"name", "description", "system", "cost", "requests", "workload"}
_SYSTEM_KEYS = {"kv_capacity", "max_batch_tokens", "max_prefill_tokens", "block_size"}
_COST_KEYS = set(FEATURES) | {"preset", "token_knees", "per_token_above"}
_REQUEST_KEYS = {"prompt", "output", "count", "arrival"}
_WORKLOAD_KEYS = {"trace", "limit", "offset", "time_scale"}


def check_keys(source: str, where: str, table, allowed: set[str]) -> None:
    """InputError unless `table` is a table whose keys are all in `allowed` (naming the closest allowed key)."""
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
    """A case's [cost] table: a preset, coefficients over it, and optional token knees."""
    check_keys(source, "cost", table, _COST_KEYS)
    values: dict[str, float] = {}
    if "preset" in table:
        name = table["preset"]
        if not isinstance(name, str) or name not in PRESETS:
            raise InputError(source, "cost.preset", f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        values = PRESETS[name].as_dict()
    for name in FEATURES:
        if name in table:
            problem = coefficient_problem(table[name], positive=name == "intercept")
            if problem:
                raise InputError(source, f"cost.{name}", problem)
            values[name] = float(table[name])
    if "intercept" not in values:
        raise InputError(source, "cost.intercept", "must be > 0 (set it or name a preset)")
    if "token_knees" in table or "per_token_above" in table:
        values.update(_parse_kinks(source, table))
    try:
        return CostModel(**values)
    except ValueError as exc:  # "cost.<field> <problem>"
        field, _, problem = str(exc).partition(" ")
        raise InputError(source, field, problem) from None


def _parse_kinks(source: str, table: dict) -> dict:
    """`token_knees = [256]` and `per_token_above = [2.1e-5]`: equally long arrays (docs/semantics.md)."""
    out = {}
    for key in ("token_knees", "per_token_above"):
        values = table.get(key)
        if not isinstance(values, list):
            raise InputError(source, f"cost.{key}", f"must be an array (with one entry per knee), got {values!r}")
        out[key] = tuple(positive_int(source, f"cost.{key}[{k}]", v) if key == "token_knees"
                         else nonneg_number(source, f"cost.{key}[{k}]", v) for k, v in enumerate(values))
    return out


def parse_system(source: str, table: dict) -> SystemConfig:
    """A case's [system] table."""
    check_keys(source, "system", table, _SYSTEM_KEYS)
    for key in ("kv_capacity", "max_batch_tokens"):
        if key not in table:
            raise InputError(source, f"system.{key}", "missing")
    vals = {k: positive_int(source, f"system.{k}", v) for k, v in table.items()}
    return SystemConfig(**vals)


def _parse_requests(source: str, entries) -> list[Request]:
    if not isinstance(entries, list):
        raise InputError(source, "requests", "must be an array of tables ([[requests]])")
    out: list[Request] = []
    if len(entries) > MAX_REQUESTS:
        raise InputError(source, "requests", f"{len(entries):,} entries; at most {MAX_REQUESTS:,} requests")
    for k, entry in enumerate(entries):
        where = f"requests[{k}]"
        check_keys(source, where, entry, _REQUEST_KEYS)
        for key in ("prompt", "output"):
            if key not in entry:
                raise InputError(source, f"{where}.{key}", "missing")
        prompt = positive_int(source, f"{where}.prompt", entry["prompt"], MAX_REQUEST_TOKENS)
        output = positive_int(source, f"{where}.output", entry["output"], MAX_REQUEST_TOKENS)
        count = positive_int(source, f"{where}.count", entry.get("count", 1), MAX_REQUESTS - len(out))
        arrival = nonneg_number(source, f"{where}.arrival", entry.get("arrival", 0.0), MAX_ARRIVAL)
        out.extend(Request(prompt, output, arrival) for _ in range(count))
    return out


def load_case(path: str | Path) -> Instance:
    """Read and validate a case file."""
    path = Path(path)
    return parse_case(read_toml(path), str(path), base_dir=path.parent)


#: largest TOML file read (a case with a million [[requests]] entries is about 60 MB)
MAX_TOML_BYTES = 256 << 20


#: a dotted key (`a.b.c = 1`, `[a.b.c]`) longer than MAX_NESTING parts is refused before parsing: tomllib's time
#: and memory grow with the square of its length (100,000 parts: tens of GB). A part is a bare or quoted key;
#: the patterns are possessive (no backtracking), so the search is linear in the file's length.
_KEY_PART = r"""(?:[A-Za-z0-9_-]++|"(?:[^"\\\n]|\\.)*+"|'[^'\n]*+')"""
_DOTTED_RUN = re.compile(rf"(?<![A-Za-z0-9_-]){_KEY_PART}(?:[ \t]*+\.[ \t]*+{_KEY_PART})*+")
_KEY_DOT = re.compile(r"[ \t]*+\.[ \t]*+")
_DOTTY_LINE = re.compile(rf"^(?:[^.\n]*+\.){{{MAX_NESTING}}}[^\n]*+", re.M)  # a line with that many dots


def _long_dotted_key(text: str) -> int | None:
    """The line of the first run of more than MAX_NESTING dot-separated key parts (a run inside a string
    value counts too: no case or spec has one), or None."""
    for line in _DOTTY_LINE.finditer(text):
        for run in _DOTTED_RUN.finditer(line.group()):
            key = run.group()
            if key.count(".") >= MAX_NESTING and len(_KEY_DOT.findall(re.sub(_KEY_PART, "k", key))) >= MAX_NESTING:
                return text.count("\n", 0, line.start()) + 1
    return None


def read_toml(path: str | Path) -> dict:
    """A TOML file's tables; an unreadable file or malformed TOML is bad input naming the file, and so are
    tables, arrays or dotted keys nested more than MAX_NESTING levels deep. A leading byte-order mark is
    dropped (`read_user_text`)."""
    source = str(path)
    text = read_user_text(path, MAX_TOML_BYTES)
    deep = f"malformed TOML: keys, tables or arrays nested more than {MAX_NESTING} levels deep"
    line = _long_dotted_key(text)
    if line is not None:
        raise InputError(source, "", f"{deep} (a dotted key of more than {MAX_NESTING} parts, line {line})")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, "", f"malformed TOML: {exc}") from None
    except RecursionError:
        raise InputError(source, "", deep) from None
    if nesting_problem(data):
        raise InputError(source, "", deep)
    return data


def load_cost_file(path: str | Path) -> CostModel:
    """The [cost] table of a TOML file (a `kvbound calibrate` output or a case file)."""
    data = read_toml(path)
    if not isinstance(data.get("cost"), dict):
        raise InputError(str(path), "cost", "missing section [cost]")
    return parse_cost(str(path), data["cost"])


def parse_case(data: dict, source: str = "<case>", base_dir: Path | None = None) -> Instance:
    """A case from its parsed TOML tables; a [workload] trace path is relative to `base_dir`."""
    check_keys(source, "", data, _TOP_KEYS)
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
    check_keys(source, "workload", table, _WORKLOAD_KEYS)
    if "trace" not in table:
        raise InputError(source, "workload.trace", "missing")
    trace = table["trace"]
    if not isinstance(trace, str):
        raise InputError(source, "workload.trace", f"must be a path string, got {trace!r}")
    limit = table.get("limit")
    if limit is not None:
        limit = positive_int(source, "workload.limit", limit, MAX_REQUESTS)
    offset = table.get("offset", 0)
    if not is_int(offset) or not 0 <= offset <= MAX_INT:
        raise InputError(source, "workload.offset", f"must be an integer >= 0 and < 2^53, got {offset!r}")
    time_scale = nonneg_number(source, "workload.time_scale", table.get("time_scale", 1.0), MAX_ARRIVAL)
    path = Path(trace)
    if not path.is_absolute():
        path = base_dir / path
    return load_trace(path, limit=limit, offset=offset, time_scale=time_scale)
