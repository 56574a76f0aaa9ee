"""The seed paper's precomputed-schedule form, for replaying kvbound schedules on its modified vLLM.

The paper's engine replays a schedule given per batch j as the tokens c_{i,j} each request
processes, the set p of requests whose tokens are prefill-type (first prefills, chunks and
refills: they take the prefill attention path) and the set e of requests evicted before the
batch runs, plus [I, O] per request. As JSON (docs/interop.md):

    {"requests": [[16, 4], [16, 4]],
     "arrivals": [0.0, 0.5],                      optional: only when a request arrives after 0
     "batches": [{"c": [16, 16], "p": [0, 1], "e": []},
                 {"c": [1, 0], "p": [], "e": [1], "start": 0.7}, ...]}

`c` has one entry per request (0: the request does not run in that batch); `start` is
written only where a batch waits for an arrival (an idle jump), so that the replayed time
line is the same. `p` is implied by the semantics; the importer checks it instead of
trusting it.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..errors import InputError
from ..fileio import read_user_json, repeated_keys, write_user_json
from ..io.schedules import load_schedule
from ..schedule import Batch, Schedule, ScheduleError
from ..workload import Instance
from .roles import schedule_roles

_TOP_KEYS = ("requests", "arrivals", "batches")
_BATCH_KEYS = ("c", "p", "e", "start")


def to_precomputed(instance: Instance, schedule: Schedule) -> dict:
    """The paper's form of a valid schedule (raises ScheduleError if it is not valid)."""
    sr = schedule_roles(instance, schedule)
    n = len(instance)
    starts, ends = sr.replay.batch_start, sr.replay.batch_end
    batches = []
    for j, batch in enumerate(schedule.batches):
        c = [0] * n
        for i, tokens in batch.tokens.items():
            c[i] = tokens
        out = {"c": c, "p": sr.prefill_set(j), "e": sorted(batch.evict)}
        previous_end = ends[j - 1] if j else 0.0
        if starts[j] > previous_end:  # the batch waits for an arrival: keep the jump
            out["start"] = float(starts[j])
        batches.append(out)
    data = {"requests": [[r.prompt, r.output] for r in instance.requests]}
    if not instance.offline:
        data["arrivals"] = [r.arrival for r in instance.requests]
    data["batches"] = batches
    return data


def from_precomputed(instance: Instance, data, source: str = "<precomputed>") -> Schedule:
    """A kvbound schedule from the paper's form, checked against `instance` and validated.

    Shape problems are InputError (bad input, naming the field); a schedule that breaks the
    semantics, or whose `p` disagrees with it, is ScheduleError.
    """
    if not isinstance(data, dict):
        raise InputError(source, "", "must be a JSON object with requests and batches")
    repeated_keys(source, "", data)
    for key in data:
        if key not in _TOP_KEYS:
            raise InputError(source, key, f"unknown key; allowed: {', '.join(_TOP_KEYS)}")
    n = len(instance)
    reqs = data.get("requests")
    if not isinstance(reqs, list):
        raise InputError(source, "requests", "missing or not a list of [I, O] pairs")
    if len(reqs) != n:
        raise InputError(source, "requests", f"lists {len(reqs)} requests, the case has {n}")
    for i, (pair, r) in enumerate(zip(reqs, instance.requests)):
        if not (isinstance(pair, list) and len(pair) == 2 and all(_is_int(v) for v in pair)):
            raise InputError(source, f"requests[{i}]", f"must be [I, O] (two integers), got {pair!r}")
        if tuple(pair) != (r.prompt, r.output):
            raise InputError(source, f"requests[{i}]", f"is {pair}, the case has [{r.prompt}, {r.output}]")
    arrivals = data.get("arrivals")
    if arrivals is not None:
        if not (isinstance(arrivals, list) and len(arrivals) == n and all(_is_number(a) for a in arrivals)):
            raise InputError(source, "arrivals", f"must be a list of {n} numbers")
        for i, (a, r) in enumerate(zip(arrivals, instance.requests)):
            if abs(a - r.arrival) > 1e-9 * (1 + r.arrival):
                raise InputError(source, f"arrivals[{i}]", f"is {a}, the case has {r.arrival}")
    raw = data.get("batches")
    if not isinstance(raw, list):
        raise InputError(source, "batches", "missing or not a list")
    batches, claimed_p = [], []
    for j, b in enumerate(raw):
        where = f"batches[{j}]"
        if not isinstance(b, dict):
            raise InputError(source, where, "must be an object with c, p and e")
        repeated_keys(source, where, b)
        for key in b:
            if key not in _BATCH_KEYS:
                raise InputError(source, f"{where}.{key}", f"unknown key; allowed: {', '.join(_BATCH_KEYS)}")
        tokens = _tokens(source, f"{where}.c", b.get("c"), n)
        p = _id_list(source, f"{where}.p", b.get("p", []))
        evict = _id_list(source, f"{where}.e", b.get("e", []))
        start = b.get("start")
        if start is not None and not (_is_number(start) and start >= 0):
            raise InputError(source, f"{where}.start", f"must be a finite number >= 0, got {start!r}")
        batches.append(Batch(tokens, tuple(evict), None if start is None else float(start)))
        claimed_p.append(sorted(set(p)))
    schedule = Schedule(instance.requests, batches)
    sr = schedule_roles(instance, schedule)  # raises ScheduleError at the first broken rule
    for j, p in enumerate(claimed_p):
        actual = sr.prefill_set(j)
        if p != actual:
            wrong = sorted(set(p).symmetric_difference(actual))[0]
            kind = "prefill-type" if wrong in actual else ("decode-type" if wrong in schedule.batches[j].tokens
                                                          else "not processed")
            raise ScheduleError(j, wrong, f"p says {'not ' if wrong in actual else ''}prefill, "
                                          f"but under the semantics it is {kind} in this batch")
    return schedule


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _tokens(source: str, where: str, c, n: int) -> dict[int, int]:
    """`c` as a list of n counts (0: idle) or, for sparse files, an object {"id": count}."""
    if isinstance(c, list):
        if len(c) != n or not all(_is_int(v) and v >= 0 for v in c):
            raise InputError(source, where, f"must list {n} integers >= 0 (one per request)")
        return {i: v for i, v in enumerate(c) if v}
    if isinstance(c, dict):
        repeated_keys(source, where, c, "request id")
        out, named = {}, {}
        for key, v in c.items():
            try:
                i = int(key)
            except ValueError:
                raise InputError(source, where, f"request id {key!r} is not an integer") from None
            if i in named:
                raise InputError(source, where, f"request id {i} given more than once ({named[i]!r} and {key!r})")
            named[i] = key
            if not _is_int(v) or v < 0:
                raise InputError(source, f"{where}.{key}", f"must be an integer >= 0, got {v!r}")
            if v:
                out[i] = v
        return out
    raise InputError(source, where, "missing: give a list of tokens per request")


def _id_list(source: str, where: str, ids) -> list[int]:
    if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
        raise InputError(source, where, "must be a list of request ids")
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise InputError(source, where, f"request id {', '.join(map(str, twice))} listed more than once")
    return ids


def export_precomputed(instance: Instance, schedule_path: str | Path, out: str | Path) -> dict:
    """Read a schedule JSON, validate it on `instance` and write the paper's form to `out`."""
    data = to_precomputed(instance, load_schedule(schedule_path))
    write_user_json(out, data)  # a failed write (a full disk) is bad input naming the file
    return data


def import_precomputed(instance: Instance, path: str | Path, out: str | Path | None = None) -> Schedule:
    """Read the paper's form, validate it on `instance` and (optionally) write kvbound's schedule JSON."""
    path = Path(path)
    data = read_user_json(path)  # malformed, too deeply nested: bad input
    schedule = from_precomputed(instance, data, str(path))  # validated there
    if out is not None:
        write_user_json(out, schedule.json_form())
    return schedule
