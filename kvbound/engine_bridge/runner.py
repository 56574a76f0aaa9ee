"""The model runner: the model, its per-layer KV block pools, the static batch buffers, and
the two halves of executing a batch: `prepare` (host: the batch's arrays, copied into the
buffers) and `run` (device: the forward pass, from a captured CUDA graph for decode-only
batches on CUDA with the Triton kernels, eagerly otherwise)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import backend, decode_split_count
from .buffers import BatchBuffers
from .config import ModelShape
from .graphs import DecodeGraphs, graph_batch_sizes
from .model import LlamaModel
from .prepare import HostBatch, prepare_batch
from .sequence import Sequence


@dataclass(frozen=True)
class PreparedBatch:
    """A batch loaded into the buffers: its host arrays and, when it runs in a graph, the graph's size."""

    host: HostBatch
    graph_size: int | None


class ModelRunner:
    """Owns the weights and a K and a V pool `[num_blocks + 1, block_size, kv_heads, head_dim]` per
    layer; the extra block is the dummy block that padded graph rows write to (never allocated).

    `table_width` is the number of block-table columns of every batch (the most blocks a
    sequence can hold): fixed shapes, so the Triton kernels compile once. `max_batch_tokens`
    and `max_batch_requests` size the static buffers (the largest batch the executor runs).
    """

    def __init__(self, shape: ModelShape, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                 kernels: str | None = None, num_blocks: int, block_size: int, table_width: int,
                 max_batch_tokens: int, max_batch_requests: int, graphs: bool | None = None, seed: int = 0):
        self.device = torch.device(device)
        self.dtype = dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)
        self.kernels = kernels or ("triton" if self.device.type == "cuda" else "torch")
        self.ops = backend(self.kernels)
        self.shape, self.block_size, self.table_width = shape, block_size, table_width
        self.model = LlamaModel.random(shape, self.device, self.dtype, seed)
        self.dummy_block = num_blocks
        pool = (num_blocks + 1, block_size, shape.kv_heads, shape.head_dim)
        # zeros, not empty: garbage in unused slots could be NaN or denormal and slow the CPU down
        self.kv_caches = [(torch.zeros(pool, dtype=self.dtype, device=self.device),
                           torch.zeros(pool, dtype=self.dtype, device=self.device)) for _ in range(shape.layers)]
        self.buffers = BatchBuffers(self.device, max_tokens=max(max_batch_tokens, max_batch_requests),
                                    max_requests=max_batch_requests, table_width=table_width)
        # split-K decode only where the Triton kernel runs on a GPU whose multiprocessors it must fill
        self.multiprocessors = (torch.cuda.get_device_properties(self.device).multi_processor_count
                                if self.device.type == "cuda" and self.kernels == "triton" else 0)
        # graphs need CUDA, and kernels without host synchronisation (the PyTorch twins have some)
        if graphs is None:
            graphs = self.device.type == "cuda" and self.kernels == "triton"
        if graphs and (self.device.type != "cuda" or self.kernels != "triton"):
            raise ValueError("CUDA graphs need device cuda and the triton kernels")
        self.graphs = DecodeGraphs(graph_batch_sizes(max_batch_requests), self._run_decode) if graphs else None

    def capture_graphs(self) -> None:
        """Capture the decode graphs (if enabled), on an all-dummy batch of the largest size."""
        if self.graphs is None or self.graphs.captured:
            return
        self.buffers.load(self._host([], 0, pad_to=self.graphs.sizes[-1]))
        with torch.inference_mode():
            self.graphs.capture()

    def _host(self, work: list[tuple[Sequence, int]], num_decode: int, pad_to: int | None = None) -> HostBatch:
        return prepare_batch(work, num_decode, block_size=self.block_size, table_width=self.table_width,
                             dummy_block=self.dummy_block, pad_to=pad_to)

    def prepare(self, work: list[tuple[Sequence, int]], num_decode: int) -> PreparedBatch:
        """Build the batch that processes c tokens of each (sequence, c) in `work` (decode-type ones
        first, `num_decode` of them; blocks allocated) and load it into the buffers. A decode-only
        batch that a captured graph holds is padded to that graph's size."""
        size = None
        if self.graphs is not None and self.graphs.captured and num_decode == len(work):
            size = self.graphs.size_for(len(work))
        host = self._host(work, num_decode, pad_to=size)
        self.buffers.load(host)
        return PreparedBatch(host, size)

    @torch.inference_mode()
    def run(self, batch: PreparedBatch) -> torch.Tensor:
        """The final hidden states [sum c, hidden] of a prepared batch, in `work` order."""
        if batch.graph_size is not None:
            return self.graphs.replay(batch.graph_size)[:batch.host.real_tokens]
        host = batch.host
        splits = decode_split_count(host.num_decode, self.shape.kv_heads, host.max_decode_seq_len,
                                    self.multiprocessors)
        return self.model(*self._inputs(host.num_tokens, host.num_requests, host.num_decode,
                                        host.max_prefill_query_len, splits))

    def _inputs(self, num_tokens, num_requests, num_decode, max_prefill_query_len, decode_splits):
        return self.buffers.inputs(self.ops, self.kv_caches, self.block_size, num_tokens=num_tokens,
                                   num_requests=num_requests, num_decode=num_decode,
                                   max_prefill_query_len=max_prefill_query_len, decode_splits=decode_splits)

    def _run_decode(self, size: int) -> torch.Tensor:
        # any sequence length up to the table's capacity may replay in this graph
        splits = decode_split_count(size, self.shape.kv_heads, self.table_width * self.block_size,
                                    self.multiprocessors)
        return self.model(*self._inputs(size, size, size, 0, splits))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)
