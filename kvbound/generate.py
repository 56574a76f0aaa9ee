"""Synthetic workloads: seeded, trace-like request sets written as case files.

`generate_requests` draws prompt and output lengths from lognormal distributions fitted
to the Splitwise conversation trace (constants below) and, optionally, Poisson arrivals;
`generate_case_text` turns them into a case file (the TOML contract of docs/semantics.md,
one `[[requests]]` entry per request) whose description records the command that wrote
it, so a shipped sample can be regenerated and checked byte for byte. The shipped
families of the seed paper (Figure 15, Section 4.6) are built here too, so that the
files under `cases/` are code output, not hand edits: `python -m kvbound.generate
--shipped cases` rewrites them.

Everything is deterministic for a seed: numpy's `default_rng` (PCG64) streams are
stable, and numbers are written with fixed formatting.
"""
from __future__ import annotations

import itertools
import json
import math
import shlex
from pathlib import Path

import numpy as np

from .costs import PRESETS
from .costs.presets import DEFAULT_PRESET
from .errors import InputError
from .fileio import write_user_file
from .workload import MAX_ARRIVAL, MAX_INT, MAX_REQUESTS, Request

# --------------------------------------------------------------------------- trace fit
# Fitted to ../shared/data/traces/splitwise_conv.csv (19,366 requests; columns
# arrived_at,num_prefill_tokens,num_decode_tokens) by maximum likelihood for a lognormal,
# i.e. mean and population standard deviation of the natural log of each column:
#     x = np.loadtxt(path, delimiter=",", skiprows=1); np.log(x[:, 1]).mean(), np.log(x[:, 1]).std()
# The trace itself is multi-modal (clusters near 1k and 4k prompt tokens, ~450 output
# tokens); the lognormal matches its location and spread, not its modes.
PROMPT_LOG_MU = 6.6333  # ln prompt tokens: mean
PROMPT_LOG_SIGMA = 0.9852  # ln prompt tokens: standard deviation
OUTPUT_LOG_MU = 5.0190  # ln output tokens: mean
OUTPUT_LOG_SIGMA = 0.8590  # ln output tokens: standard deviation
# The trace's own summary statistics, for comparison (same file):
TRACE_PROMPT_MEAN = 1154.7  # tokens (median 1020, min 2, max 14050)
TRACE_OUTPUT_MEAN = 211.1  # tokens (median 129, min 7, max 1000)
TRACE_PROMPT_MAX = 14050
TRACE_OUTPUT_MAX = 1000
TRACE_RATE = 5.5304  # requests per second: 19,366 requests over 3,501.72 s (inter-arrival CV 1.09, close to Poisson's 1)

# Defaults of `kvbound generate`.
DEFAULT_KV_CAPACITY = 100_000  # tokens: about the KV room of Llama-2-7B on one 80 GB GPU (0.5 MiB per token)
DEFAULT_MAX_BATCH_TOKENS = 4096
DEFAULT_CONTEXT = 4096  # Llama-2's context window: prompt + output <= context (the presets model Llama-2-7B)


def max_prompt(kv_capacity: int, context: int = DEFAULT_CONTEXT) -> int:
    """Prompts are clipped to [1, max_prompt]: within the trace's range, the context and M."""
    return min(TRACE_PROMPT_MAX, context - 1, kv_capacity)


def max_output(prompt, kv_capacity: int, context: int = DEFAULT_CONTEXT):
    """Outputs are clipped to [1, max_output(I)]: prompt + output <= context and peak KV I + O - 1 <= M.

    Works elementwise on arrays of prompts.
    """
    return np.minimum(np.minimum(TRACE_OUTPUT_MAX, context - prompt), kv_capacity - prompt + 1)


#: Poisson rates `generate` takes, requests per second: the arrivals of a million requests at the
#: lowest rate stay below the case files' MAX_ARRIVAL (with room for the Poisson tail)
MIN_RATE = 1e-2
MAX_RATE = 1e9


def _check_options(requests: int, seed: int, rate: float | None, kv_capacity: int, max_batch_tokens: int,
                   context: int, preset: str) -> None:
    def positive_int(field, value, least=1):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise InputError("", field, f"must be an integer >= {least}, got {value!r}")

    def at_most(field, value, most, why=""):
        if value > most:
            raise InputError("", field, f"must be <= {most:,}{why}, got {value:,}")

    positive_int("requests", requests)
    at_most("requests", requests, MAX_REQUESTS)
    positive_int("seed", seed, 0)
    at_most("seed", seed, 2 ** 32 - 1, " (numpy's seed range)")
    positive_int("kv_capacity", kv_capacity)
    positive_int("max_batch_tokens", max_batch_tokens)
    positive_int("context", context, 2)
    for field, value in (("kv_capacity", kv_capacity), ("max_batch_tokens", max_batch_tokens), ("context", context)):
        at_most(field, value, MAX_INT, " (integers must stay below 2^53)")
    if rate is not None and (not isinstance(rate, (int, float)) or isinstance(rate, bool)
                             or not math.isfinite(rate) or rate <= 0):
        raise InputError("", "rate", f"must be a finite number > 0 (requests per second), got {rate!r}")
    if rate is not None and not MIN_RATE <= rate <= MAX_RATE:
        raise InputError("", "rate", f"must be between {MIN_RATE:g} and {MAX_RATE:g} requests per second "
                                     f"(arrivals must stay below {MAX_ARRIVAL:g} s), got {rate:g}")
    if preset not in PRESETS:
        raise InputError("", "preset", f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")


def generate_requests(requests: int, seed: int, *, rate: float | None = None,
                      kv_capacity: int = DEFAULT_KV_CAPACITY, context: int = DEFAULT_CONTEXT) -> list[Request]:
    """`requests` trace-like requests; offline (all arrive at 0) unless `rate` (per second) is given.

    With a rate, arrivals are a Poisson process shifted so that the first request arrives
    at 0 (as the trace loader does), rounded to microseconds.
    """
    _check_options(requests, seed, rate, kv_capacity, DEFAULT_MAX_BATCH_TOKENS, context, DEFAULT_PRESET)
    rng = np.random.default_rng(seed)
    prompt_raw = rng.lognormal(PROMPT_LOG_MU, PROMPT_LOG_SIGMA, requests)
    output_raw = rng.lognormal(OUTPUT_LOG_MU, OUTPUT_LOG_SIGMA, requests)
    prompts = np.clip(np.rint(prompt_raw), 1, max_prompt(kv_capacity, context)).astype(np.int64)
    outputs = np.clip(np.rint(output_raw), 1, max_output(prompts, kv_capacity, context)).astype(np.int64)
    if rate is None:
        arrivals = np.zeros(requests)
    else:
        gaps = rng.exponential(1.0 / rate, requests)
        gaps[0] = 0.0
        arrivals = np.round(np.cumsum(gaps), 6)
    return [Request(int(p), int(o), float(a)) for p, o, a in zip(prompts, outputs, arrivals)]


# --------------------------------------------------------------------------- TOML text

def _toml_string(text: str) -> str:
    # JSON string escapes (\" \\ \n \t \uXXXX ...) are valid TOML basic-string escapes
    return json.dumps(text, ensure_ascii=False)


def case_text(requests: list[Request], *, name: str, description: str, kv_capacity: int, max_batch_tokens: int,
              preset: str = DEFAULT_PRESET, cost: dict[str, float] | None = None, counts: list[int] | None = None,
              arrivals: bool | None = None) -> str:
    """A case file: name, description, [system], [cost] preset (or explicit `cost` terms), one [[requests]] each.

    `counts` (one per entry) writes `count = k`; arrivals are written when any is non-zero
    (or when `arrivals` is True), with six decimals.
    """
    if arrivals is None:
        arrivals = any(r.arrival for r in requests)
    lines = [f"name = {_toml_string(name)}", f"description = {_toml_string(description)}", "",
             "[system]", f"kv_capacity = {kv_capacity}", f"max_batch_tokens = {max_batch_tokens}", "", "[cost]"]
    if cost is None:
        lines.append(f"preset = {_toml_string(preset)}")
    else:
        lines.extend(f"{k} = {v!r}" for k, v in cost.items())
    for k, r in enumerate(requests):
        lines += ["", "[[requests]]", f"prompt = {r.prompt}", f"output = {r.output}"]
        if counts is not None and counts[k] != 1:
            lines.append(f"count = {counts[k]}")
        if arrivals:
            lines.append(f"arrival = {r.arrival:.6f}")
    return "\n".join(lines) + "\n"


def generate_command(requests: int, seed: int, *, rate: float | None = None, kv_capacity: int = DEFAULT_KV_CAPACITY,
                     max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, preset: str = DEFAULT_PRESET,
                     context: int = DEFAULT_CONTEXT, name: str | None = None, out: str | None = None) -> str:
    """The `kvbound generate` command line that reproduces these options (all of them spelt out)."""
    argv = ["kvbound", "generate", "--requests", str(requests), "--seed", str(seed)]
    if rate is not None:
        argv += ["--rate", repr(float(rate))]
    argv += ["--kv-capacity", str(kv_capacity), "--max-batch-tokens", str(max_batch_tokens),
             "--preset", preset, "--context", str(context)]
    if name is not None:
        argv += ["--name", name]
    if out is not None:
        argv += ["--out", out]
    return shlex.join(argv)


def generate_case_text(requests: int, seed: int, *, rate: float | None = None, kv_capacity: int = DEFAULT_KV_CAPACITY,
                       max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, preset: str = DEFAULT_PRESET,
                       context: int = DEFAULT_CONTEXT, name: str | None = None, out: str | None = None) -> str:
    """The case file `kvbound generate` writes for these options."""
    _check_options(requests, seed, rate, kv_capacity, max_batch_tokens, context, preset)
    reqs = generate_requests(requests, seed, rate=rate, kv_capacity=kv_capacity, context=context)
    command = generate_command(requests, seed, rate=rate, kv_capacity=kv_capacity, max_batch_tokens=max_batch_tokens,
                               preset=preset, context=context, name=name, out=out)
    arrivals = "offline (every request arrives at 0)" if rate is None else f"Poisson arrivals at {rate:g} requests/s"
    description = (f"{requests} synthetic requests with trace-like lengths: lognormal prompt (ln-mean {PROMPT_LOG_MU}, "
                   f"ln-sd {PROMPT_LOG_SIGMA}) and output (ln-mean {OUTPUT_LOG_MU}, ln-sd {OUTPUT_LOG_SIGMA}) lengths "
                   f"fitted to splitwise_conv.csv, clipped so that prompt + output <= {context} and peak KV <= M; "
                   f"{arrivals}; seed {seed}. Written by: {command}")
    return case_text(reqs, name=name or f"synthetic-{requests}-seed{seed}", description=description,
                     kv_capacity=kv_capacity, max_batch_tokens=max_batch_tokens, preset=preset,
                     arrivals=rate is not None)


# --------------------------------------------------------------------------- shipped families

FIG15_PROMPTS = tuple(2 ** k for k in range(11))  # 1, 2, 4, ..., 1024
FIG15_OUTPUT = 4
FIG15_REQUESTS = 4
FIG15_MAX_BATCH_TOKENS = 4096


def fig15_kv_capacity(prompt: int, output: int = FIG15_OUTPUT) -> int:
    """M = max(2I, I + O - 1): two prompts fit, but only one request can reach its peak KV."""
    return max(2 * prompt, prompt + output - 1)


def fig15_case_text(prompt: int) -> str:
    M = fig15_kv_capacity(prompt)
    return case_text(
        [Request(prompt, FIG15_OUTPUT)], counts=[FIG15_REQUESTS],
        name=f"fig15_I{prompt}",
        description=(f"Seed paper Section 5.1 / Figure 15 at I = {prompt}: {FIG15_REQUESTS} identical offline requests, "
                     f"O = {FIG15_OUTPUT}, M = max(2I, I + O - 1) = {M}, C = {FIG15_MAX_BATCH_TOKENS}, Llama-2-7B on A100 "
                     "costs. Two prompts fit in M but only one request can keep its KV to its last token; the paper "
                     "finds evicting short requests optimal for I <= 32 and eviction-free schedules optimal for I >= 64."),
        kv_capacity=M, max_batch_tokens=FIG15_MAX_BATCH_TOKENS)


MIX46_GROUPS = {  # Section 4.6: S = {8, 16}, L = {512, 1024}; (prompt set, output set)
    "siso": ((8, 16), (8, 16)),
    "silo": ((8, 16), (512, 1024)),
    "liso": ((512, 1024), (8, 16)),
    "lilo": ((512, 1024), (512, 1024)),
}
MIX46_PAIRS = tuple(itertools.combinations(MIX46_GROUPS, 2))  # six mixes
MIX46_PER_GROUP = 8
MIX46_KV_CAPACITY = 4096
MIX46_MAX_BATCH_TOKENS = 4096
MIX46_SEED = 46


def mix46_requests(a: str, b: str, per_group: int = MIX46_PER_GROUP) -> list[Request]:
    """`per_group` requests of group `a` and as many of group `b`, each length drawn uniformly from its set, shuffled.

    The generator is seeded with (46, index of a, index of b[, per_group if not 8]), so each mix has its own fixed draw.
    """
    names = list(MIX46_GROUPS)
    seed = [MIX46_SEED, names.index(a), names.index(b)] + ([per_group] if per_group != MIX46_PER_GROUP else [])
    rng = np.random.default_rng(seed)
    reqs = []
    for group in (a, b):
        prompts, outputs = MIX46_GROUPS[group]
        for _ in range(per_group):
            reqs.append(Request(int(rng.choice(prompts)), int(rng.choice(outputs))))
    order = rng.permutation(len(reqs))
    return [reqs[k] for k in order]


def mix46_case_text(a: str, b: str, per_group: int = MIX46_PER_GROUP) -> str:
    reqs = mix46_requests(a, b, per_group)
    peaks = sum(r.peak_kv for r in reqs)
    suffix = "" if per_group == MIX46_PER_GROUP else f"_{2 * per_group}"
    return case_text(
        reqs, name=f"mix46_{a}_{b}{suffix}",
        description=(f"Seed paper Section 4.6 mix {a.upper()} + {b.upper()}: {per_group} + {per_group} offline "
                     "requests, lengths drawn uniformly from S = {8, 16} (small) and L = {512, 1024} (large) with seed "
                     f"({MIX46_SEED}, group indices), shuffled. M = {MIX46_KV_CAPACITY} for every mix: at least twice the "
                     "largest single peak KV (2047 tokens, LILO), and below the total peak of any mix with large outputs "
                     f"(SILO, LILO), so serving those all at once forces evictions (here: total peak KV {peaks}). "
                     f"C = {MIX46_MAX_BATCH_TOKENS}, Llama-2-7B on A100 costs."),
        kv_capacity=MIX46_KV_CAPACITY, max_batch_tokens=MIX46_MAX_BATCH_TOKENS)


def shipped_cases() -> dict[str, str]:
    """Relative path under cases/ -> text, for the families generated here."""
    out = {f"fig15/fig15_I{p}.toml": fig15_case_text(p) for p in FIG15_PROMPTS}
    out.update({f"mix46/{a}_{b}.toml": mix46_case_text(a, b) for a, b in MIX46_PAIRS})
    out["mix46/siso_liso_32.toml"] = mix46_case_text("siso", "liso", 16)  # the 32-request solver benchmark case
    return out


def write_shipped_cases(root: str | Path) -> list[Path]:
    root = Path(root)
    written = []
    for rel, text in shipped_cases().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_user_file(path, text)
        written.append(path)
    return written


if __name__ == "__main__":  # python -m kvbound.generate --shipped cases
    import argparse

    parser = argparse.ArgumentParser(description="rewrite the generated case families (fig15, mix46)")
    parser.add_argument("--shipped", required=True, metavar="CASES_DIR")
    for p in write_shipped_cases(parser.parse_args().shipped):
        print(p)
