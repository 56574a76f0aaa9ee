"""Batch preparation on the host: what the model run needs of one batch, as plain arrays.

Serving engines (nano-vllm's prepare_prefill / prepare_decode, vLLM's input preparation) build
these on the CPU and copy them into static device buffers before the forward pass, so that
the timed model run launches kernels only. Rows are ordered as the runner orders them:
decode-type requests first (one token each), then prefill-type requests (c tokens each).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sequence import Sequence


@dataclass(frozen=True)
class HostBatch:
    """One batch's inputs. Row r is a request, token t a processed token, in `work` order.

    A decode-only batch may be padded to a captured graph's size: padded rows are decode rows
    with one token at position 0 of a one-token sequence held in the dummy block, so their KV
    write lands in the dummy slot and their attention reads only it.
    """

    token_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64: the c positions after each request's m cached tokens
    slot_mapping: np.ndarray  # [T] int64: pool slot of each token's KV
    block_tables: np.ndarray  # [R, table_width] int32, unused columns 0
    seq_lens: np.ndarray  # [R] int32: m + c
    query_lens: np.ndarray  # [R] int32: c
    query_starts: np.ndarray  # [R] int32: first token row of each request within its kernel's slice
    row_starts: np.ndarray  # [R] int32: first token row of each request in the whole batch (one kernel for all)
    num_decode: int  # decode rows (the first ones), padded rows included
    real_requests: int  # rows before the padding
    real_tokens: int

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def max_prefill_query_len(self) -> int:
        return int(self.query_lens[self.num_decode:].max(initial=0))

    @property
    def max_decode_seq_len(self) -> int:
        return int(self.seq_lens[:self.num_decode].max(initial=0))


def prepare_batch(work: list[tuple[Sequence, int]], num_decode: int, *, block_size: int, table_width: int,
                  dummy_block: int, pad_to: int | None = None) -> HostBatch:
    """The inputs of processing c tokens of each (sequence, c) in `work` (decode-type ones first,
    `num_decode` of them, blocks already allocated), with `pad_to` rows when given (decode-only
    batches only)."""
    real = len(work)
    rows = real if pad_to is None else pad_to
    if rows < real or (rows > real and num_decode != real):
        raise ValueError(f"only a decode-only batch pads, and to at least its {real} rows (got {pad_to})")
    num_decode = rows if rows > real else num_decode  # padded rows are decode rows
    query_lens = np.ones(rows, dtype=np.int32)
    query_lens[:real] = [c for _, c in work]
    seq_lens = np.ones(rows, dtype=np.int32)
    seq_lens[:real] = [seq.cached + c for seq, c in work]
    tables = np.zeros((rows, table_width), dtype=np.int32)
    tables[real:, 0] = dummy_block
    for r, (seq, _) in enumerate(work):
        tables[r, :len(seq.block_table)] = seq.block_table
    # each token's row and position: the c positions after the row's m cached tokens
    firsts = np.cumsum(query_lens, dtype=np.int64) - query_lens
    owner = np.repeat(np.arange(rows), query_lens)
    positions = np.arange(len(owner), dtype=np.int64) - firsts[owner] + (seq_lens - query_lens)[owner]
    slots = tables[owner, positions // block_size].astype(np.int64) * block_size + positions % block_size
    token_ids = np.zeros(len(owner), dtype=np.int64)
    real_tokens = int(query_lens[:real].sum())
    token_ids[:real_tokens] = [t for seq, c in work for t in seq.tokens[seq.cached:seq.cached + c]]
    # each attention kernel gets its own slice of the query rows, numbered from 0
    query_starts = np.concatenate([firsts[:num_decode], firsts[num_decode:] - firsts[num_decode:num_decode + 1].sum()
                                   ]).astype(np.int32)
    return HostBatch(token_ids, positions, slots, tables, seq_lens, query_lens, query_starts, firsts.astype(np.int32),
                     num_decode, real, real_tokens)
