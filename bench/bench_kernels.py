"""Decode-attention bandwidth of the Triton kernel against the GPU's device-to-device copy bandwidth.

    python bench/bench_kernels.py [--batch 64 128 256] [--context 2048 4096 8192] [--few 1 4]
                                  [--few-context 8192 32768] [--splits 1 4 16] [--block-size 16]

One layer of the llama-2-7b shape (32 heads of 128, fp16): `batch` decode requests with
`context` cached tokens each, in shuffled KV blocks. Effective bandwidth = bytes of K and V
read / kernel time (CUDA events, median of 20 after warm-up); the reference is
`torch.Tensor.copy_` of a 1 GiB buffer (read + write bytes / time). Issue 15's target:
decode attention at >= 80% of the copy bandwidth at 64-256 requests and 2k-8k context.
Every composition runs with the split count the executor would pick (`auto`,
kvbound.kernels.decode_split_count) and with each of `--splits` (split-K / flash-decoding:
1 = one program per request and KV head); the `--few` requests with `--few-context` tokens
are the case split-K is for. Needs a CUDA device; prints a table and writes
bench/results/kernels.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbound.fileio import write_atomic

ROOT = Path(__file__).resolve().parents[1]


def _median_ms(torch, fn, runs: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth(torch) -> float:
    """GB/s of a device-to-device copy of 1 GiB: bytes read and written over the median time."""
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / _median_ms(torch, lambda: dst.copy_(src)) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--context", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--few", type=int, nargs="+", default=[1, 4], help="requests of the long-context rows")
    parser.add_argument("--few-context", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA device")
    from kvbound.kernels import PagedBatch, backend, decode_split_count

    ops = backend("triton")
    heads, dim, dtype = 32, 128, torch.float16
    multiprocessors = torch.cuda.get_device_properties(0).multi_processor_count
    copy_gbs = copy_bandwidth(torch)
    lines = [f"# Decode attention bandwidth ({torch.cuda.get_device_name()})", "",
             f"Copy (device to device, 1 GiB): {copy_gbs:.0f} GB/s. One llama-2-7b layer, fp16, block size "
             f"{args.block_size}, {multiprocessors} multiprocessors. Target: >= 80% of the copy bandwidth at 64-256 "
             "requests and 2k-8k context. `auto`: the split count the executor picks.", "",
             "| batch | context | splits | KV read (GB) | time (ms) | GB/s | of copy |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    compositions = [(b, c) for c in args.context for b in args.batch] + \
        [(b, c) for c in args.few_context for b in args.few]
    for batch, context in compositions:
        blocks = batch * -(-context // args.block_size)
        k_cache = torch.randn(blocks, args.block_size, heads, dim, dtype=dtype, device="cuda")
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(batch, -1)
        ones = torch.ones(batch, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, heads, dim, dtype=dtype, device="cuda")
        gb = 2 * batch * context * heads * dim * 2 / 1e9
        auto = decode_split_count(batch, heads, context, multiprocessors)
        for label, splits in [("auto", auto)] + [(str(n), n) for n in args.splits if n != auto]:
            paged = PagedBatch(tables, ones * context, ones, torch.arange(batch, dtype=torch.int32, device="cuda"),
                               1, args.block_size, splits)
            ms = _median_ms(torch, lambda: ops.decode_attention(q, k_cache, v_cache, paged))
            shown = f"{splits} (auto)" if label == "auto" else label
            lines.append(f"| {batch} | {context} | {shown} | {gb:.2f} | {ms:.3f} | {gb / ms * 1e3:.0f} | "
                         f"{gb / ms * 1e3 / copy_gbs:.0%} |")
        del k_cache, v_cache
    text = "\n".join(lines) + "\n"
    print(text)
    write_atomic(ROOT / "bench" / "results" / "kernels.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
