"""The paged KV layout shared by both kernel backends (PagedAttention, Kwon et al. 2023, Section 4).

A layer's K pool (and its V pool) is a tensor `[num_blocks, block_size, kv_heads, head_dim]`;
a token's slot is s = block * block_size + offset. Its memory is laid out in one of KV_LAYOUTS
(`new_pool`): NHD, a token's heads side by side (the tensor is contiguous), or HND, each block a
run of heads and each head's block_size keys contiguous (vLLM's and FlashInfer's choice for
decode: a program walking one head reads whole runs). Kernels address the pool by its strides. A request's block table lists its blocks in sequence
order, so its token at position p is in slot table[p // block_size] * block_size + p % block_size.
Blocks of one request need not be contiguous or ordered in the pool; only the table is.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


KV_LAYOUTS = ("NHD", "HND")
#: query rows per program of the Triton prefill kernel (the split count of its programs reads it)
PREFILL_TILE_M = 64


def new_pool(num_blocks: int, block_size: int, kv_heads: int, head_dim: int, *, layout: str = "NHD",
             dtype=None, device=None) -> torch.Tensor:
    """A zeroed pool `[num_blocks, block_size, kv_heads, head_dim]` whose memory is in `layout`.
    Zeros, not empty: garbage in unused slots could be NaN or denormal and slow a CPU down."""
    if layout == "NHD":
        return torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)
    if layout == "HND":
        return torch.zeros(num_blocks, kv_heads, block_size, head_dim, dtype=dtype, device=device).transpose(1, 2)
    raise ValueError(f"unknown KV layout {layout!r}; known: {', '.join(KV_LAYOUTS)}")


@dataclass(frozen=True)
class PagedBatch:
    """Per-request metadata of the requests one attention call serves (all on the pool's device).

    Request r owns query rows query_starts[r] .. query_starts[r] + query_lens[r] - 1; those are
    its tokens at positions seq_lens[r] - query_lens[r] .. seq_lens[r] - 1, whose K and V are
    already in the pool (write_kv runs first). For decode attention query_lens is all ones.
    """

    block_tables: torch.Tensor  # [R, max_blocks] int32, padded with 0
    seq_lens: torch.Tensor  # [R] int32: m + c, the request's cached tokens after this batch
    query_lens: torch.Tensor  # [R] int32: c
    query_starts: torch.Tensor  # [R] int32: first query row of each request
    max_query_len: int  # max of query_lens, known on the host (sizes the kernel grid)
    block_size: int
    # key-range splits per (request, KV head) of the Triton decode kernel (split-K, flash-decoding), or per
    # (request, head, tile of query rows) of the prefill kernel; 1 = one program walks all the keys
    num_splits: int = 1

    @property
    def num_requests(self) -> int:
        return self.seq_lens.shape[0]

    # The reference twins gather each request's keys by slot; the slots are the same in every
    # layer, so they are computed once per batch (at the first layer) and kept here.

    @cached_property
    def key_slots(self) -> list[torch.Tensor]:
        """Per request, the pool slots of its keys at positions 0 .. seq_len - 1."""
        return [token_slots(self.block_tables, r, torch.arange(n, device=self.seq_lens.device), self.block_size)
                for r, n in enumerate(self.seq_lens.tolist())]

    @cached_property
    def padded_key_slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[R, longest seq_len] slots of every request's keys, padded by repeating its last key, and
        the mask of the real ones."""
        lens = self.seq_lens.long()
        positions = torch.arange(int(lens.max()), device=lens.device)
        real = positions[None, :] < lens[:, None]
        rows = torch.arange(len(lens), device=lens.device)[:, None]
        return token_slots(self.block_tables, rows, torch.minimum(positions[None, :], lens[:, None] - 1),
                           self.block_size), real


def token_slots(block_tables: torch.Tensor, rows, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Pool slots (int64) of the tokens at `positions` of the requests in `rows` of `block_tables`
    (`rows` is one request index for all positions, or a tensor with one per position)."""
    return block_tables[rows, positions // block_size].long() * block_size + positions % block_size


def decode_split_count(num_requests: int, kv_heads: int, max_seq_len: int, multiprocessors: int, *,
                       min_keys_per_split: int = 256, max_keys_per_split: int = 512, max_splits: int = 16) -> int:
    """Key-range splits per (request, KV head) for split-K decode attention (1 when `multiprocessors`
    is 0: not a GPU). Enough that no program walks more than `max_keys_per_split` keys of the longest
    request, since the batch waits for that program (on an H100, decode batches of 5-16 requests with
    3,400-4,000 cached tokens in all took 9.5 ms where one request held 1,200+ of them and 7.6 ms
    where none held 800, one program per request: bench/results/NOTES.md), and for about two programs
    per multiprocessor where the requests x KV heads programs do not fill them; each split has at
    least `min_keys_per_split` keys. (In a CUDA graph `max_seq_len` is the table's capacity: a
    shorter request's programs past its length return at once.)"""
    programs = num_requests * kv_heads
    if programs == 0 or multiprocessors <= 0:
        return 1
    by_occupancy = -(-2 * multiprocessors // programs) if programs < multiprocessors else 1
    # ... unless the programs are already many: then the others fill the wait (at most ~32 a multiprocessor)
    by_tail = min(-(-max_seq_len // max_keys_per_split), max(1, 32 * multiprocessors // programs))
    by_length = max(1, max_seq_len // min_keys_per_split)
    return max(1, min(max_splits, by_length, max(by_occupancy, by_tail)))
