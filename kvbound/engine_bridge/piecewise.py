"""Mixed and prefill batches as piecewise CUDA graphs: everything but attention replayed from graphs,
attention run eagerly between them (vLLM V1's piecewise graphs).

An eager forward pass of a 32-layer model issues hundreds of launches; a batch whose GPU work is
shorter than their host time waits for the host (on an H100, ~13 ms for llama-2-7b: a mixed
batch of a small chunk beside a few thousand cached decode tokens took 12.9-13.7 ms where its
work predicted 9.7 ms; bench/results/replay_cuda.md). The layers' projections, norms, rotary and
MLP depend only on the number of tokens, so they are captured once per padded token count, one
graph per stretch between two attentions (layers + 1 of them). Attention depends on each
request's chunk and cache, so it runs eagerly with the batch's own grid on the real tokens. The
pieces read and write static activation buffers (`Activations`), sized for the largest batch,
so that each piece's own intermediates are scratch that every capture may share. Measured on an
H100 (docs/executor.md): small mixed batches still wait for the host, whose per-layer attention
launches remain; capturing attention as well is the next step.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .model import ForwardContext, LlamaModel, into, rotary_tables


def token_sizes(max_tokens: int) -> list[int]:
    """Padded token counts with a graph: multiples of 16 up to 256, then of 32 up to `max_tokens`.
    Padding costs the padded tokens' projections (at most 1/8 of a batch's above 256 tokens, where
    the batch is long enough that the padding stays small against its attention and MLP)."""
    sizes = list(range(16, min(max_tokens, 256) + 1, 16)) + list(range(288, max_tokens + 1, 32))
    return sizes or [max_tokens]


class Activations:
    """The static buffers the pieces hand to each other: the residual stream, the fused q/k/v
    projection, attention's output, the rotary tables and the final hidden states."""

    def __init__(self, model: LlamaModel, max_tokens: int, device: torch.device, dtype: torch.dtype):
        shape = model.shape
        self.residual = torch.zeros(max_tokens, shape.hidden, dtype=dtype, device=device)
        self.qkv = torch.zeros(max_tokens, (shape.heads + 2 * shape.kv_heads) * shape.head_dim, dtype=dtype,
                               device=device)
        self.attn = torch.zeros(max_tokens, shape.heads, shape.head_dim, dtype=dtype, device=device)
        self.cos = torch.zeros(max_tokens, shape.head_dim // 2, dtype=torch.float32, device=device)
        self.sin = torch.zeros_like(self.cos)
        self.hidden = torch.zeros(max_tokens, shape.hidden, dtype=dtype, device=device)


def cuda_record(piece: Callable[[], None], pool) -> torch.cuda.CUDAGraph:
    """`piece` captured as a CUDA graph in memory pool `pool` (a new one for None). The capture API
    itself rather than `torch.cuda.graph`, whose entry collects garbage and empties the allocator's
    cache: tens of milliseconds that a thousand pieces would pay each."""
    global _capture_stream
    if _capture_stream is None:
        _capture_stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    _capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_capture_stream):
        graph.capture_begin(pool=pool)
        try:
            piece()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(_capture_stream)
    return graph


_capture_stream = None  # captures run on a side stream (CUDA cannot capture the legacy default stream)


class PiecewiseGraphs:
    """Per padded token count, the captured pieces of one forward pass. `tokens()` and `positions()`
    are the static input buffers. `record(piece, pool)` captures a piece: CUDA's graphs unless
    given (the tests pass one whose replay calls the piece)."""

    def __init__(self, model: LlamaModel, ops, sizes: list[int], tokens: Callable[[], torch.Tensor],
                 positions: Callable[[], torch.Tensor], device: torch.device, dtype: torch.dtype, *,
                 record: Callable = cuda_record):
        self.model, self.ops, self.sizes = model, ops, sorted(sizes)
        self._tokens, self._positions = tokens, positions
        self.act = Activations(model, self.sizes[-1], device, dtype)
        self._record = record
        self._graphs: dict[int, list] = {}

    @property
    def captured(self) -> list[int]:
        return sorted(self._graphs)

    def size_for(self, num_tokens: int) -> int | None:
        return next((s for s in self.sizes if s >= num_tokens), None)

    # ------------------------------------------------------------------ the pieces

    def _piece(self, index: int, size: int) -> None:
        """Piece `index` of a forward pass over the first `size` rows: the end of layer index - 1
        (none for the first) and the start of layer `index` up to its attention (none for the last)."""
        act, layers, ops = self.act, self.model.layers, self.ops
        residual, rope = act.residual[:size], (act.cos[:size], act.sin[:size])
        if index == 0:
            cos, sin = rotary_tables(self._positions()[:size], self.model.shape.head_dim, self.model.shape.rope_theta)
            into(act.cos[:size], cos)
            into(act.sin[:size], sin)
            into(residual, self.model.embed(self._tokens()[:size]))
            x, stream = residual, None
        else:
            x, stream = layers[index - 1].after_attention(act.attn[:size], residual, self.ops)
            into(residual, stream)
        if index == len(layers):
            torch.add(x, residual, out=act.hidden[:size])
            return
        *_, stream = layers[index].before_attention(x, stream, rope, ops, qkv_out=act.qkv[:size])
        into(residual, stream)

    def _attend(self, layer: int, size: int, ctx: ForwardContext) -> None:
        attn = self.model.layers[layer].attn
        q, k, v = self.act.qkv[:size].view(size, attn.heads + 2 * attn.kv_heads, attn.head_dim).split(
            [attn.heads, attn.kv_heads, attn.kv_heads], dim=1)
        attn.attend(q, k, v, ctx, self.act.attn[:size])

    # ------------------------------------------------------------------ capture and run

    def capture(self) -> None:
        """Capture every size, largest first, all in one memory pool: the pieces keep nothing in it
        between replays (what they hand on is in `Activations`), so the captures may share it."""
        pool = None
        for size in reversed(self.sizes):
            graphs = []
            for index in range(len(self.model.layers) + 1):
                piece = functools.partial(self._piece, index, size)
                piece()  # eager first: kernels compile and allocations settle outside the capture
                graph = self._record(piece, pool)
                pool = graph.pool() if pool is None else pool
                graphs.append(graph)
            self._graphs[size] = graphs

    def run(self, size: int, ctx: ForwardContext) -> torch.Tensor:
        """The final hidden states `[size, hidden]` (real tokens first) of the batch the input
        buffers hold, whose attention is described by `ctx` (its real tokens only)."""
        graphs = self._graphs[size]
        for layer, graph in enumerate(graphs[:-1]):
            graph.replay()
            self._attend(layer, size, ctx)
        graphs[-1].replay()
        return self.act.hidden[:size]
