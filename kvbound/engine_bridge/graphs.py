"""Decode-only batches as CUDA graphs, one per padded batch size (nano-vllm and vLLM do the same).

A decode step of a large model is launch-bound: hundreds of small kernels whose launch
overhead exceeds their run time at small batch sizes. A CUDA graph records the launches of
one forward pass over the static input buffers once and replays them with one call. Graphs
have fixed shapes, so a decode batch of n requests runs in the graph of the smallest captured
size >= n, its extra rows padded with dummy requests (see prepare.HostBatch). Mixed and
prefill batches, whose token counts vary freely, run eagerly.
"""
from __future__ import annotations

from collections.abc import Callable

import torch


def graph_batch_sizes(max_requests: int) -> list[int]:
    """1, 2, 4, 8, ... below `max_requests`, then `max_requests` itself (the largest batch)."""
    sizes, size = [], 1
    while size < max_requests:
        sizes.append(size)
        size *= 2
    return sizes + [max_requests]


def padded_batch_size(num_requests: int, sizes: list[int]) -> int | None:
    """The smallest of `sizes` that holds `num_requests` rows, None if none does."""
    return next((s for s in sorted(sizes) if s >= num_requests), None)


class DecodeGraphs:
    """One captured forward pass per size. `run_decode(size)` runs the model on the first `size`
    rows of the static buffers as a decode-only batch and returns its hidden states; the
    graph factory and capture context are CUDA's unless given (the tests pass fakes)."""

    def __init__(self, sizes: list[int], run_decode: Callable[[int], torch.Tensor], *,
                 new_graph: Callable[[], object] | None = None, capturing: Callable | None = None):
        self.sizes = sorted(sizes)
        self._run_decode = run_decode
        self._new_graph = new_graph or torch.cuda.CUDAGraph
        self._capturing = capturing or torch.cuda.graph
        self._graphs: dict[int, object] = {}
        self._outputs: dict[int, torch.Tensor] = {}

    @property
    def captured(self) -> list[int]:
        return sorted(self._graphs)

    def capture(self) -> None:
        """Capture every size, largest first so that the smaller graphs fit in its memory pool.
        The buffers must hold a valid (e.g. all-dummy) decode batch of the largest size."""
        pool = None
        for size in reversed(self.sizes):
            self._run_decode(size)  # eager first: kernels compile and allocations settle outside the capture
            graph = self._new_graph()
            with self._capturing(graph, pool=pool):
                self._outputs[size] = self._run_decode(size)
            pool = graph.pool() if pool is None else pool
            self._graphs[size] = graph

    def size_for(self, num_requests: int) -> int | None:
        return padded_batch_size(num_requests, self.sizes)

    def replay(self, size: int) -> torch.Tensor:
        """Run the graph of `size` on what the buffers hold now; its hidden states `[size, hidden]`
        (valid until the next replay: all graphs share one memory pool)."""
        self._graphs[size].replay()
        return self._outputs[size]
