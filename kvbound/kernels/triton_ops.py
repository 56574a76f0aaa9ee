"""Triton kernels for the paged KV cache; `reference.py` holds their plain-PyTorch twins.

Keys are visited in tiles of BLOCK_N sequence positions; each position's pool slot is looked
up in the request's block table, so any KV block size works (the pool layout is in
`layout.py`). Softmax is computed online (running max and sum per query, flash-attention
style) in float32 whatever the storage dtype.

Per-batch values (lengths, offsets) are read from device tensors, never passed as Python
ints, so Triton does not specialise (and recompile) on them in the middle of a replay; the
constexpr tile sizes are fixed for the same reason.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import PagedBatch

BLOCK_M = 64  # query rows per prefill program
BLOCK_N = 64  # key positions per tile


@triton.jit
def _write_kv_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, key_stride, value_stride,
                     ROW: tl.constexpr, ROW_PAD: tl.constexpr):
    t = tl.program_id(0)  # one program per new token
    slot = tl.load(slot_ptr + t).to(tl.int64)
    cols = tl.arange(0, ROW_PAD)
    mask = cols < ROW
    key = tl.load(key_ptr + t * key_stride + cols, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + cols, key, mask=mask)
    value = tl.load(value_ptr + t * value_stride + cols, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + cols, value, mask=mask)


@triton.jit(do_not_specialize=["table_stride"])
def _decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, tables_ptr, seq_lens_ptr,
                   q_stride, out_stride, table_stride, scale,
                   BLOCK_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                   HEAD_DIM: tl.constexpr, TILE_N: tl.constexpr):
    # one program per (request, KV head): the GROUP query heads sharing that KV head read it once
    r = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + r)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    head_ok = g < GROUP
    q = tl.load(q_ptr + r * q_stride + heads[:, None] * HEAD_DIM + d[None, :], mask=head_ok[:, None], other=0.0)
    q = q.to(tl.float32)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, TILE_N):
        pos = start + tl.arange(0, TILE_N)
        valid = pos < seq_len
        block = tl.load(tables_ptr + r * table_stride + pos // BLOCK_SIZE, mask=valid, other=0)
        rows = (block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE) * (KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_PAD, TILE_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: position 0 is in the first tile
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + r * out_stride + heads[:, None] * HEAD_DIM + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=head_ok[:, None])


@triton.jit(do_not_specialize=["table_stride"])
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, tables_ptr, seq_lens_ptr, query_lens_ptr,
                    query_starts_ptr, q_stride, out_stride, table_stride, scale,
                    BLOCK_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                    HEAD_DIM: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr):
    # one program per (request, query head, tile of TILE_M chunk rows)
    r = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + r)
    chunk = tl.load(query_lens_ptr + r)
    if tile * TILE_M >= chunk:  # the grid is sized for the longest chunk of the batch
        return
    cached = seq_len - chunk
    i = tile * TILE_M + tl.arange(0, TILE_M)
    row_ok = i < chunk
    d = tl.arange(0, HEAD_DIM)
    rows_q = tl.load(query_starts_ptr + r) + i
    q = tl.load(q_ptr + rows_q[:, None] * q_stride + head * HEAD_DIM + d[None, :], mask=row_ok[:, None], other=0.0)
    q_pos = cached + i
    kv_col = (head // GROUP) * HEAD_DIM
    m_i = tl.full([TILE_M], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_M], tl.float32)
    acc = tl.zeros([TILE_M, HEAD_DIM], tl.float32)
    # keys after the tile's last query are never visible to it
    for start in range(0, tl.minimum(seq_len, cached + (tile + 1) * TILE_M), TILE_N):
        pos = start + tl.arange(0, TILE_N)
        valid = pos < seq_len
        block = tl.load(tables_ptr + r * table_stride + pos // BLOCK_SIZE, mask=valid, other=0)
        rows = (block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE) * (KV_HEADS * HEAD_DIM) + kv_col
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale  # [TILE_M, TILE_N], float32
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: position 0 is visible to every row
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + rows_q[:, None] * out_stride + head * HEAD_DIM + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def _check_rows(name: str, x: torch.Tensor) -> None:
    # kernels address a token's (heads, head_dim) as one contiguous row
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        raise ValueError(f"{name}: each token's [heads, head_dim] must be contiguous, strides {x.stride()}")


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store the K and V rows `[T, kv_heads, head_dim]` of T new tokens at their pool slots `[T]`."""
    tokens, kv_heads, dim = key.shape
    if tokens == 0:
        return
    _check_rows("key", key)
    _check_rows("value", value)
    row = kv_heads * dim
    _write_kv_kernel[(tokens,)](key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0),
                                ROW=row, ROW_PAD=triton.next_power_of_2(row))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """q `[R, heads, head_dim]`, one query per request; request r attends to its seq_lens[r] cached tokens.
    Writes into `out` (same shape as q) when given."""
    num_req, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q) if out is None else out
    if num_req == 0:
        return out
    _check_rows("q", q)
    _check_rows("out", out)
    group = heads // kv_heads
    _decode_kernel[(num_req, kv_heads)](
        q, k_cache, v_cache, out, batch.block_tables, batch.seq_lens,
        q.stride(0), out.stride(0), batch.block_tables.stride(0), dim ** -0.5,
        BLOCK_SIZE=batch.block_size, KV_HEADS=kv_heads, GROUP=group, GROUP_PAD=triton.next_power_of_2(group),
        HEAD_DIM=dim, TILE_N=BLOCK_N)
    return out


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """q `[T, heads, head_dim]`: each request's c query rows, at positions seq_len - c .. seq_len - 1,
    attend causally to the request's cached prefix and the chunk up to themselves. Writes into `out`
    (same shape as q) when given."""
    heads, dim = q.shape[1:]
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q) if out is None else out
    if batch.num_requests == 0:
        return out
    _check_rows("q", q)
    _check_rows("out", out)
    grid = (batch.num_requests, heads, triton.cdiv(batch.max_query_len, BLOCK_M))
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, batch.block_tables, batch.seq_lens, batch.query_lens, batch.query_starts,
        q.stride(0), out.stride(0), batch.block_tables.stride(0), dim ** -0.5,
        BLOCK_SIZE=batch.block_size, KV_HEADS=kv_heads, GROUP=heads // kv_heads, HEAD_DIM=dim,
        TILE_M=BLOCK_M, TILE_N=BLOCK_N)
    return out
