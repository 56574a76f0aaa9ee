"""The block allocator: fixed-size KV blocks handed out from a free list (PagedAttention, Section 4.2).

A sequence holding t cached tokens owns ceil(t / block_size) blocks, listed in its block
table in sequence order; any free block will do, so there is no fragmentation beyond the
partly filled last block of each sequence.
"""
from __future__ import annotations

from collections import deque

from ..accounting import block_count
from .sequence import Sequence


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than a batch needs (a schedule that passed validation never does this)."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return block_count(tokens, self.block_size)

    def allocate(self, seq: Sequence, tokens: int) -> None:
        """Make `seq`'s block table hold `tokens` tokens: a fresh table, or appended blocks as it grows."""
        need = self.blocks_for(tokens) - len(seq.block_table)
        if need > len(self._free):
            raise OutOfBlocks(f"request {seq.id} needs {need} more KV blocks, {len(self._free)} of "
                              f"{self.num_blocks} are free")
        seq.block_table.extend(self._free.popleft() for _ in range(need))

    def free(self, seq: Sequence) -> None:
        self._free.extend(seq.block_table)
        seq.block_table.clear()
