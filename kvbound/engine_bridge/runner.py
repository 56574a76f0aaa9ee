"""The model runner: the model, its per-layer KV block pools, the static batch buffers, and
the two halves of executing a batch: `prepare` (host: the batch's arrays, copied into the
buffers) and `run` (device: the forward pass). On CUDA with the Triton kernels a decode-only
batch replays one captured CUDA graph, a mixed or prefill batch of up to PIECEWISE_MAX_TOKENS
tokens the piecewise graphs (attention eager between them), and a larger one runs eagerly:
its GPU work outlasts the host's launches."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import backend, decode_split_count
from ..kernels.layout import PREFILL_TILE_M, new_pool
from ..kernels.tuning import kernel_config
from .buffers import BatchBuffers
from .config import ModelShape
from .graphs import DecodeGraphs, graph_batch_sizes
from .model import LlamaModel
from .piecewise import PiecewiseGraphs, token_sizes
from .prepare import HostBatch, prepare_batch
from .sequence import Sequence


#: mixed and prefill batches of up to this many tokens run as piecewise graphs (on an H100 an eager
#: pass of llama-2-7b issues ~13 ms of launches; a batch of 1,024 tokens computes for longer)
PIECEWISE_MAX_TOKENS = 1024


#: a mixed batch runs its decode-type requests in the prefill kernel (one attention launch a layer) while
#: they hold at most this many cached tokens: there the batch is short enough to wait for the host's
#: launches (a 47-token chunk beside 10 decodes of 3,799 tokens: 13.1 ms where its work is ~9 ms,
#: bench/results/replay_cuda.md); beyond it the decode kernel reads their KV, whose tiles hold one query
#: row per head (16 with tensor cores), where the prefill kernel's 64-row tiles would compute 64 times
#: the products a one-token query needs
ONE_ATTENTION_MAX_DECODE_KV = 8192


def one_attention(host: HostBatch, decode_splits: int, prefill_split: bool = False) -> bool:
    """Whether a batch's attention runs as one prefill-kernel launch a layer: a mixed batch whose
    decode-type requests hold at most ONE_ATTENTION_MAX_DECODE_KV cached tokens and need no split-K,
    or may have it from the prefill kernel (`prefill_split`)."""
    return (0 < host.num_decode < host.num_requests and (decode_splits == 1 or prefill_split)
            and int(host.seq_lens[:host.num_decode].sum()) <= ONE_ATTENTION_MAX_DECODE_KV)


@dataclass(frozen=True)
class PreparedBatch:
    """A batch loaded into the buffers: its host arrays and, when it runs in a graph, the graph's size
    (`graph_size`: requests of a decode graph; `piece_size`: tokens of the piecewise graphs)."""

    host: HostBatch
    graph_size: int | None
    piece_size: int | None = None

    @property
    def path(self) -> str:
        """How the batch runs: "graph" (a decode graph), "pieces" (piecewise graphs) or "eager"."""
        return "graph" if self.graph_size is not None else "pieces" if self.piece_size is not None else "eager"


class ModelRunner:
    """Owns the weights and a K and a V pool `[num_blocks + 1, block_size, kv_heads, head_dim]` per
    layer; the extra block is the dummy block that padded graph rows write to (never allocated).

    `table_width` is the number of block-table columns of every batch (the most blocks a
    sequence can hold): fixed shapes, so the Triton kernels compile once. `max_batch_tokens`
    and `max_batch_requests` size the static buffers (the largest batch the executor runs).
    """

    def __init__(self, shape: ModelShape, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                 kernels: str | None = None, num_blocks: int, block_size: int, table_width: int,
                 max_batch_tokens: int, max_batch_requests: int, graphs: bool | None = None,
                 piecewise_tokens: int | None = None, prefill_split: bool = False, seed: int = 0):
        self.device = torch.device(device)
        self.dtype = dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)
        self.kernels = kernels or ("triton" if self.device.type == "cuda" else "torch")
        self.ops = backend(self.kernels)
        self.shape, self.block_size, self.table_width = shape, block_size, table_width
        self.model = LlamaModel.random(shape, self.device, self.dtype, seed)
        self.dummy_block = num_blocks
        # the pool's memory layout: the one tuned for this GPU's kernels (kernels/tuning.py)
        on_gpu = self.device.type == "cuda" and self.kernels == "triton"
        self.kv_layout = kernel_config(self.device if on_gpu else None).layout
        pool = (num_blocks + 1, block_size, shape.kv_heads, shape.head_dim)
        self.kv_caches = [tuple(new_pool(*pool, layout=self.kv_layout, dtype=self.dtype, device=self.device)
                                for _ in "kv") for _ in range(shape.layers)]
        self.buffers = BatchBuffers(self.device, max_tokens=max(max_batch_tokens, max_batch_requests),
                                    max_requests=max_batch_requests, table_width=table_width)
        # split-K only where the Triton kernels run on a GPU whose multiprocessors they must fill
        self.multiprocessors = (torch.cuda.get_device_properties(self.device).multi_processor_count
                                if self.device.type == "cuda" and self.kernels == "triton" else 0)
        self.prefill_split = prefill_split
        # graphs need CUDA, and kernels without host synchronisation (the PyTorch twins have some)
        if graphs is None:
            graphs = self.device.type == "cuda" and self.kernels == "triton"
        if graphs and (self.device.type != "cuda" or self.kernels != "triton"):
            raise ValueError("CUDA graphs need device cuda and the triton kernels")
        self.graphs = DecodeGraphs(graph_batch_sizes(max_batch_requests), self._run_decode) if graphs else None
        piecewise_tokens = min(max_batch_tokens, PIECEWISE_MAX_TOKENS if piecewise_tokens is None else piecewise_tokens)
        self.pieces = (PiecewiseGraphs(self.model, self.ops, token_sizes(piecewise_tokens),
                                       lambda: self.buffers.token_ids, lambda: self.buffers.positions, self.device,
                                       self.dtype) if graphs and piecewise_tokens > 0 else None)

    def capture_graphs(self) -> None:
        """Capture the decode graphs (if enabled), on an all-dummy batch of the largest size, and the
        piecewise graphs of mixed batches."""
        if self.graphs is None or self.graphs.captured:
            return
        self.buffers.load(self._host([], 0, pad_to=self.graphs.sizes[-1]))
        with torch.inference_mode():
            self.graphs.capture()
            if self.pieces is not None:
                self.pieces.capture()

    def _host(self, work: list[tuple[Sequence, int]], num_decode: int, pad_to: int | None = None) -> HostBatch:
        return prepare_batch(work, num_decode, block_size=self.block_size, table_width=self.table_width,
                             dummy_block=self.dummy_block, pad_to=pad_to)

    def prepare(self, work: list[tuple[Sequence, int]], num_decode: int) -> PreparedBatch:
        """Build the batch that processes c tokens of each (sequence, c) in `work` (decode-type ones
        first, `num_decode` of them; blocks allocated) and load it into the buffers. A decode-only
        batch that a captured graph holds is padded to that graph's size."""
        size = pieces = None
        if num_decode == len(work):
            if self.graphs is not None and self.graphs.captured:
                size = self.graphs.size_for(len(work))
        elif self.pieces is not None and self.pieces.captured:
            pieces = self.pieces.size_for(sum(c for _, c in work))
        host = self._host(work, num_decode, pad_to=size)
        self.buffers.load(host)
        return PreparedBatch(host, size, pieces)

    @torch.inference_mode()
    def run(self, batch: PreparedBatch) -> torch.Tensor:
        """The final hidden states [sum c, hidden] of a prepared batch, in `work` order."""
        if batch.graph_size is not None:
            return self.graphs.replay(batch.graph_size)[:batch.host.real_tokens]
        host = batch.host
        splits = decode_split_count(host.num_decode, self.shape.kv_heads, host.max_decode_seq_len,
                                    self.multiprocessors)
        one = one_attention(host, splits, self.prefill_split)
        inputs = self._inputs(host.num_tokens, host.num_requests, host.num_decode, host.max_prefill_query_len, splits,
                              one_attention=one, prefill_splits=self._prefill_splits(host, one))
        if batch.piece_size is not None:
            return self.pieces.run(batch.piece_size, inputs[2])[:host.real_tokens]
        return self.model(*inputs)

    def _prefill_splits(self, host: HostBatch, one: bool) -> int:
        """Key-range splits of the prefill kernel's programs (1 unless `prefill_split`): as for decode, so
        that no program walks more than ~512 keys while its (request, head, query tile) programs are
        few; the rows it serves are the prefill-type requests, or every request under `one`."""
        first = 0 if one else host.num_decode
        if not self.prefill_split or first == host.num_requests:
            return 1
        tiles = -(-max(1, host.max_prefill_query_len) // PREFILL_TILE_M)
        return decode_split_count((host.num_requests - first) * tiles, self.shape.heads,
                                  int(host.seq_lens[first:].max()), self.multiprocessors)

    def _inputs(self, num_tokens, num_requests, num_decode, max_prefill_query_len, decode_splits, one_attention=False,
                prefill_splits=1):
        return self.buffers.inputs(self.ops, self.kv_caches, self.block_size, num_tokens=num_tokens,
                                   num_requests=num_requests, num_decode=num_decode,
                                   max_prefill_query_len=max_prefill_query_len, decode_splits=decode_splits,
                                   one_attention=one_attention, prefill_splits=prefill_splits)

    def _run_decode(self, size: int) -> torch.Tensor:
        # any sequence length up to the table's capacity may replay in this graph
        splits = decode_split_count(size, self.shape.kv_heads, self.table_width * self.block_size,
                                    self.multiprocessors)
        return self.model(*self._inputs(size, size, size, 0, splits))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)
