"""Paged-KV kernels: Triton kernels and their plain-PyTorch reference twins.

Both backends implement the same operations with the same signatures:

* `write_kv(key, value, k_cache, v_cache, slot_mapping)`: store each new token's K and V
  in the block pool at its slot;
* `decode_attention(q, k_cache, v_cache, batch)`: one query per request (its last token)
  attending to the request's whole cache;
* `prefill_attention(q, k_cache, v_cache, batch)`: a chunk of c tokens per request
  attending causally to its m cached tokens plus the chunk up to itself;
* the fused layer operations `rms_norm`, `add_rms_norm`, `rotary_` (q and k in place) and
  `silu_mul`.

Decode attention splits each request's keys over `PagedBatch.num_splits` programs
(split-K, flash-decoding) in the Triton backend; `decode_split_count` picks that number.

The pool layout and `PagedBatch` are in `layout.py`. `reference` runs anywhere (the
executor's CPU path and the kernels' test oracle); `triton` needs a GPU, or
`TRITON_INTERPRET=1` set before triton is imported (CPU, slow: tests only).
"""
from __future__ import annotations

from types import ModuleType

from .layout import PagedBatch, decode_split_count, token_slots

KERNEL_BACKENDS = ("torch", "triton")


def backend(name: str) -> ModuleType:
    """The module holding the three operations of backend `name` (imported on demand)."""
    if name == "torch":
        from . import reference
        return reference
    if name == "triton":
        from . import triton_ops
        return triton_ops
    raise ValueError(f"unknown kernel backend {name!r}; known: {', '.join(KERNEL_BACKENDS)}")


__all__ = ["KERNEL_BACKENDS", "PagedBatch", "backend", "decode_split_count", "token_slots"]
