"""Build the realistic benchmark cases (issue 14, item 5) from ../shared/data/traces, read in place.

    python bench/real_cases.py [OUT_DIR]        # default bench/cases_real/ (git-ignored: built, never committed)

Every case reads its trace through `[workload] trace = ...` (a path relative to the case file,
so the trace is never copied) with `limit = N` and `offset = 0`: the first N rows of the trace,
in file order. Per trace and N:

* traces: splitwise_conv.csv, splitwise_code.csv (Splitwise, with arrival times) and
  arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv (lengths only: no arrival times,
  so only its all-at-0 cases exist);
* N = 30, 100, 300, 1000;
* M: **tight** = 2 x the largest peak KV of the N requests (max I + O - 1, rounded up to the
  16-token block), i.e. the low end of issue 14's 2-4x range; **loose** = 100,000 tokens, the
  figure for Llama-2-7B on one 80 GB GPU (80 GB - 13.5 GB weights = ~66 GB at 512 KiB of KV per
  token is ~127k tokens; 100,000 leaves room for activations). It is a multiple of 16. Where the
  sum of the N peaks is below it (conversation N = 30) all requests fit at once;
* arrivals: `t0` (time_scale = 0: all at 0) and `arr` (time_scale = 1: the trace's times,
  shifted so the first selected request arrives at 0), Splitwise traces only;
* block size 16, C = P = 2048, cost preset llama2-7b-h100.

That is 3 x 4 x 2 = 24 all-at-0 cases and 2 x 4 x 2 = 16 with arrivals: 40 cases.

It also writes `conv40_tight_issue14.toml`, the 40-request tight conversation case issue 14
quotes for `kvbound compare` (M = 4,096, C = P = 2,048, block 16, all at 0): the first 40 rows
of splitwise_conv.csv whose prompt is at most P = 2,048 (so that vLLM, which does not chunk,
can serve every request) and whose peak KV, rounded to blocks, is at most M (rows 13, 23, 24,
28, 30 and 44 of the first 46 are left out). Because that is a filtered selection it lists the
40 requests as [[requests]] (40 short entries). With it, `kvbound compare --objective
mean_latency` reproduces the issue's figures (vLLM 51.8% to the bound, 30.9% to sjf-mc's).
And `conv100_arr_replay.toml`, issue 36's GPU replay case with arrivals (`build_replay_case`).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvbound.io.traces import load_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES_DIR = ROOT.parent / "shared" / "data" / "traces"
TRACES = {  # short name -> (file, has arrival times)
    "splitwise_conv": ("splitwise_conv.csv", True),
    "splitwise_code": ("splitwise_code.csv", True),
    "arxiv": ("arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", False),
}
SIZES = (30, 100, 300, 1000)
BLOCK = 16
C = 2048
PRESET = "llama2-7b-h100"
TIGHT_FACTOR = 2
LOOSE_M = 100_000
ISSUE_CASE = "conv40_tight_issue14"


def round_up(tokens: int, block: int = BLOCK) -> int:
    return -(-tokens // block) * block


def case_name(trace: str, n: int, regime: str, arrivals: str) -> str:
    return f"{trace}_{n}_{regime}_{arrivals}"


def _header(name: str, description: str, m: int) -> list[str]:
    return [f'name = "{name}"', f'description = "{description}"', "[system]", f"kv_capacity = {m}",
            f"max_batch_tokens = {C}", f"max_prefill_tokens = {C}", f"block_size = {BLOCK}",
            "[cost]", f'preset = "{PRESET}"']


def build(out: Path, traces=tuple(TRACES), sizes=SIZES) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for short in traces:
        file, timed = TRACES[short]
        trace = TRACES_DIR / file
        rel = os.path.relpath(trace, out.resolve())
        for n in sizes:
            reqs = load_trace(trace, limit=n)
            peak = max(round_up(r.prompt + r.output - 1) for r in reqs)
            regimes = {"tight": TIGHT_FACTOR * peak, "loose": LOOSE_M}
            for regime, m in regimes.items():
                for arrivals in (("t0", "arr") if timed else ("t0",)):
                    name = case_name(short, n, regime, arrivals)
                    why = (f"{TIGHT_FACTOR} x the largest peak KV ({peak} tokens, in blocks)" if regime == "tight"
                           else f"{LOOSE_M:,} tokens (Llama-2-7B on 80 GB)")
                    desc = (f"First {n} rows of {file}; M = {m} = {why}; "
                            f"{'all arrivals at 0' if arrivals == 't0' else 'arrival times from the trace'}; "
                            f"C = P = {C}, block {BLOCK}, preset {PRESET}. Built by bench/real_cases.py.")
                    lines = _header(name, desc, m) + ["[workload]", f'trace = "{rel}"', f"limit = {n}", "offset = 0",
                                                      f"time_scale = {0.0 if arrivals == 't0' else 1.0}"]
                    path = out / f"{name}.toml"
                    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
                    written.append(path)
    written.append(build_issue_case(out))
    written.append(build_replay_case(out))
    return written


def build_issue_case(out: Path, n: int = 40, m: int = 4096) -> Path:
    rows = load_trace(TRACES_DIR / "splitwise_conv.csv", limit=400)
    keep = [(k, r) for k, r in enumerate(rows) if r.prompt <= C and round_up(r.prompt + r.output - 1) <= m][:n]
    skipped = sorted(set(range(keep[-1][0] + 1)) - {k for k, _ in keep})
    desc = (f"Issue 14's 40-request tight conversation case: the first {n} rows of splitwise_conv.csv with prompt <= "
            f"P = {C} and peak KV (in blocks of {BLOCK}) <= M = {m} (rows {', '.join(map(str, skipped))} are left out), "
            f"all arrivals at 0; C = P = {C}, preset {PRESET}. Built by bench/real_cases.py.")
    lines = _header(ISSUE_CASE, desc, m)
    for _, r in keep:
        lines += ["[[requests]]", f"prompt = {r.prompt}", f"output = {r.output}"]
    path = out / f"{ISSUE_CASE}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


REPLAY_CASE = "conv100_arr_replay"


def build_replay_case(out: Path, n: int = 100, m: int = 8192, rate: float = 10.0) -> Path:
    """Issue 36's 100-request case with arrivals for GPU replay: the first n rows of splitwise_conv.csv
    whose prompt plus output fits P (so that vLLM, which does not chunk, may refill any of them),
    at their trace times shifted to start at 0 and divided by `rate` (at the trace's own rate the
    schedules run ~7,400 mostly one-request batches over 47 s; at 10x, ~2,600 with requests
    overlapping), listed in the file (the GPU machine has no traces)."""
    rows = load_trace(TRACES_DIR / "splitwise_conv.csv", limit=400)
    keep = [r for r in rows if r.prompt + r.output - 1 <= C][:n]
    first = keep[0].arrival
    desc = (f"Issue 36's replay case with arrivals: the first {n} rows of splitwise_conv.csv with prompt + output - 1 "
            f"<= P = {C}, at {rate:g}x the trace's rate (its arrival times shifted to start at 0, divided by {rate:g}); "
            f"M = {m}, C = P = {C}, block {BLOCK}, "
            f"preset {PRESET}. Built by bench/real_cases.py.")
    lines = _header(REPLAY_CASE, desc, m)
    for r in keep:
        lines += ["[[requests]]", f"prompt = {r.prompt}", f"output = {r.output}", f"arrival = {(r.arrival - first) / rate:.6f}"]
    path = out / f"{REPLAY_CASE}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="See the module docstring for how each case is chosen.")
    ap.add_argument("out", nargs="?", default=str(ROOT / "bench" / "cases_real"), help="folder (default bench/cases_real/)")
    ap.add_argument("--traces", default=",".join(TRACES), help=f"comma list of {', '.join(TRACES)}")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma list of N")
    args = ap.parse_args(argv)
    traces = [t for t in args.traces.split(",") if t]
    for t in traces:
        if t not in TRACES:
            ap.error(f"unknown trace {t!r}; choose from {', '.join(TRACES)}")
    written = build(Path(args.out), traces, [int(s) for s in args.sizes.split(",") if s])
    print(f"wrote {len(written)} cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
