"""Plain-PyTorch twins of the Triton kernels: the executor's CPU path and the kernels' test oracle.

Written for obvious correctness first: gather each request's keys from the pool by slot,
then PyTorch's dense attention with a mask. Decode attention is one call for all decode
requests, padded to the longest (no per-request overhead); prefill attention is one causal
call per request (its overhead is the cost model's `per_prefill_request` term). Decode
attention ignores `PagedBatch.num_splits` (split-K only changes the Triton kernel's order of
summation). The fused layer operations (`add_rms_norm`, `rotary_`, `silu_mul`) are the
unfused PyTorch expressions they replace.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .layout import PagedBatch


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store the K and V rows `[T, kv_heads, head_dim]` of T new tokens at their pool slots `[T]`."""
    for cache, rows in ((k_cache, key), (v_cache, value)):
        if cache.is_contiguous():
            cache.view(-1, *rows.shape[1:]).index_copy_(0, slot_mapping, rows)
        else:  # a pool in another memory layout (layout.new_pool)
            block_size = cache.shape[1]
            cache[slot_mapping // block_size, slot_mapping % block_size] = rows


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows [len(slots), kv_heads, head_dim] of a pool. index_select over 2-D rows: on CPU it is
    several times faster than [] indexing or index_select over the 3-D view."""
    kv_heads, dim = cache.shape[2:]
    if not cache.is_contiguous():  # a pool in another memory layout (layout.new_pool)
        return cache[slots // cache.shape[1], slots % cache.shape[1]]
    return cache.view(-1, kv_heads * dim).index_select(0, slots).view(-1, kv_heads, dim)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """q `[R, heads, head_dim]`, one query per request; request r attends to its seq_lens[r] cached tokens.
    Writes into `out` (same shape as q) when given."""
    slots, real = batch.padded_key_slots
    k = _gather(k_cache, slots.flatten()).view(*slots.shape, *k_cache.shape[2:]).transpose(1, 2)
    v = _gather(v_cache, slots.flatten()).view(*slots.shape, *v_cache.shape[2:]).transpose(1, 2)
    # k, v: [R, kv_heads, longest, head_dim]
    attn = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=real[:, None, None, :], enable_gqa=True)
    if out is None:
        return attn.squeeze(2)
    return out.copy_(attn.squeeze(2))


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """q `[T, heads, head_dim]`: each request's c query rows, at positions seq_len - c .. seq_len - 1,
    attend causally to the request's cached prefix and the chunk up to themselves. Writes into `out`
    (same shape as q) when given."""
    out = torch.empty_like(q) if out is None else out
    rows = zip(batch.query_starts.tolist(), batch.query_lens.tolist(), batch.key_slots)
    for start, c, slots in rows:
        n = len(slots)
        # query i is at position n - c + i and may see keys 0 .. n - c + i
        visible = torch.ones(c, n, dtype=torch.bool, device=q.device).tril(n - c)
        attn = F.scaled_dot_product_attention(q[start:start + c].transpose(0, 1), _gather(k_cache, slots).transpose(0, 1),
                                              _gather(v_cache, slots).transpose(0, 1), attn_mask=visible, enable_gqa=True)
        out[start:start + c] = attn.transpose(0, 1)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of x `[T, hidden]` (a new tensor)."""
    return F.rms_norm(x, weight.shape, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual): the residual stream of a pre-norm decoder layer.
    The Triton twin overwrites x and residual with them; this one allocates."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q `[T, heads, head_dim]` and k `[T, kv_heads, head_dim]` in place by their tokens'
    angles (cos, sin `[T, head_dim / 2]`, float32), the half-split convention of the Llama reference
    code, computed in float32."""
    for x in (q, k):
        x1, x2 = x.float().chunk(2, dim=-1)
        c, s = cos[:, None], sin[:, None]
        x.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's SiLU(gate) * up of `[T, 2 * intermediate]` (gate first, then up): `[T, intermediate]`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
