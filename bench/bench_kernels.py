"""Decode-attention bandwidth of the Triton kernel against the GPU's device-to-device copy bandwidth.

    python bench/bench_kernels.py [--batch 256] [--context 2048] [--block-size 16]

One layer of the llama-2-7b shape (32 heads of 128, fp16): `batch` decode requests with
`context` cached tokens each, in shuffled KV blocks. Effective bandwidth = bytes of K and V
read / kernel time (CUDA events, median of 20 after warm-up); the reference is
`torch.Tensor.copy_` of a 1 GiB buffer (read + write bytes / time). Issue 5's target:
decode attention at >= 60 % of the copy bandwidth at large batch. Needs a CUDA device;
prints a table and writes bench/results/kernels.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvbound.fileio import write_atomic  # noqa: E402


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA device")
    from kvbound.kernels import PagedBatch, backend

    ops = backend("triton")
    heads, dim, dtype = 32, 128, torch.float16
    src = torch.empty(1 << 29, dtype=dtype, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() * 2 / _median_ms(torch, lambda: dst.copy_(src)) / 1e6
    lines = [f"# Decode attention bandwidth ({torch.cuda.get_device_name()})", "",
             f"Copy (device to device, 1 GiB): {copy_gbs:.0f} GB/s. One llama-2-7b layer, fp16, {args.context} "
             f"cached tokens per request, block size {args.block_size}. Target: >= 60% of the copy bandwidth.", "",
             "| batch | KV read (GB) | time (ms) | GB/s | of copy |", "|---:|---:|---:|---:|---:|"]
    for batch in args.batch:
        blocks = batch * -(-args.context // args.block_size)
        k_cache = torch.randn(blocks, args.block_size, heads, dim, dtype=dtype, device="cuda")
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(batch, -1)
        ones = torch.ones(batch, dtype=torch.int32, device="cuda")
        paged = PagedBatch(tables, ones * args.context, ones, torch.arange(batch, dtype=torch.int32, device="cuda"), 1,
                           args.block_size)
        q = torch.randn(batch, heads, dim, dtype=dtype, device="cuda")
        ms = _median_ms(torch, lambda: ops.decode_attention(q, k_cache, v_cache, paged))
        gb = 2 * batch * args.context * heads * dim * 2 / 1e9
        lines.append(f"| {batch} | {gb:.2f} | {ms:.3f} | {gb / ms * 1e3:.0f} | {gb / ms * 1e3 / copy_gbs:.0%} |")
        del k_cache, v_cache
    text = "\n".join(lines) + "\n"
    print(text)
    write_atomic(ROOT / "bench" / "results" / "kernels.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
