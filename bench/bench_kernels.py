"""Decode-attention bandwidth of the Triton kernel against the GPU's device-to-device copy bandwidth,
and the tuning of its launch settings.

    python bench/bench_kernels.py [--tune] [--batch 64 128 256] [--context 2048 4096 8192] [--few 1 4]
                                  [--few-context 8192 32768] [--splits 1 4 16] [--block-size 16]

One layer of the llama-2-7b shape (32 heads of 128, fp16): `batch` decode requests with
`context` cached tokens each, in shuffled KV blocks. Effective bandwidth = bytes of K and V
read / kernel time (CUDA events, median of 20 after warm-up); the reference is
`torch.Tensor.copy_` of a 1 GiB buffer (read + write bytes / time). Issue 36's target:
decode attention at >= 80% of the copy bandwidth at 64-256 requests and 2k-8k context.

`--tune` first times every combination of KV pool layout (NHD, HND), key tile, warps,
pipelining stages and products (float32 sums or tensor cores; kvbound.kernels.tuning.DecodeConfig) on TUNE_POINTS, keeps
the one with the least geometric mean of its time over the best time at each point, and writes
it to kvbound/kernels/tuned/<GPU>.json, where the executor reads it. The table then shows each
composition with the untuned defaults and with the tuned settings, at the split count the
executor would pick (`auto`, kvbound.kernels.decode_split_count), and the tuned settings at
each of `--splits`; the `--few` requests with `--few-context` tokens are the case split-K is
for. Needs a CUDA device; prints a table and writes bench/results/kernels.md.
"""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

from kvbound.fileio import write_atomic

ROOT = Path(__file__).resolve().parents[1]


DEVICE = "cuda"  # "cpu" with --dry-run: Triton's interpreter on tiny sizes, to check the script without a GPU


def _median_ms(torch, fn, runs: int = 20) -> float:
    import time
    if DEVICE == "cpu":  # the dry run checks the flow, not the times
        runs = 1
    for _ in range(3 if DEVICE == "cuda" else 1):
        fn()
    times = []
    for _ in range(runs):
        if DEVICE == "cpu":
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth(torch) -> float:
    """GB/s of a device-to-device copy of 1 GiB: bytes read and written over the median time."""
    src = torch.empty(1 << (29 if DEVICE == "cuda" else 20), dtype=torch.float16, device=DEVICE)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / _median_ms(torch, lambda: dst.copy_(src)) / 1e6


#: (requests, context) pairs the tuning times; the tuned settings must do well at all of them (one
#: split each at 132 multiprocessors, so that each setting compiles once)
TUNE_POINTS = ((256, 2048), (128, 4096), (256, 8192))
#: (the program order, heads_first, moved nothing measurable on an H100, within 0.2%, and tiles of 256 were never
#: among the best ten: neither is searched)
TUNE_SPACE = dict(tile_n=(64, 128), num_warps=(4, 8), num_stages=(2, 3, 4), dot=(False, True))


class Pools:
    """One layer's K and V pools of `batch` requests of `context` tokens in shuffled blocks, in each layout."""

    def __init__(self, torch, batch: int, context: int, block_size: int, heads: int, dim: int, layout: str):
        from kvbound.kernels.layout import new_pool
        blocks = batch * -(-context // block_size)
        self.k = new_pool(blocks, block_size, heads, dim, layout=layout, dtype=torch.float16, device=DEVICE).normal_()
        self.v = new_pool(blocks, block_size, heads, dim, layout=layout, dtype=torch.float16, device=DEVICE).normal_()
        self.tables = torch.randperm(blocks, device=DEVICE, dtype=torch.int32).view(batch, -1)
        self.q = torch.randn(batch, heads, dim, dtype=torch.float16, device=DEVICE)
        self.gb = 2 * batch * context * heads * dim * 2 / 1e9
        self.context, self.block_size = context, block_size

    def time_ms(self, torch, ops, splits: int, config, runs: int = 20) -> float:
        from kvbound.kernels import PagedBatch
        batch = self.q.shape[0]
        ones = torch.ones(batch, dtype=torch.int32, device=DEVICE)
        paged = PagedBatch(self.tables, ones * self.context, ones, torch.arange(batch, dtype=torch.int32, device=DEVICE),
                           1, self.block_size, splits)
        return _median_ms(torch, lambda: ops.decode_attention(self.q, self.k, self.v, paged, config=config), runs)


def tune(torch, ops, args, heads, dim, multiprocessors):
    """The KernelConfig with the least geometric mean of time / best time over TUNE_POINTS, and a log."""
    import itertools
    import math
    from kvbound.kernels import decode_split_count
    from kvbound.kernels.layout import KV_LAYOUTS
    from kvbound.kernels.tuning import DecodeConfig, KernelConfig

    candidates = [KernelConfig(layout, DecodeConfig(**dict(zip(TUNE_SPACE, values))))
                  for layout in KV_LAYOUTS for values in itertools.product(*TUNE_SPACE.values())]
    times = {c: [] for c in candidates}
    for batch, context in TUNE_POINTS:
        splits = decode_split_count(batch, heads, context, multiprocessors)
        for layout in KV_LAYOUTS:
            pools = Pools(torch, batch, context, args.block_size, heads, dim, layout)
            for config in (c for c in candidates if c.layout == layout):
                try:
                    times[config].append(pools.time_ms(torch, ops, splits, config.decode, runs=8))
                except Exception as exc:  # noqa: BLE001 - a setting that does not compile (too many registers) loses
                    print(f"{config}: {type(exc).__name__}: {exc}", flush=True)
                    times[config].append(math.inf)
            del pools
            gc.collect()
            torch.cuda.empty_cache()
        print(f"tuned point {batch} x {context} done", flush=True)
    best_at = [min(t[k] for t in times.values()) for k in range(len(TUNE_POINTS))]
    score = {c: math.exp(sum(math.log(t / b) for t, b in zip(ts, best_at)) / len(best_at)) for c, ts in times.items()}
    ranked = sorted(candidates, key=score.get)
    log = [f"{score[c]:.3f} {c.layout} {c.decode}" for c in ranked[:10]]
    return ranked[0], score[ranked[0]], log


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tune", action="store_true", help="tune the launch settings first and save them")
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--context", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--few", type=int, nargs="+", default=[1, 4], help="requests of the long-context rows")
    parser.add_argument("--few-context", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--no-dot", action="store_true", help="tune without the tensor-core products (where their "
                        "CUDA check failed)")
    parser.add_argument("--dry-run", action="store_true", help=argparse.SUPPRESS)  # CPU, tiny: checks the script
    args = parser.parse_args()
    global DEVICE, TUNE_POINTS, TUNE_SPACE
    if args.dry_run:
        import os
        os.environ["TRITON_INTERPRET"] = "1"
        DEVICE, TUNE_POINTS = "cpu", ((2, 64), (3, 96))
        TUNE_SPACE = dict(tile_n=(16, 32), num_warps=(4,), num_stages=(2,), dot=(False, True))
        args.batch, args.context, args.few, args.few_context, args.splits = [2], [64], [1], [128], [1, 4]
    if args.no_dot:
        TUNE_SPACE = {**TUNE_SPACE, "dot": (False,)}
    import torch
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA device")
    from kvbound.kernels import backend, decode_split_count
    from kvbound.kernels.tuning import KernelConfig, kernel_config, tuned_path

    ops = backend("triton")
    heads, dim = 32, 128
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "dry run"
    multiprocessors = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 4
    copy_gbs = copy_bandwidth(torch)
    lines = [f"# Decode attention bandwidth ({name})", "",
             f"Copy (device to device, 1 GiB): {copy_gbs:.0f} GB/s. One llama-2-7b layer, fp16, block size "
             f"{args.block_size}, {multiprocessors} multiprocessors. Target: >= 80% of the copy bandwidth at 64-256 "
             "requests and 2k-8k context. `auto`: the split count the executor picks.", ""]
    if args.tune:
        best, score, log = tune(torch, ops, args, heads, dim, multiprocessors)
        path = tuned_path(name)
        if DEVICE == "cuda":
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, best.to_json(device=name, score=round(score, 4)))
            kernel_config.cache_clear()
        lines += [f"Tuned (`--tune`, {len(TUNE_POINTS)} points: {', '.join(f'{b} x {c}' for b, c in TUNE_POINTS)}): "
                  f"layout {best.layout}, {best.decode}, written to `{path.relative_to(ROOT)}`. Best ten "
                  "(geometric mean of time over the best time at each point):", "", "```", *log, "```", ""]
    tuned = kernel_config(torch.device(DEVICE)) if DEVICE == "cuda" or not args.tune else best
    default = KernelConfig()
    lines += [f"Settings: `default` {default.layout} {default.decode}; `tuned` {tuned.layout} {tuned.decode}.", "",
              "| batch | context | settings | splits | KV read (GB) | time (ms) | GB/s | of copy |",
              "|---:|---:|---|---:|---:|---:|---:|---:|"]
    compositions = [(b, c) for c in args.context for b in args.batch] + \
        [(b, c) for c in args.few_context for b in args.few]
    for batch, context in compositions:
        auto = decode_split_count(batch, heads, context, multiprocessors)
        runs = [("default", default, auto, True)] + [("tuned", tuned, auto, True)] + \
            [("tuned", tuned, n, False) for n in args.splits if n != auto]
        for layout in dict.fromkeys(config.layout for _, config, _, _ in runs):
            pools = Pools(torch, batch, context, args.block_size, heads, dim, layout)
            for label, config, splits, is_auto in runs:
                if config.layout != layout:
                    continue
                ms = pools.time_ms(torch, ops, splits, config.decode)
                shown = f"{splits} (auto)" if is_auto else str(splits)
                lines.append(f"| {batch} | {context} | {label} | {shown} | {pools.gb:.2f} | {ms:.3f} | "
                             f"{pools.gb / ms * 1e3:.0f} | {pools.gb / ms * 1e3 / copy_gbs:.0%} |")
                print(lines[-1], flush=True)
            del pools
            gc.collect()
            torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    print(text)
    if DEVICE == "cuda":
        write_atomic(ROOT / "bench" / "results" / "kernels.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
