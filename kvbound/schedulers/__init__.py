"""Heuristic schedulers: the unified Algorithm 1 of the seed paper with named presets, and MC-SF / alpha-protection.

`get_scheduler("name")` or `get_scheduler("name:key=value,...")` returns a fresh policy;
`simulate(instance, policy)` runs it. Keys override the preset's parameters, e.g.
`sarathi:prefill_limit=256`, `fcfs-protect:alpha=0.3`, `vllm:hybrid=true`.

`REGISTRY` below is the one table of schedulers (`registry.py` says how an entry is built and
typed): the presets of the unified scheduler here, then the policies of their own modules, each
registered by its module (`registry.register`) in the order of the import line. A new preset is one
entry here; a new policy is its module and its name in that import line.
"""
from __future__ import annotations

from dataclasses import replace

from . import jaillet, waves, aptserve  # noqa: F401  the policies of their own modules, each registered there
from .aptserve import AptGreedy
from .base import Policy, SimulationResult, simulate
from .jaillet import MCSF, FcfsProtect
from .kossmann import ENGINE as ENGINE_003
from .kossmann import Larry, Trail
from .registry import POLICIES, Scheduler, build, preset, table
from .srpt import PARAMS as SRPT_PARAMS
from .srpt import Srpt
from .unified import UnifiedParams, UnifiedScheduler
from .waves import SptWaves

U = UnifiedParams

#: vLLM V1's defaults for its own knobs: EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py) gives
#: max_num_seqs = 256 and max_num_batched_tokens = 8192 for the LLM class on GPUs below 70 GiB or A100s
#: (kvbound's default cost preset is an A100); the OpenAI server there uses 2048 tokens, and on H100-class
#: GPUs 8192 (server) / 16384 (LLM class) with 1024 sequences. Override with vllm-v1:max_num_batched_tokens=...
VLLM_V1_MAX_NUM_SEQS, VLLM_V1_MAX_NUM_BATCHED_TOKENS = 256, 8192

#: the seed paper's presets of Algorithm 1 (name, parameters, one-line description with its source)
_SEED = (
    preset("vllm", U(priority="prefill", hybrid=False, chunked=False),
           "vLLM: prefills first, no hybrid batches, no chunking, P = C; evicts the latest-arrived running request (seed paper Table 1)"),
    preset("vllm-hy", U(priority="prefill", hybrid=True, chunked=False),
           "vLLM with hybrid batches: prefills first, then decodes in the same batch (Table 1)"),
    preset("sarathi", U(priority="decode", hybrid=True, chunked=True, prefill_limit=512),
           "Sarathi-Serve: decodes first, hybrid batches, chunked prefill with P = 512 (Table 1)"),
    preset("sarathi-pc", U(priority="decode", hybrid=True, chunked=True),
           "Sarathi with P = C (Table 1: SARATHI_P=C)"),
    preset("sarathi-nocp", U(priority="decode", hybrid=True, chunked=False),
           "Sarathi without chunked prefill, P = C (Table 1)"),
    preset("sarathi-nohy", U(priority="decode", hybrid=False, chunked=False),
           "Sarathi without hybrid batches or chunking, P = C (Table 1)"),
    preset("rank-i", U(priority="rank-i", hybrid=True, chunked=True),
           "one group ordered by prompt length, shortest first; hybrid, chunked, P = C (seed paper Section 4.6, Rank_I)"),
    preset("rank-o", U(priority="rank-o", hybrid=True, chunked=True),
           "one group ordered by output length, shortest first (hypothetical: knows O); hybrid, chunked, P = C (Section 4.6, Rank_O)"),
    preset("evict-short", U(priority="decode", hybrid=True, chunked=True, prefill_limit=512, decode_order="longest-first",
                            victim="shortest"),
           "Sarathi grouping, running decodes with more cached tokens first, evicts the shortest when memory is short (Section 6)"),
    preset("mcsf-pc", U(priority="decode", hybrid=True, chunked=True, reserve="future", admit_order="output"),
           "MC-SF with chunked prefill: decodes first, then admits shortest output first while the running set's "
           "projected KV fits in M at every future batch; P = C (hypothetical: knows O)"),
    preset("sarathi-pc-mc", U(priority="decode", hybrid=True, chunked=True, reserve="future"),
           "Sarathi-PC with MC-SF's admission test: first come first served while the running set's "
           "projected KV fits in M at every future batch (hypothetical: knows O)"),
    preset("sjf-mc", U(priority="decode", hybrid=True, chunked=True, reserve="future", admit_order="work"),
           "shortest job (I + O) first with MC-SF's admission test; decodes first, chunked, P = C (hypothetical: knows O)"),
)


def _eviction_free(base: Scheduler) -> Scheduler:
    return preset(base.name + "-ef", replace(base.params, reserve="peak"),
                  f"eviction-free {base.name}: reserves I + O - 1 at admission, never evicts (hypothetical: knows O; Section 4.1)")


#: every scheduler, in the order `kvbound schedulers` lists them
REGISTRY: dict[str, Scheduler] = table(
    *_SEED,
    *(_eviction_free(s) for s in _SEED if s.name in ("vllm", "vllm-hy", "sarathi", "sarathi-pc", "sarathi-nocp", "sarathi-nohy")),
    # seed paper 003 (Kossmann et al.) Section 2's baselines, on its chunked decode-first engine
    preset("fcfs", U(priority="decode", hybrid=True, chunked=True),
           "FCFS (Kossmann et al. Sec. 2): decodes first, then waiting requests first come first served, chunked, "
           "P = C, preempts the latest-arrived running request; the same as sarathi-pc; the paper's concurrency "
           "limit is fcfs:max_running=K"),
    preset("no-preempt", U(priority="decode", hybrid=True, chunked=True, reserve="peak"),
           "No-Preempt (Kossmann et al. Sec. 2): FCFS that reserves I + O - 1 at dispatch and never preempts; "
           "chunked, P = C; the same as sarathi-pc-ef (hypothetical: knows O)"),
    preset("vllm-v1", U(priority="running", hybrid=True, chunked=True, reserve="chunk", max_running=VLLM_V1_MAX_NUM_SEQS,
                        token_limit=VLLM_V1_MAX_NUM_BATCHED_TOKENS, admit_after_evict=False),
           "vLLM V1 (vllm/v1/core/sched/scheduler.py): running requests first in arrival order, then waiting ones "
           "FCFS; every prefill chunked to the token budget min(C, max_num_batched_tokens = 8192); at most "
           "max_num_seqs = 256 running; KV allocated per chunk; when blocks run out the latest-arrived running "
           "request is preempted (recompute) and nothing is admitted in that step",
           aliases={"max_num_seqs": "max_running", "max_num_batched_tokens": "token_limit"}),
    preset("larry", ENGINE_003,
           "LARRY (Kossmann et al. Sec. 4.1): decodes first, chunked, P = C; waiting requests by score = queue length "
           "x prompt KV (tokens) - alpha x waiting time (s), lowest first, dispatched while the KV fits and the batch "
           "has room; alpha = 1",
           cls=Larry, options=("alpha",)),
    preset("trail", ENGINE_003,
           "TRAIL+ (Kossmann et al. Sec. 2): shortest remaining output O - n first (true lengths; hypothetical: knows "
           "O), running and waiting; decodes first, chunked, P = C; preempts for a shorter waiting request only while "
           "n / O < c (c = 0: never)",
           cls=Trail, options=("c",)),
    preset("srpt", SRPT_PARAMS,
           "shortest remaining time alone first (intercepts + work; hypothetical: knows O), running and waiting; "
           "decodes always join a batch, a lower-priority prefill chunk only while the delay it causes the requests "
           "ahead is at most ratio x what leaving it out costs (its wait for them, and the intercepts of its own "
           "batches for the rest); ratio = 1, larger mixes more; chunked, P = C",
           cls=Srpt, options=("ratio",)),
    *POLICIES,
)

SCHEDULERS: dict[str, str] = {name: entry.description for name, entry in REGISTRY.items()}

#: the fast heuristics a solver warm-starts from by default (each is cheap on small cases); sjf-mc
#: with its prefill chunks cut to 512 or 1,024 tokens keeps the batches that decodes share short,
#: which wins on prefill-heavy traces (Splitwise code all at 0: 2.9-8.5% below the rest on 4 of the 6
#: cases of 30-300 requests; bench/results/NOTES.md)
FAST_HEURISTICS = ("vllm", "vllm-ef", "sarathi-pc", "sarathi-pc-ef", "sarathi", "sarathi-ef", "rank-i", "evict-short", "mcsf",
                   "mcsf-pc", "sarathi-pc-mc", "sjf-mc", "spt-waves", "srpt", "srpt:ratio=2", "sjf-mc:prefill_limit=512",
                   "sjf-mc:prefill_limit=1024")
#: the heuristics that serve small requests first (by job, output, remaining time or prompt), which the
#: mean objectives favour; where a long trace leaves time for only some heuristics, a solve of a mean
#: objective runs these first once it has a schedule (srpt's two last: on 19,366 requests they take 1-2 min)
SMALL_FIRST = ("sjf-mc", "sjf-mc:prefill_limit=1024", "sjf-mc:prefill_limit=512", "mcsf-pc", "rank-i", "srpt",
               "srpt:ratio=2")


def get_scheduler(spec: str) -> Policy:
    """A fresh policy from `name` or `name:key=value,...`."""
    return build(REGISTRY, spec)


def run_scheduler(instance, spec: str) -> SimulationResult:
    return simulate(instance, get_scheduler(spec))


__all__ = ["SCHEDULERS", "FAST_HEURISTICS", "SMALL_FIRST", "get_scheduler", "run_scheduler", "simulate", "Policy",
           "SimulationResult", "UnifiedParams", "UnifiedScheduler", "MCSF", "FcfsProtect", "SptWaves", "Larry", "Trail",
           "AptGreedy", "Srpt"]
