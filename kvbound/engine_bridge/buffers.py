"""Static device buffers holding one batch's inputs, sized once for the largest batch.

The model run reads views of their first rows. Writing every batch into the same memory is
what lets a captured CUDA graph replay with new inputs (a graph records addresses, not
values); on CPU it costs one copy per array, outside the timed model run.
"""
from __future__ import annotations

from types import ModuleType

import torch

from ..kernels import PagedBatch
from .model import ForwardContext
from .prepare import HostBatch


_FIELDS = ("token_ids", "positions", "slot_mapping", "block_tables", "seq_lens", "query_lens", "query_starts",
           "row_starts")


class BatchBuffers:
    """Token ids, positions, slot mapping `[max_tokens]` and block tables, lengths and query
    offsets `[max_requests, ...]` on the runner's device."""

    def __init__(self, device: torch.device, *, max_tokens: int, max_requests: int, table_width: int):
        self.max_tokens, self.max_requests = max_tokens, max_requests

        def zeros(*size, dtype=torch.int64):
            return torch.zeros(*size, dtype=dtype, device=device)

        self.token_ids, self.positions, self.slot_mapping = zeros(max_tokens), zeros(max_tokens), zeros(max_tokens)
        self.block_tables = zeros(max_requests, table_width, dtype=torch.int32)
        self.seq_lens, self.query_lens, self.query_starts, self.row_starts = (zeros(max_requests, dtype=torch.int32)
                                                                              for _ in range(4))
        # CUDA: page-locked host twins, so the uploads are asynchronous DMA copies. Reusing them
        # is safe: the executor's timer synchronises the device before the next batch is loaded.
        self._staging = ({name: torch.empty_like(getattr(self, name), device="cpu").pin_memory()
                          for name in _FIELDS} if device.type == "cuda" else None)

    def load(self, batch: HostBatch) -> None:
        """Copy `batch` into the first rows."""
        if batch.num_tokens > self.max_tokens or batch.num_requests > self.max_requests:
            raise ValueError(f"a batch of {batch.num_tokens} tokens of {batch.num_requests} requests exceeds the "
                             f"buffers ({self.max_tokens} tokens, {self.max_requests} requests) the executor was "
                             "built for")
        for name in _FIELDS:
            host = torch.from_numpy(getattr(batch, name))
            if self._staging is not None:
                host = self._staging[name][:len(host)].copy_(host)
            getattr(self, name)[:len(host)].copy_(host, non_blocking=self._staging is not None)

    def inputs(self, ops: ModuleType, kv_caches, block_size: int, *, num_tokens: int, num_requests: int,
               num_decode: int, max_prefill_query_len: int, decode_splits: int = 1, one_attention: bool = False,
               prefill_splits: int = 1) -> tuple[torch.Tensor, torch.Tensor, ForwardContext]:
        """Token ids, positions and the forward context of a batch loaded with these sizes: views
        of the buffers, so a graph captured on them reads whatever is loaded next. `one_attention`:
        the prefill kernel serves every row, the decode-type requests as one-token chunks (one
        launch a layer instead of two or three)."""

        def paged(rows: slice, max_query_len: int, splits: int, starts: torch.Tensor) -> PagedBatch | None:
            if rows.start == rows.stop:
                return None
            return PagedBatch(self.block_tables[rows], self.seq_lens[rows], self.query_lens[rows],
                              starts[rows], max_query_len, block_size, splits)

        if one_attention:
            ctx = ForwardContext(ops, self.slot_mapping[:num_tokens], 0, None,
                                 paged(slice(0, num_requests), max(1, max_prefill_query_len), prefill_splits,
                                       self.row_starts),
                                 kv_caches)
        else:
            ctx = ForwardContext(ops, self.slot_mapping[:num_tokens], num_decode,
                                 paged(slice(0, num_decode), 1, decode_splits, self.query_starts),
                                 paged(slice(num_decode, num_requests), max_prefill_query_len, prefill_splits,
                                       self.query_starts),
                                 kv_caches)
        return self.token_ids[:num_tokens], self.positions[:num_tokens], ctx
