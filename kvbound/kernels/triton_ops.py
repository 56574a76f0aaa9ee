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

from .layout import PREFILL_TILE_M, PagedBatch
from .tuning import DecodeConfig, kernel_config

BLOCK_M = PREFILL_TILE_M  # query rows per prefill program
BLOCK_N = 64  # key positions per prefill tile (decode: DecodeConfig.tile_n)
DOT_MIN_ROWS = 16  # tl.dot's least operand size: the decode kernel's query heads are padded to it


@triton.jit
def _write_kv_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, key_stride, value_stride,
                     stride_block, stride_offset, stride_head, BLOCK_SIZE: tl.constexpr,
                     KV_HEADS: tl.constexpr, KV_HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
    t = tl.program_id(0)  # one program per new token
    slot = tl.load(slot_ptr + t).to(tl.int64)
    h = tl.arange(0, KV_HEADS_PAD)
    d = tl.arange(0, HEAD_DIM)
    mask = (h < KV_HEADS)[:, None]
    row = h[:, None] * HEAD_DIM + d[None, :]
    dest = (slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_offset + h[:, None] * stride_head + d[None, :]
    tl.store(k_cache_ptr + dest, tl.load(key_ptr + t * key_stride + row, mask=mask), mask=mask)
    tl.store(v_cache_ptr + dest, tl.load(value_ptr + t * value_stride + row, mask=mask), mask=mask)


@triton.jit
def _key_range(keys, split, num_splits, TILE_N: tl.constexpr, SPLIT: tl.constexpr):
    """The keys [lo, hi) of `keys` one program walks: with SPLIT (split-K) range `split` of num_splits
    tile-aligned ones (empty where the keys run out first), else all of them."""
    if SPLIT:
        span = tl.cdiv(tl.cdiv(keys, num_splits), TILE_N) * TILE_N
        lo = split * span
        hi = tl.minimum(lo + span, keys)
    else:
        lo = 0
        hi = keys
    return lo, hi


@triton.jit
def _store_partials(m_ptr, l_ptr, acc_ptr, part, m_i, l_i, acc, ok, HEAD_DIM: tl.constexpr):
    """A split-K program's running max, running sum and unnormalised sum of its rows `part` (those where
    `ok`), float32, for _combine_splits_kernel."""
    d = tl.arange(0, HEAD_DIM)
    tl.store(m_ptr + part, m_i, mask=ok)
    tl.store(l_ptr + part, l_i, mask=ok)
    tl.store(acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=ok[:, None])


@triton.jit(do_not_specialize=["table_stride", "num_splits"])
def _decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, m_ptr, l_ptr, tables_ptr, seq_lens_ptr,
                   q_stride, out_stride, table_stride, num_splits, scale, stride_block, stride_offset, stride_head,
                   BLOCK_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                   HEAD_DIM: tl.constexpr, TILE_N: tl.constexpr, SPLIT: tl.constexpr, HEADS_FIRST: tl.constexpr,
                   DOT: tl.constexpr):
    # one program per (request, KV head, key range): the GROUP query heads sharing that KV head read
    # it once. Without SPLIT the range is the whole sequence and the program writes the output;
    # with SPLIT (flash-decoding) it is one of num_splits tile-aligned ranges and the program writes
    # its unnormalised sum, running max and running sum for _combine_splits_kernel.
    # HEADS_FIRST: consecutive programs are the KV heads of one (request, range), which read
    # neighbouring memory when a token's heads are contiguous in the pool.
    # DOT: the scores and the weighted sum as tensor-core products of the query heads padded to
    # GROUP_PAD >= 16 rows (the padding rows are zeros and never stored), K and V kept in their
    # storage dtype; without it, float32 products on the CUDA cores, whose tiles take twice the registers
    if HEADS_FIRST:
        kv_head = tl.program_id(0)
        split = tl.program_id(1)
        r = tl.program_id(2)
    else:
        r = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + r)
    lo, hi = _key_range(seq_len, split, num_splits, TILE_N, SPLIT)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    head_ok = g < GROUP
    q = tl.load(q_ptr + r * q_stride + heads[:, None] * HEAD_DIM + d[None, :], mask=head_ok[:, None], other=0.0)
    if not DOT:
        q = q.to(tl.float32)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(lo, hi, TILE_N):  # no iteration for an empty split: m stays -inf, l and acc 0
        pos = start + tl.arange(0, TILE_N)
        valid = pos < hi
        block = tl.load(tables_ptr + r * table_stride + pos // BLOCK_SIZE, mask=valid, other=0)
        rows = block.to(tl.int64) * stride_block + (pos % BLOCK_SIZE) * stride_offset + kv_head * stride_head
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        if DOT:
            s = tl.dot(q, tl.trans(k)) * scale  # [GROUP_PAD, TILE_N], float32
        else:
            s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: the tile's first position is valid
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m_i = m_new
    if SPLIT:  # partials [R, heads, num_splits] (m, l) and [R, heads, num_splits, HEAD_DIM] (acc), float32
        _store_partials(m_ptr, l_ptr, out_ptr, (r * (KV_HEADS * GROUP) + heads) * num_splits + split, m_i, l_i, acc,
                        head_ok, HEAD_DIM)
    else:
        out = acc / l_i[:, None]
        tl.store(out_ptr + r * out_stride + heads[:, None] * HEAD_DIM + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _combine_splits_kernel(acc_ptr, m_ptr, l_ptr, out_ptr, out_stride, num_splits,
                           HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr):
    # one program per (request, query head): rescale each split's partial sums to the common max
    r = tl.program_id(0)
    head = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    ok = sp < num_splits
    part = (r * HEADS + head) * num_splits + sp
    m = tl.load(m_ptr + part, mask=ok, other=float("-inf"))
    l = tl.load(l_ptr + part, mask=ok, other=0.0)
    acc = tl.load(acc_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=ok[:, None], other=0.0)
    weight = tl.exp(m - tl.max(m, axis=0))  # split 0 is never empty, so the max is finite; empty splits weigh 0
    out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
    tl.store(out_ptr + r * out_stride + head * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["table_stride", "num_splits"])
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, m_ptr, l_ptr, tables_ptr, seq_lens_ptr, query_lens_ptr,
                    query_starts_ptr, q_stride, out_stride, table_stride, num_splits, scale, stride_block, stride_offset,
                    stride_head, BLOCK_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr,
                    SPLIT: tl.constexpr):
    # one program per (request, query head, tile of TILE_M chunk rows, key range). Without SPLIT the
    # range is every key the tile sees and the program writes the output; with SPLIT it is one of
    # num_splits tile-aligned ranges of them (a short chunk after a long cached prefix is otherwise one
    # program per head walking the whole prefix) and the program writes each row's unnormalised sum,
    # running max and running sum for _combine_splits_kernel, as split-K decode does
    r = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
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
    kv_col = (head // GROUP) * stride_head
    m_i = tl.full([TILE_M], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_M], tl.float32)
    acc = tl.zeros([TILE_M, HEAD_DIM], tl.float32)
    # keys after the tile's last query are never visible to it
    seen = tl.minimum(seq_len, cached + (tile + 1) * TILE_M)
    lo, hi = _key_range(seen, split, num_splits, TILE_N, SPLIT)
    for start in range(lo, hi, TILE_N):
        pos = start + tl.arange(0, TILE_N)
        valid = pos < hi
        block = tl.load(tables_ptr + r * table_stride + pos // BLOCK_SIZE, mask=valid, other=0)
        rows = block.to(tl.int64) * stride_block + (pos % BLOCK_SIZE) * stride_offset + kv_col
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale  # [TILE_M, TILE_N], float32
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # a row may see no key of a later range yet (causal): its max stays -inf and adds nothing
        # (without SPLIT position 0 is in the first tile and visible to every row, so m_new is finite)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if SPLIT:  # partials [T, heads, num_splits] (m, l) and [T, heads, num_splits, HEAD_DIM] (acc), float32
        _store_partials(m_ptr, l_ptr, out_ptr, (rows_q * HEADS + head) * num_splits + split, m_i, l_i, acc, row_ok,
                        HEAD_DIM)
    else:
        out = acc / l_i[:, None]
        tl.store(out_ptr + rows_q[:, None] * out_stride + head * HEAD_DIM + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def _check_rows(name: str, x: torch.Tensor) -> None:
    # kernels address a token's (heads, head_dim) as one contiguous row
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        raise ValueError(f"{name}: each token's [heads, head_dim] must be contiguous, strides {x.stride()}")


def _pool_strides(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int]:
    """(block, offset, head) strides of the K and V pools, which must share a layout with contiguous head rows."""
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError(f"the K and V pools must have one layout with contiguous head_dim, strides {k_cache.stride()} "
                         f"and {v_cache.stride()}")
    return k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store the K and V rows `[T, kv_heads, head_dim]` of T new tokens at their pool slots `[T]`."""
    tokens, kv_heads, dim = key.shape
    if tokens == 0:
        return
    _check_rows("key", key)
    _check_rows("value", value)
    _write_kv_kernel[(tokens,)](key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0),
                                *_pool_strides(k_cache, v_cache), BLOCK_SIZE=k_cache.shape[1], KV_HEADS=kv_heads,
                                KV_HEADS_PAD=triton.next_power_of_2(kv_heads), HEAD_DIM=dim)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                     out: torch.Tensor | None = None, *, config: DecodeConfig | None = None) -> torch.Tensor:
    """q `[R, heads, head_dim]`, one query per request; request r attends to its seq_lens[r] cached tokens.
    Writes into `out` (same shape as q) when given. With batch.num_splits > 1, split-K
    (flash-decoding): each (request, KV head) is walked by num_splits programs, then combined.
    `config`: launch settings (default: this GPU's tuned ones, `tuning.kernel_config`).
    No host synchronisation and fixed-shape scratch only, so it can be captured in a CUDA graph."""
    num_req, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q) if out is None else out
    if num_req == 0:
        return out
    _check_rows("q", q)
    _check_rows("out", out)
    config = config or kernel_config(q.device).decode
    group = heads // kv_heads
    splits = batch.num_splits
    target, partial_max, partial_sum = _split_partials(out, splits)
    grid = (kv_heads, splits, num_req) if config.heads_first else (num_req, kv_heads, splits)
    _decode_kernel[grid](
        q, k_cache, v_cache, target, partial_max, partial_sum, batch.block_tables, batch.seq_lens,
        q.stride(0), out.stride(0), batch.block_tables.stride(0), splits, dim ** -0.5,
        *_pool_strides(k_cache, v_cache),
        BLOCK_SIZE=batch.block_size, KV_HEADS=kv_heads, GROUP=group,
        GROUP_PAD=max(triton.next_power_of_2(group), DOT_MIN_ROWS if config.dot else 1),
        HEAD_DIM=dim, TILE_N=config.tile_n, SPLIT=splits > 1, HEADS_FIRST=config.heads_first, DOT=config.dot,
        num_warps=config.num_warps, num_stages=config.num_stages)
    _combine_splits(target, partial_max, partial_sum, out, splits)
    return out


def _split_partials(out: torch.Tensor, splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(what the attention kernel writes to, running maxima, running sums): with split-K, float32 partials
    for each row of `out` `[rows, heads, dim]`: `[rows, heads, splits, dim]`, `[rows, heads, splits]` twice;
    without, `out` itself (the other two pointers unused)."""
    if splits == 1:
        return out, out, out
    rows, heads, dim = out.shape
    partial_max = torch.empty(rows, heads, splits, dtype=torch.float32, device=out.device)
    return (torch.empty(rows, heads, splits, dim, dtype=torch.float32, device=out.device), partial_max,
            torch.empty_like(partial_max))


def _combine_splits(partial_acc: torch.Tensor, partial_max: torch.Tensor, partial_sum: torch.Tensor,
                    out: torch.Tensor, splits: int) -> None:
    """Each row's split-K partials combined into `out` (nothing to do without splits)."""
    if splits == 1:
        return
    rows, heads, dim = out.shape
    _combine_splits_kernel[(rows, heads)](partial_acc, partial_max, partial_sum, out, out.stride(0), splits,
                                          HEADS=heads, HEAD_DIM=dim, SPLITS_PAD=triton.next_power_of_2(splits))


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PagedBatch,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """q `[T, heads, head_dim]`: each request's c query rows, at positions seq_len - c .. seq_len - 1,
    attend causally to the request's cached prefix and the chunk up to themselves. Writes into `out`
    (same shape as q) when given. With batch.num_splits > 1, split-K: each (request, head, tile of
    query rows) walks its keys with num_splits programs, then a second kernel combines them per row."""
    heads, dim = q.shape[1:]
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q) if out is None else out
    if batch.num_requests == 0:
        return out
    _check_rows("q", q)
    _check_rows("out", out)
    splits = batch.num_splits
    # every row of q is some request's (one call's rows are its requests' chunks): each row is combined
    target, partial_max, partial_sum = _split_partials(out, splits)
    grid = (batch.num_requests, heads, triton.cdiv(batch.max_query_len, BLOCK_M) * splits)
    _prefill_kernel[grid](
        q, k_cache, v_cache, target, partial_max, partial_sum, batch.block_tables, batch.seq_lens, batch.query_lens,
        batch.query_starts, q.stride(0), out.stride(0), batch.block_tables.stride(0), splits, dim ** -0.5,
        *_pool_strides(k_cache, v_cache), BLOCK_SIZE=batch.block_size, KV_HEADS=kv_heads, GROUP=heads // kv_heads,
        HEADS=heads, HEAD_DIM=dim, TILE_M=BLOCK_M, TILE_N=BLOCK_N, SPLIT=splits > 1)
    _combine_splits(target, partial_max, partial_sum, out, splits)
    return out


# ---------------------------------------------------------------- fused layer operations
# Each replaces several PyTorch kernels (casts, chunks, concatenations, elementwise ops) by one
# launch: per decoder layer, two add + RMSNorm, one rotary for q and k, one SiLU * up.

@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, out_ptr, weight_ptr, x_stride, residual_stride, out_stride, eps,
                     HIDDEN: tl.constexpr, BLOCK: tl.constexpr, ADD_RESIDUAL: tl.constexpr):
    t = tl.program_id(0)  # one program per token
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + t * x_stride + cols, mask=mask, other=0.0)
    if ADD_RESIDUAL:
        x = x + tl.load(residual_ptr + t * residual_stride + cols, mask=mask, other=0.0)
        tl.store(residual_ptr + t * residual_stride + cols, x, mask=mask)
    x = x.to(tl.float32)
    rms = tl.rsqrt(tl.sum(x * x, axis=0) / HIDDEN + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * out_stride + cols, (x * rms * weight).to(out_ptr.dtype.element_ty), mask=mask)


def _norm(x: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor, weight: torch.Tensor,
          eps: float) -> None:
    tokens, hidden = x.shape
    if tokens == 0:
        return
    if x.stride(1) != 1 or out.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError("rms_norm: rows must be contiguous")
    _rms_norm_kernel[(tokens,)](x, residual if residual is not None else x, out, weight, x.stride(0),
                                residual.stride(0) if residual is not None else 0, out.stride(0), eps,
                                HIDDEN=hidden, BLOCK=triton.next_power_of_2(hidden),
                                ADD_RESIDUAL=residual is not None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of x `[T, hidden]` (a new tensor)."""
    out = torch.empty_like(x)
    _norm(x, None, out, weight, eps)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual) in one pass, in place: residual becomes x + residual,
    x its norm (vLLM's fused_add_rms_norm)."""
    _norm(x, residual, x, weight, eps)
    return x, residual


@triton.jit
def _rotate_heads(row_ptr, cos, sin, i, i_ok, HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr):
    h = tl.arange(0, HEADS_PAD)
    mask = (h[:, None] < HEADS) & i_ok[None, :]
    first = row_ptr + h[:, None] * (2 * HALF) + i[None, :]
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(first, (x1f * cos[None, :] - x2f * sin[None, :]).to(x1.dtype), mask=mask)
    tl.store(first + HALF, (x2f * cos[None, :] + x1f * sin[None, :]).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, q_stride, k_stride, angle_stride,
                   HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, KV_HEADS: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
                   HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    t = tl.program_id(0)  # one program per token: all its q and k heads
    i = tl.arange(0, HALF_PAD)
    i_ok = i < HALF
    cos = tl.load(cos_ptr + t * angle_stride + i, mask=i_ok, other=0.0)
    sin = tl.load(sin_ptr + t * angle_stride + i, mask=i_ok, other=0.0)
    _rotate_heads(q_ptr + t * q_stride, cos, sin, i, i_ok, HEADS, HEADS_PAD, HALF)
    _rotate_heads(k_ptr + t * k_stride, cos, sin, i, i_ok, KV_HEADS, KV_HEADS_PAD, HALF)


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q `[T, heads, head_dim]` and k `[T, kv_heads, head_dim]` in place by their tokens'
    angles (cos, sin `[T, head_dim / 2]`, float32), the half-split convention of the Llama reference
    code, computed in float32."""
    tokens, heads, dim = q.shape
    if tokens == 0:
        return
    _check_rows("q", q)
    _check_rows("k", k)
    if cos.stride(1) != 1 or sin.stride() != cos.stride():
        raise ValueError("rotary_: cos and sin must be [T, head_dim / 2] with contiguous rows and equal strides")
    kv_heads = k.shape[1]
    _rotary_kernel[(tokens,)](q, k, cos, sin, q.stride(0), k.stride(0), cos.stride(0),
                              HEADS=heads, HEADS_PAD=triton.next_power_of_2(heads), KV_HEADS=kv_heads,
                              KV_HEADS_PAD=triton.next_power_of_2(kv_heads), HALF=dim // 2,
                              HALF_PAD=triton.next_power_of_2(dim // 2))


SILU_BLOCK = 1024  # columns per SiLU * up program


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, in_stride, out_stride, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    gate = tl.load(gate_up_ptr + t * in_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + t * in_stride + WIDTH + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * out_stride + cols, (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's SiLU(gate) * up of `[T, 2 * intermediate]` (gate first, then up): `[T, intermediate]`."""
    tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(tokens, width, dtype=gate_up.dtype, device=gate_up.device)
    if tokens == 0:
        return out
    if gate_up.stride(1) != 1:
        raise ValueError("silu_mul: rows must be contiguous")
    block = min(SILU_BLOCK, triton.next_power_of_2(width))
    _silu_mul_kernel[(tokens, triton.cdiv(width, block))](gate_up, out, gate_up.stride(0), out.stride(0),
                                                          WIDTH=width, BLOCK=block)
    return out
