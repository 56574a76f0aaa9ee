"""The model runner: the model, its per-layer KV block pools, and one forward pass over a batch."""
from __future__ import annotations

import torch

from ..kernels import PagedBatch, backend, token_slots
from .config import ModelShape
from .model import ForwardContext, LlamaModel
from .sequence import Sequence


class ModelRunner:
    """Owns the weights and a K and a V pool `[num_blocks, block_size, kv_heads, head_dim]` per layer.

    `table_width` is the number of block-table columns of every batch (the most blocks a
    sequence can hold): fixed shapes, so the Triton kernels compile once.
    """

    def __init__(self, shape: ModelShape, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                 kernels: str | None = None, num_blocks: int, block_size: int, table_width: int, seed: int = 0):
        self.device = torch.device(device)
        self.dtype = dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)
        self.kernels = kernels or ("triton" if self.device.type == "cuda" else "torch")
        self.ops = backend(self.kernels)
        self.shape, self.block_size, self.table_width = shape, block_size, table_width
        self.model = LlamaModel.random(shape, self.device, self.dtype, seed)
        pool = (num_blocks, block_size, shape.kv_heads, shape.head_dim)
        # zeros, not empty: garbage in unused slots could be NaN or denormal and slow the CPU down
        self.kv_caches = [(torch.zeros(pool, dtype=self.dtype, device=self.device),
                           torch.zeros(pool, dtype=self.dtype, device=self.device)) for _ in range(shape.layers)]

    @torch.inference_mode()
    def forward(self, work: list[tuple[Sequence, int]], num_decode: int) -> torch.Tensor:
        """Process c tokens of each (sequence, c) in `work` (decode-type ones first, `num_decode` of
        them), writing their KV at the sequence's next positions; blocks must be allocated already.
        Returns the final hidden states [sum c, hidden], in `work` order."""
        query_lens = torch.tensor([c for _, c in work])
        seq_lens = torch.tensor([seq.cached + c for seq, c in work])
        tables = torch.zeros(len(work), self.table_width, dtype=torch.int32)
        for r, (seq, _) in enumerate(work):
            tables[r, :len(seq.block_table)] = torch.tensor(seq.block_table, dtype=torch.int32)
        # each token's request row and position: the c positions after the request's m cached tokens
        owner = torch.repeat_interleave(torch.arange(len(work)), query_lens)
        positions = torch.arange(owner.numel()) - (query_lens.cumsum(0) - query_lens)[owner] \
            + (seq_lens - query_lens)[owner]
        slots = token_slots(tables, owner, positions, self.block_size)
        tokens = torch.tensor([t for seq, c in work for t in seq.tokens[seq.cached:seq.cached + c]])

        def on_device(x: torch.Tensor) -> torch.Tensor:
            return x.to(self.device, non_blocking=True)

        def paged(rows: slice) -> PagedBatch | None:
            if rows.start == rows.stop:
                return None
            lens = query_lens[rows]
            return PagedBatch(on_device(tables[rows]), on_device(seq_lens[rows].int()), on_device(lens.int()),
                              on_device((lens.cumsum(0) - lens).int()), int(lens.max()), self.block_size)

        ctx = ForwardContext(self.ops, on_device(slots), num_decode, paged(slice(0, num_decode)),
                             paged(slice(num_decode, len(work))), self.kv_caches)
        return self.model(on_device(tokens), on_device(positions), ctx)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)
