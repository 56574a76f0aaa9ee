"""Decode step time of the executor: the model run (GPU time) with and without CUDA graphs, and the
host preparation beside it.

    python bench/bench_step.py [--shape llama-2-7b] [--requests 1 16 64] [--cached 1024] [--steps 30]

For each count of decode requests with `--cached` tokens each (prefilled first, not timed), runs
`--steps` decode-only batches through `Executor.step` and reports the median model run (CUDA
events: forward pass, LM head, sampling) and the median host preparation (block allocation, the
input arrays, their upload into the static buffers), once eager and once replaying the captured
decode graph. Issue 15's target: one request with 1,024 cached tokens in <= 7 ms, graph replay
included, with the preparation reported beside it. Reads the weight floor too: the bytes of the
weights over the device-to-device copy bandwidth (1 GiB copy, read + write bytes / time).
Needs a CUDA device; prints a table and writes bench/results/step.md.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path

from bench_kernels import copy_bandwidth  # bench_kernels.py lies beside this script (its folder is importable)
from kvbound.fileio import write_atomic

ROOT = Path(__file__).resolve().parents[1]


def measure(shape, requests: int, cached: int, steps: int, graphs: bool, device: str = "cuda") -> tuple[float, float]:
    """(median model run, median host preparation), seconds, of `steps` decode batches."""
    from kvbound.engine_bridge.executor import Executor
    from kvbound.engine_bridge.sequence import Sequence

    block, chunk = 16, 4096
    length = cached + steps + 1
    executor = Executor.build(shape, device=device, block_size=block, max_tokens=requests * (length + block),
                              max_sequences=requests, max_seq_len=length, max_batch_tokens=chunk, graphs=graphs)
    executor.warm_up()
    seqs = [Sequence(i, [1 + i % 7] * cached, cached, steps + 1) for i in range(requests)]
    pending = list(seqs)
    while pending:  # prefill in batches of at most `chunk` tokens (not timed)
        work, room = [], chunk
        while pending and room > 0:
            seq = pending[0]
            c = min(seq.uncached, room)
            work.append((seq, c))
            room -= c
            if c == seq.uncached:
                pending.pop(0)
        executor.step(work)
    runs, prepares = [], []
    for _ in range(steps):
        out = executor.step([(seq, 1) for seq in seqs])
        runs.append(out.seconds)
        prepares.append(out.prepare_seconds)
    del executor
    return statistics.median(runs[3:]), statistics.median(prepares[3:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--requests", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--cached", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--graphs-only", action="store_true", help="leave out the eager runs")
    args = parser.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_step.py needs a CUDA device")
    from kvbound.engine_bridge.config import model_shape

    shape = model_shape(args.shape)
    attention = 2 * shape.hidden * shape.hidden + 2 * shape.hidden * shape.kv_heads * shape.head_dim  # q, o; k, v
    weights = shape.layers * (attention + 3 * shape.hidden * shape.intermediate) + 2 * shape.vocab * shape.hidden
    copy = copy_bandwidth(torch)
    floor_ms = weights * 2 / copy / 1e6
    lines = [f"# Decode step ({torch.cuda.get_device_name()}, shape {args.shape}, fp16)", "",
             f"Weights {weights * 2 / 1e9:.2f} GB; device-to-device copy {copy:.0f} GB/s, so reading the weights once "
             f"takes {floor_ms:.2f} ms (the floor). Each row: {args.steps} decode batches of the requests, each with "
             f"{args.cached} cached tokens, median of the last {args.steps - 3}. `run`: the model run (CUDA events); "
             "`prepare`: host preparation, not in `run`. Target (issue 15): 1 request at 1,024 cached tokens in <= 7 ms "
             "with graph replay.", "",
             "`run / floor + KV`: over the time of reading the weights and every request's KV once (issue 36's target: "
             "64 requests within 1.3x).", "",
             "| requests | graphs | run (ms) | prepare (ms) | run / floor | run / floor + KV |",
             "|---:|---|---:|---:|---:|---:|"]
    for requests in args.requests:
        for graphs in (True,) if args.graphs_only else (False, True):
            try:
                run, prepare = measure(shape, requests, args.cached, args.steps, graphs)
                kv_ms = requests * (args.cached + 1) * shape.kv_bytes_per_token(2) / copy / 1e6
                lines.append(f"| {requests} | {'yes' if graphs else 'no'} | {run * 1e3:.2f} | {prepare * 1e3:.2f} | "
                             f"{run * 1e3 / floor_ms:.2f} | {run * 1e3 / (floor_ms + kv_ms):.2f} |")
            except Exception as exc:  # noqa: BLE001 - one failing configuration must not hide the others
                lines.append(f"| {requests} | {'yes' if graphs else 'no'} | failed: {type(exc).__name__}: {exc} | | | |")
            print(lines[-1], flush=True)
            gc.collect()  # the executor's weights, pools and graphs go before the next one is built
            torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    print(text)
    write_atomic(ROOT / "bench" / "results" / "step.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
