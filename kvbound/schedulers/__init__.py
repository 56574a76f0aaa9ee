"""Heuristic schedulers: the unified Algorithm 1 of the seed paper with named presets, and MC-SF / alpha-protection.

`get_scheduler("name")` or `get_scheduler("name:key=value,...")` returns a fresh policy;
`simulate(instance, policy)` runs it. Keys override the preset's parameters, e.g.
`sarathi:prefill_limit=256`, `fcfs-protect:alpha=0.3`, `vllm:hybrid=true`.
"""
from __future__ import annotations

import math
from dataclasses import fields

from ..errors import InputError
from .base import Policy, SimulationResult, simulate
from .jaillet import MCSF, FcfsProtect
from .unified import UnifiedParams, UnifiedScheduler
from .waves import SptWaves

U = UnifiedParams

# name: (parameters, one-line description with its source)
_UNIFIED: dict[str, tuple[UnifiedParams, str]] = {
    "vllm": (U(priority="prefill", hybrid=False, chunked=False),
             "vLLM: prefills first, no hybrid batches, no chunking, P = C; evicts the latest-arrived running request (seed paper Table 1)"),
    "vllm-hy": (U(priority="prefill", hybrid=True, chunked=False),
                "vLLM with hybrid batches: prefills first, then decodes in the same batch (Table 1)"),
    "sarathi": (U(priority="decode", hybrid=True, chunked=True, prefill_limit=512),
                "Sarathi-Serve: decodes first, hybrid batches, chunked prefill with P = 512 (Table 1)"),
    "sarathi-pc": (U(priority="decode", hybrid=True, chunked=True),
                   "Sarathi with P = C (Table 1: SARATHI_P=C)"),
    "sarathi-nocp": (U(priority="decode", hybrid=True, chunked=False),
                     "Sarathi without chunked prefill, P = C (Table 1)"),
    "sarathi-nohy": (U(priority="decode", hybrid=False, chunked=False),
                     "Sarathi without hybrid batches or chunking, P = C (Table 1)"),
    "rank-i": (U(priority="rank-i", hybrid=True, chunked=True),
               "one group ordered by prompt length, shortest first; hybrid, chunked, P = C (seed paper Section 4.6, Rank_I)"),
    "rank-o": (U(priority="rank-o", hybrid=True, chunked=True),
               "one group ordered by output length, shortest first (hypothetical: knows O); hybrid, chunked, P = C (Section 4.6, Rank_O)"),
    "evict-short": (U(priority="decode", hybrid=True, chunked=True, prefill_limit=512,
                      decode_order="longest-first", victim="shortest"),
                    "Sarathi grouping, running decodes with more cached tokens first, evicts the shortest when memory is short (Section 6)"),
    "mcsf-pc": (U(priority="decode", hybrid=True, chunked=True, reserve="future", admit_order="output"),
                "MC-SF with chunked prefill: decodes first, then admits shortest output first while the running set's "
                "projected KV fits in M at every future batch; P = C (hypothetical: knows O)"),
    "sarathi-pc-mc": (U(priority="decode", hybrid=True, chunked=True, reserve="future"),
                      "Sarathi-PC with MC-SF's admission test: first come first served while the running set's "
                      "projected KV fits in M at every future batch (hypothetical: knows O)"),
    "sjf-mc": (U(priority="decode", hybrid=True, chunked=True, reserve="future", admit_order="work"),
               "shortest job (I + O) first with MC-SF's admission test; decodes first, chunked, P = C (hypothetical: knows O)"),
}
for _base in ("vllm", "vllm-hy", "sarathi", "sarathi-pc", "sarathi-nocp", "sarathi-nohy"):
    _params, _desc = _UNIFIED[_base]
    _UNIFIED[_base + "-ef"] = (
        U(**{**_params.__dict__, "reserve": "peak"}),
        f"eviction-free {_base}: reserves I + O - 1 at admission, never evicts (hypothetical: knows O; Section 4.1)",
    )

_OTHER: dict[str, tuple[type, str]] = {
    "mcsf": (MCSF, "MC-SF: keep running requests, admit shortest output first while the future peak KV fits; never evicts (Jaillet et al. Alg. 2)"),
    "fcfs-protect": (FcfsProtect, "alpha-protection greedy: FCFS admission under (1 - alpha) M, clears all running requests on overflow; alpha = 0.2 (Jaillet et al. Sec. 7)"),
    "spt-waves": (SptWaves, "shortest I + O first in waves that fit M and run alone (no hybrid mixing across waves), cut by "
                            "dynamic programming for the least mean latency; never evicts (hypothetical: knows O)"),
}

SCHEDULERS: dict[str, str] = {name: desc for name, (_, desc) in _UNIFIED.items()}
SCHEDULERS.update({name: desc for name, (_, desc) in _OTHER.items()})

#: the fast heuristics a solver warm-starts from by default (each is cheap on small cases)
FAST_HEURISTICS = ("vllm", "vllm-ef", "sarathi-pc", "sarathi-pc-ef", "sarathi", "sarathi-ef", "rank-i", "evict-short", "mcsf",
                   "mcsf-pc", "sarathi-pc-mc", "sjf-mc", "spt-waves")


def _bad_option(where: str, problem: str) -> InputError:
    """A bad scheduler name or option: named by the field `scheduler` (the CLI shows its flag)."""
    return InputError("", "scheduler", f"{where}: {problem}")


def _parse_value(spec: str, key: str, text: str, kind):
    if kind is bool:
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
        raise _bad_option(f"{spec}: {key}", f"expected true or false, got {text!r}")
    if kind is int:
        if text.lower() == "none":
            return None
        try:
            value = float(text) if any(ch in text.lower() for ch in ".e") else int(text)
        except ValueError:
            raise _bad_option(f"{spec}: {key}", f"expected an integer, got {text!r}") from None
        if not (math.isfinite(value) and value == int(value) and abs(value) < 2 ** 53):
            raise _bad_option(f"{spec}: {key}", f"expected an integer below 2^53, got {text!r}")
        return int(value)
    if kind is float:
        try:
            value = float(text)
        except ValueError:
            raise _bad_option(f"{spec}: {key}", f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise _bad_option(f"{spec}: {key}", f"expected a finite number, got {text!r}")
        return value
    return text


def get_scheduler(spec: str) -> Policy:
    """A fresh policy from `name` or `name:key=value,...`."""
    name, _, options = spec.partition(":")
    overrides = {}
    if options:
        for part in options.split(","):
            key, eq, value = part.partition("=")
            if not eq:
                raise _bad_option(spec, f"option {part!r} is not key=value")
            overrides[key.strip()] = value.strip()
    if name in _UNIFIED:
        params, _ = _UNIFIED[name]
        kinds = {"hybrid": bool, "chunked": bool, "prefill_limit": int}
        allowed = {f.name for f in fields(UnifiedParams)}
        values = {}
        for key, text in overrides.items():
            if key not in allowed:
                raise _bad_option(f"{spec}: {key}", f"unknown option; allowed: {', '.join(sorted(allowed))}")
            values[key] = _parse_value(spec, key, text, kinds.get(key, str))
        try:
            params = UnifiedParams(**{**params.__dict__, **values})
        except ValueError as exc:
            raise _bad_option(spec, str(exc)) from None
        label = spec if overrides else name
        return UnifiedScheduler(label, params)
    if name in _OTHER:
        cls, _ = _OTHER[name]
        if name == "fcfs-protect":
            unknown = set(overrides) - {"alpha"}
            if unknown:
                raise _bad_option(f"{spec}: {sorted(unknown)[0]}", "unknown option; allowed: alpha")
            try:
                policy = cls(**{k: _parse_value(spec, k, v, float) for k, v in overrides.items()})
            except ValueError as exc:
                raise _bad_option(spec, str(exc)) from None
        else:
            if overrides:
                raise _bad_option(spec, f"{name} takes no options")
            policy = cls()
        policy.name = spec if overrides else name
        return policy
    import difflib

    hint = difflib.get_close_matches(name, list(SCHEDULERS), n=1)
    raise _bad_option(name, "unknown scheduler" + (f" (did you mean '{hint[0]}'?)" if hint else "")
                     + "; `kvbound schedulers` lists them")


def run_scheduler(instance, spec: str) -> SimulationResult:
    return simulate(instance, get_scheduler(spec))


__all__ = ["SCHEDULERS", "FAST_HEURISTICS", "get_scheduler", "run_scheduler", "simulate", "Policy",
           "SimulationResult", "UnifiedParams", "UnifiedScheduler", "MCSF", "FcfsProtect", "SptWaves"]
