"""Heuristic schedulers: the unified Algorithm 1 of the seed paper with named presets, and MC-SF / alpha-protection.

`get_scheduler("name")` or `get_scheduler("name:key=value,...")` returns a fresh policy;
`simulate(instance, policy)` runs it. Keys override the preset's parameters, e.g.
`sarathi:prefill_limit=256`, `fcfs-protect:alpha=0.3`, `vllm:hybrid=true`.
"""
from __future__ import annotations

import math
from dataclasses import fields

from ..errors import InputError
from .aptserve import AptGreedy
from .base import Policy, SimulationResult, simulate
from .jaillet import MCSF, FcfsProtect
from .kossmann import ENGINE as ENGINE_003
from .kossmann import Larry, Trail
from .srpt import PARAMS as SRPT_PARAMS
from .srpt import Srpt
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
#: vLLM V1's defaults for its own knobs: EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py) gives
#: max_num_seqs = 256 and max_num_batched_tokens = 8192 for the LLM class on GPUs below 70 GiB or A100s
#: (kvbound's default cost preset is an A100); the OpenAI server there uses 2048 tokens, and on H100-class
#: GPUs 8192 (server) / 16384 (LLM class) with 1024 sequences. Override with vllm-v1:max_num_batched_tokens=...
VLLM_V1_MAX_NUM_SEQS, VLLM_V1_MAX_NUM_BATCHED_TOKENS = 256, 8192
_UNIFIED.update({
    # seed paper 003 (Kossmann et al.) Section 2's baselines, on its chunked decode-first engine
    "fcfs": (U(priority="decode", hybrid=True, chunked=True),
             "FCFS (Kossmann et al. Sec. 2): decodes first, then waiting requests first come first served, chunked, "
             "P = C, preempts the latest-arrived running request; the same as sarathi-pc; the paper's concurrency "
             "limit is fcfs:max_running=K"),
    "no-preempt": (U(priority="decode", hybrid=True, chunked=True, reserve="peak"),
                   "No-Preempt (Kossmann et al. Sec. 2): FCFS that reserves I + O - 1 at dispatch and never preempts; "
                   "chunked, P = C; the same as sarathi-pc-ef (hypothetical: knows O)"),
    "vllm-v1": (U(priority="running", hybrid=True, chunked=True, reserve="chunk", max_running=VLLM_V1_MAX_NUM_SEQS,
                  token_limit=VLLM_V1_MAX_NUM_BATCHED_TOKENS, admit_after_evict=False),
                "vLLM V1 (vllm/v1/core/sched/scheduler.py): running requests first in arrival order, then waiting ones "
                "FCFS; every prefill chunked to the token budget min(C, max_num_batched_tokens = 8192); at most "
                "max_num_seqs = 256 running; KV allocated per chunk; when blocks run out the latest-arrived running "
                "request is preempted (recompute) and nothing is admitted in that step"),
})
#: unified presets run by a subclass, with its own options (name -> (class, {option: default}))
_SUBCLASSED: dict[str, tuple[type, dict[str, float]]] = {"larry": (Larry, {"alpha": 1.0}), "trail": (Trail, {"c": 0.0}),
                                                          "srpt": (Srpt, {"ratio": 1.0})}
_UNIFIED.update({
    "larry": (ENGINE_003,
              "LARRY (Kossmann et al. Sec. 4.1): decodes first, chunked, P = C; waiting requests by score = queue length "
              "x prompt KV (tokens) - alpha x waiting time (s), lowest first, dispatched while the KV fits and the batch "
              "has room; alpha = 1"),
    "trail": (ENGINE_003,
              "TRAIL+ (Kossmann et al. Sec. 2): shortest remaining output O - n first (true lengths; hypothetical: knows "
              "O), running and waiting; decodes first, chunked, P = C; preempts for a shorter waiting request only while "
              "n / O < c (c = 0: never)"),
    "srpt": (SRPT_PARAMS,
             "shortest remaining time alone first (intercepts + work; hypothetical: knows O), running and waiting; "
             "decodes always join a batch, a lower-priority prefill chunk only while the delay it causes the requests "
             "ahead is at most ratio x what leaving it out costs (its wait for them, and the intercepts of its own "
             "batches for the rest); ratio = 1, larger mixes more; chunked, P = C"),
})
#: option names that are another name of a UnifiedParams field, per preset
_ALIASES = {"vllm-v1": {"max_num_seqs": "max_running", "max_num_batched_tokens": "token_limit"}}

_OTHER: dict[str, tuple[type, str]] = {
    "mcsf": (MCSF, "MC-SF: keep running requests, admit shortest output first while the future peak KV fits; never evicts (Jaillet et al. Alg. 2)"),
    "fcfs-protect": (FcfsProtect, "alpha-protection greedy: FCFS admission under (1 - alpha) M, clears all running requests on overflow; alpha = 0.2 (Jaillet et al. Sec. 7)"),
    "spt-waves": (SptWaves, "shortest I + O first in waves that fit M and run alone (no hybrid mixing across waves), cut by "
                            "dynamic programming for the least mean latency; never evicts (hypothetical: knows O)"),
    "apt-greedy": (AptGreedy, "Apt-Serve (Gao et al. Sec. 5) with KV cache only (beta = 0; its hidden cache is not modelled): "
                              "prefill or decode iteration by the larger summed pending time, requests greedily by pending "
                              "time per unit of KV under the memory left; no chunking, P = C; decode iterations preempt "
                              "the lowest-ratio idle requests when M runs out"),
}

SCHEDULERS: dict[str, str] = {name: desc for name, (_, desc) in _UNIFIED.items()}
SCHEDULERS.update({name: desc for name, (_, desc) in _OTHER.items()})

#: the fast heuristics a solver warm-starts from by default (each is cheap on small cases); sjf-mc
#: with its prefill chunks cut to 512 or 1,024 tokens keeps the batches that decodes share short,
#: which wins on prefill-heavy traces (Splitwise code all at 0: 2.9-8.5% below the rest on 4 of the 6
#: cases of 30-300 requests; bench/results/NOTES.md)
FAST_HEURISTICS = ("vllm", "vllm-ef", "sarathi-pc", "sarathi-pc-ef", "sarathi", "sarathi-ef", "rank-i", "evict-short", "mcsf",
                   "mcsf-pc", "sarathi-pc-mc", "sjf-mc", "spt-waves", "srpt", "srpt:ratio=2", "sjf-mc:prefill_limit=512",
                   "sjf-mc:prefill_limit=1024")


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
        kinds = {"hybrid": bool, "chunked": bool, "prefill_limit": int, "max_running": int, "token_limit": int,
                 "admit_after_evict": bool}
        aliases = _ALIASES.get(name, {})
        cls, extra = _SUBCLASSED.get(name, (UnifiedScheduler, {}))
        allowed = {f.name for f in fields(UnifiedParams)} | set(aliases) | set(extra)
        values, extras = {}, {}
        for key, text in overrides.items():
            if key not in allowed:
                raise _bad_option(f"{spec}: {key}", f"unknown option; allowed: {', '.join(sorted(allowed))}")
            if key in extra:
                extras[key] = _parse_value(spec, key, text, float)
                continue
            field = aliases.get(key, key)
            values[field] = _parse_value(spec, key, text, kinds.get(field, str))
        try:
            params = UnifiedParams(**{**params.__dict__, **values})
            label = spec if overrides else name
            return cls(label, params, **extras) if extra else UnifiedScheduler(label, params)
        except ValueError as exc:
            raise _bad_option(spec, str(exc)) from None
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
           "SimulationResult", "UnifiedParams", "UnifiedScheduler", "MCSF", "FcfsProtect", "SptWaves", "Larry", "Trail",
           "AptGreedy", "Srpt"]
