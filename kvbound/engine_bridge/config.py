"""Named model shapes (a contract: `llama-2-7b`, `tiny`) and the executor's settings."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import InputError


@dataclass(frozen=True)
class ModelShape:
    """A Llama-architecture decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    layers: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


SHAPES: dict[str, ModelShape] = {
    # the real layer shapes of Llama-2-7B (its config.json); weights are random
    "llama-2-7b": ModelShape("llama-2-7b", hidden=4096, heads=32, kv_heads=32, intermediate=11008, vocab=32000,
                             layers=32),
    # small enough that a batch takes a few milliseconds on one CPU core, with GQA (2 query heads per KV head)
    "tiny": ModelShape("tiny", hidden=256, heads=4, kv_heads=2, intermediate=688, vocab=1024, layers=4),
}


def model_shape(name: str, layers: int | None = None) -> ModelShape:
    """The named shape, with `layers` decoder layers instead of its own when given."""
    if name not in SHAPES:
        raise InputError("", "shape", f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    shape = SHAPES[name]
    if layers is not None:
        if layers < 1:
            raise InputError("", "layers", f"must be >= 1, got {layers}")
        shape = dataclasses.replace(shape, layers=layers)
    return shape
