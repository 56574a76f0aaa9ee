"""Schedule files: the JSON form of a `Schedule` (`Schedule.to_json`) read back with checks, and written.

Every problem with one is raised as `InputError(file, field, problem)`; whether a well-formed
schedule obeys the semantics is `kvbound.schedule.validate`'s question, not this module's.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..errors import InputError
from ..fileio import read_user_json, repeated_keys, write_json_atomic
from ..schedule import Batch, Schedule
from ..workload import Request


def schedule_from_json(data, source: str = "<schedule>") -> Schedule:
    """A schedule from its JSON form (the object `Schedule.to_json` makes)."""
    if not isinstance(data, dict):
        raise InputError(source, "", "a schedule must be a JSON object")
    repeated_keys(source, "", data)
    for key in data:
        if key not in ("requests", "batches"):
            raise InputError(source, key, "unknown key; allowed: requests, batches")
    requests = []
    for k, where, r in _json_objects(source, data, "requests"):
        repeated_keys(source, where, r)
        if r.get("id", k) != k:
            raise InputError(source, f"{where}.id", f"must be {k} (ids are 0-based positions)")
        for key in ("prompt", "output"):
            v = r.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(source, f"{where}.{key}", f"must be an integer >= 1, got {v!r}")
        a = r.get("arrival", 0.0)
        if not isinstance(a, (int, float)) or isinstance(a, bool) or not math.isfinite(a) or a < 0:
            raise InputError(source, f"{where}.arrival", f"must be a finite number >= 0, got {a!r}")
        requests.append(Request(r["prompt"], r["output"], float(a)))
    batches = []
    for _, where, b in _json_objects(source, data, "batches"):
        repeated_keys(source, where, b)
        for key in b:
            if key not in ("start", "tokens", "evict"):
                raise InputError(source, f"{where}.{key}", "unknown key; allowed: start, tokens, evict")
        start = b.get("start")
        if start is not None and (not isinstance(start, (int, float)) or isinstance(start, bool)
                                  or not math.isfinite(start) or start < 0):
            raise InputError(source, f"{where}.start", f"must be a finite number >= 0, got {start!r}")
        tokens_raw = b.get("tokens", {})
        if not isinstance(tokens_raw, dict):
            raise InputError(source, f"{where}.tokens", "must be an object {\"<id>\": tokens}")
        repeated_keys(source, f"{where}.tokens", tokens_raw, "request id")  # {"1": 1, "1": 3}
        tokens = _plain_tokens(tokens_raw)
        if tokens is None:  # something is wrong: `_checked_tokens` says what
            tokens = _checked_tokens(source, where, tokens_raw)
        evict = b.get("evict", [])
        if not isinstance(evict, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in evict):
            raise InputError(source, f"{where}.evict", "must be a list of request ids")
        if len(set(evict)) != len(evict):
            twice = sorted({i for i in evict if evict.count(i) > 1})
            raise InputError(source, f"{where}.evict", f"request id {', '.join(map(str, twice))} listed more than once")
        batches.append(Batch(tokens, tuple(evict), None if start is None else float(start)))
    return Schedule(tuple(requests), batches)


def _plain_tokens(tokens_raw: dict) -> dict[int, int] | None:
    """{id: tokens} when every key reads as a distinct integer and every value is an integer (the
    common case, one pass); None otherwise (`_checked_tokens` then names the problem)."""
    try:
        tokens = {int(key): c for key, c in tokens_raw.items()}
    except ValueError:
        return None
    if len(tokens) != len(tokens_raw) or not all(type(c) is int for c in tokens.values()):
        return None
    return tokens


def _checked_tokens(source: str, where: str, tokens_raw: dict) -> dict[int, int]:
    """{id: tokens}, or bad input naming the first key or value that is not an integer or repeats an id."""
    tokens, named = {}, {}
    for key, c in tokens_raw.items():
        try:
            i = int(key)
        except ValueError:
            raise InputError(source, f"{where}.tokens", f"request id {key!r} is not an integer") from None
        if i in named:  # "01" beside "1"
            raise InputError(source, f"{where}.tokens", f"request id {i} given more than once "
                                                        f"({named[i]!r} and {key!r})")
        named[i] = key
        if not isinstance(c, int) or isinstance(c, bool):
            raise InputError(source, f"{where}.tokens.{key}", f"must be an integer, got {c!r}")
        tokens[i] = c
    return tokens


def load_schedule(path: str | Path) -> Schedule:
    """Read a schedule JSON file; unreadable or malformed input is bad input naming the file."""
    path = Path(path)
    return schedule_from_json(read_user_json(path), str(path))  # malformed or too deeply nested: bad input


def dump_schedule(schedule: Schedule, path: str | Path) -> None:
    """Write `schedule` as JSON, atomically (a reader never sees half a file)."""
    write_json_atomic(path, schedule.json_form())


def _json_objects(source: str, data: dict, key: str):
    """(position, location for messages, object) of each entry of the list `data[key]`."""
    entries = data.get(key)
    if not isinstance(entries, list):
        raise InputError(source, key, "missing or not a list")
    for k, entry in enumerate(entries):
        where = f"{key}[{k}]"
        if not isinstance(entry, dict):
            raise InputError(source, where, "must be an object")
        yield k, where, entry
