"""The Triton kernels against their PyTorch reference twins (kvbound/kernels), on random paged
batches: several head layouts, KV block sizes, ragged lengths, chunks longer than one kernel
tile, block tables in shuffled pool order. Pool slots that no request owns and the output
buffers are poisoned with NaN, so a kernel that reads a wrong slot or leaves a row unwritten
fails. On CPU the kernels run in Triton's interpreter; on a CUDA machine, compiled, in fp16."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch", reason="the executor extra (torch) is not installed")
CUDA = torch.cuda.is_available()
if not CUDA:  # must be set before kvbound.kernels.triton_ops is imported (triton.jit reads it)
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="the executor extra (triton) is not installed")

from kvbound.kernels import PagedBatch, backend  # noqa: E402
from kvbound.kernels.layout import KV_LAYOUTS, new_pool  # noqa: E402
from kvbound.kernels.tuning import DecodeConfig  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.float16 if CUDA else torch.float32
TOL = dict(atol=1e-2, rtol=1e-2) if CUDA else dict(atol=1e-5, rtol=1e-5)  # fp16 on the GPU
REF, TRITON = backend("torch"), backend("triton")


def _interpreter_runs_loops():
    """Triton's CPU interpreter before 3.8 cannot run a loop with a runtime bound under numpy >= 2.4."""
    import numpy
    import triton
    if CUDA:
        return True
    old = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 8)
    return not (old and tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 4))


def test_the_triton_interpreter_can_run_the_kernels():
    assert _interpreter_runs_loops(), ("triton < 3.8 with numpy >= 2.4: the CPU interpreter fails on runtime loop "
                                       "bounds; install the executor extra again (it asks for the fixed triton)")


def _in_layout(pool: torch.Tensor, layout: str) -> torch.Tensor:
    """The same pool values in the memory layout `layout`."""
    out = new_pool(*pool.shape, layout=layout, dtype=pool.dtype, device=pool.device)
    return out.copy_(pool)


def _paged(seq_lens, query_lens, block_size, heads, kv_heads, dim, seed, layout="NHD"):
    """A pool holding random KV for the given requests in shuffled blocks; every other slot is NaN."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks stay poisoned
    order = torch.randperm(num_blocks, generator=gen).int()
    width = max(blocks_per_seq) + 1
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    k_cache = torch.full((num_blocks, block_size, kv_heads, dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    taken = 0
    for r, (n, nb) in enumerate(zip(seq_lens, blocks_per_seq)):
        tables[r, :nb] = order[taken:taken + nb]
        taken += nb
        for p in range(n):
            block, offset = tables[r, p // block_size], p % block_size
            k_cache[block, offset] = torch.randn(kv_heads, dim, generator=gen)
            v_cache[block, offset] = torch.randn(kv_heads, dim, generator=gen)
    q = torch.randn(sum(query_lens), heads, dim, generator=gen)
    ql = torch.tensor(query_lens, dtype=torch.int32)
    batch = PagedBatch(tables.to(DEVICE), torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE), ql.to(DEVICE),
                       (ql.cumsum(0) - ql).int().to(DEVICE), max(query_lens), block_size)
    return (q.to(DEVICE, DTYPE), _in_layout(k_cache.to(DEVICE, DTYPE), layout), _in_layout(v_cache.to(DEVICE, DTYPE), layout),
            batch)


HEADS = [(4, 2, 16), (2, 2, 32), (8, 1, 16)]  # (heads, kv_heads, head_dim): GQA, MHA, MQA


@pytest.mark.parametrize("heads,kv_heads,dim", HEADS)
@pytest.mark.parametrize("block_size,layout", [(1, "NHD"), (3, "HND"), (16, "NHD"), (16, "HND")])
def test_decode_attention_matches_reference(heads, kv_heads, dim, block_size, layout):
    seq_lens = [1, 5, 70, 16, 33]  # 70 spans two key tiles
    q, k_cache, v_cache, batch = _paged(seq_lens, [1] * len(seq_lens), block_size, heads, kv_heads, dim,
                                        seed=block_size, layout=layout)
    expected = REF.decode_attention(q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(), _cpu(batch))
    out = torch.full_like(q, float("nan"))
    TRITON.decode_attention(q, k_cache, v_cache, batch, out)
    torch.testing.assert_close(out.cpu().float(), expected, **TOL)


@pytest.mark.parametrize("config", [DecodeConfig(tile_n=16, heads_first=True), DecodeConfig(tile_n=128, num_warps=8),
                                    DecodeConfig(tile_n=32, num_stages=1, heads_first=True),
                                    DecodeConfig(tile_n=16, dot=True), DecodeConfig(tile_n=64, dot=True, heads_first=True)],
                         ids=repr)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_attention_launch_settings_change_nothing(config, num_splits):
    """Tuning (bench_kernels.py --tune) may pick any tile, warps, stages and program order: same values."""
    seq_lens = [1, 200, 70, 129]
    q, k_cache, v_cache, batch = _paged(seq_lens, [1] * len(seq_lens), 16, 4, 2, 16, seed=7, layout="HND")
    expected = REF.decode_attention(q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(), _cpu(batch))
    split = replace(batch, num_splits=num_splits)
    out = torch.full_like(q, float("nan"))
    TRITON.decode_attention(q, k_cache, v_cache, split, out, config=config)
    torch.testing.assert_close(out.cpu().float(), expected, **TOL)


@pytest.mark.parametrize("heads,kv_heads,dim", HEADS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_tensor_core_decode_matches_reference_for_every_head_grouping(heads, kv_heads, dim, num_splits):
    """`dot`: one query head (MHA), two (GQA) or eight (MQA) padded to 16 rows of a tensor-core product;
    the padding rows must leave the real ones as they are and never be stored."""
    seq_lens = [1, 200, 70, 129]
    q, k_cache, v_cache, batch = _paged(seq_lens, [1] * len(seq_lens), 16, heads, kv_heads, dim, seed=11, layout="HND")
    expected = REF.decode_attention(q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(), _cpu(batch))
    split = replace(batch, num_splits=num_splits)
    out = torch.full_like(q, float("nan"))
    TRITON.decode_attention(q, k_cache, v_cache, split, out, config=DecodeConfig(tile_n=32, dot=True))
    torch.testing.assert_close(out.cpu().float(), expected, **TOL)


def test_tensor_core_decode_needs_a_tile_of_16():
    with pytest.raises(ValueError, match="tile_n >= 16"):
        DecodeConfig(tile_n=8, dot=True)


@pytest.mark.parametrize("heads,kv_heads,dim", HEADS)
@pytest.mark.parametrize("block_size,layout", [(1, "NHD"), (4, "HND"), (16, "NHD"), (16, "HND")])
def test_prefill_attention_matches_reference(heads, kv_heads, dim, block_size, layout):
    # (m cached + c chunk): a first prefill, a chunk after a prefix, a 1-token chunk,
    # a chunk of 70 rows (two query tiles) after 9 cached tokens
    cached, chunks = [0, 21, 6, 9], [13, 7, 1, 70]
    seq_lens = [m + c for m, c in zip(cached, chunks)]
    q, k_cache, v_cache, batch = _paged(seq_lens, chunks, block_size, heads, kv_heads, dim, seed=10 + block_size,
                                        layout=layout)
    expected = REF.prefill_attention(q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(), _cpu(batch))
    out = torch.full_like(q, float("nan"))
    TRITON.prefill_attention(q, k_cache, v_cache, batch, out)
    torch.testing.assert_close(out.cpu().float(), expected, **TOL)


@pytest.mark.parametrize("heads,kv_heads,dim", HEADS)
@pytest.mark.parametrize("num_splits", [2, 8])
def test_split_k_prefill_attention_matches_reference(heads, kv_heads, dim, num_splits):
    """Split-K prefill: each tile of query rows walks its keys in num_splits tile-aligned ranges, combined per
    row. The chunk of 70 rows after 9 cached tokens has rows that see no key of a later range (causal: its
    first tile's rows 0-54 see none of keys 64-72); 8 splits of short sequences leave empty ranges; every
    one must weigh nothing. A short chunk after 100 cached tokens is what the splits are for."""
    cached, chunks = [0, 21, 6, 9, 100], [13, 7, 1, 70, 5]
    seq_lens = [m + c for m, c in zip(cached, chunks)]
    q, k_cache, v_cache, batch = _paged(seq_lens, chunks, 16, heads, kv_heads, dim, seed=40 + num_splits, layout="HND")
    expected = REF.prefill_attention(q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(), _cpu(batch))
    split = replace(batch, num_splits=num_splits)
    out = torch.full_like(q, float("nan"))
    TRITON.prefill_attention(q, k_cache, v_cache, split, out)
    torch.testing.assert_close(out.cpu().float(), expected, **TOL)


def test_prefill_reference_is_plain_causal_attention():
    """The twin itself: a chunk after a cached prefix sees exactly the keys at positions <= its own."""
    q, k_cache, v_cache, batch = _paged([9], [4], 2, 2, 1, 8, seed=3)
    out = REF.prefill_attention(q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(), _cpu(batch))
    tables = batch.block_tables.cpu()
    slots = [int(tables[0, p // 2]) * 2 + p % 2 for p in range(9)]
    k = k_cache.cpu().float().flatten(0, 1)[slots, 0]  # [9, dim], the one KV head
    v = v_cache.cpu().float().flatten(0, 1)[slots, 0]
    for i in range(4):  # query i is at position 5 + i
        for h in range(2):
            w = torch.softmax(q.cpu().float()[i, h] @ k[:6 + i].T / 8 ** 0.5, dim=0)
            torch.testing.assert_close(out[i, h], w @ v[:6 + i])


@pytest.mark.parametrize("layout", KV_LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_write_kv_writes_exactly_the_mapped_slots(block_size, layout):
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, kv_heads, dim, tokens = 6, 2, 16, 11
    pool = (num_blocks, block_size, kv_heads, dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:min(tokens, num_blocks * block_size)]
    # value as a strided view (a slice of a fused projection, as in the model)
    fused = torch.randn(len(slots), 3, kv_heads, dim, generator=gen)
    key, value = fused[:, 0].contiguous(), fused[:, 2]
    results = []
    for ops, device, dtype in ((REF, "cpu", torch.float32), (TRITON, DEVICE, DTYPE)):
        k_cache = _in_layout(torch.full(pool, float("nan"), device=device, dtype=dtype), layout)
        v_cache = _in_layout(torch.full(pool, float("nan"), device=device, dtype=dtype), layout)
        ops.write_kv(key.to(device, dtype), value.to(device, dtype), k_cache, v_cache, slots.to(device))
        results.append((k_cache.cpu().float(), v_cache.cpu().float()))
    (k_ref, v_ref), (k_tri, v_tri) = results
    torch.testing.assert_close(k_tri, k_ref, equal_nan=True, **TOL)
    torch.testing.assert_close(v_tri, v_ref, equal_nan=True, **TOL)
    written = ~k_ref.flatten(0, 1).isnan().all(-1).all(-1)
    assert written.sum() == len(slots) and written[slots].all()
    torch.testing.assert_close(v_ref.flatten(0, 1)[slots], value)


def _cpu(batch: PagedBatch) -> PagedBatch:
    return PagedBatch(batch.block_tables.cpu(), batch.seq_lens.cpu(), batch.query_lens.cpu(),
                      batch.query_starts.cpu(), batch.max_query_len, batch.block_size)


@pytest.mark.parametrize("heads,kv_heads,dim", HEADS)
@pytest.mark.parametrize("num_splits", [2, 3, 8])
def test_split_k_decode_attention_matches_reference(heads, kv_heads, dim, num_splits):
    """Flash-decoding: each request's keys in num_splits tile-aligned ranges, combined in a second
    pass. 8 splits of sequences of 1 to 200 tokens leave some ranges empty (they must weigh nothing)."""
    seq_lens = [1, 200, 70, 129]
    q, k_cache, v_cache, batch = _paged(seq_lens, [1] * len(seq_lens), 16, heads, kv_heads, dim, seed=num_splits)
    expected = REF.decode_attention(q.cpu().float(), k_cache.cpu().float(), v_cache.cpu().float(), _cpu(batch))
    split = replace(batch, num_splits=num_splits)
    out = torch.full_like(q, float("nan"))
    TRITON.decode_attention(q, k_cache, v_cache, split, out)
    torch.testing.assert_close(out.cpu().float(), expected, **TOL)


def _rows(tokens, width, seed):
    return torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("hidden", [64, 100])  # 100: a row shorter than the kernel's power-of-two tile
def test_fused_add_rms_norm_matches_reference(hidden):
    x, residual, weight = _rows(7, hidden, 1), _rows(7, hidden, 2), _rows(1, hidden, 3)[0]
    expected_norm, expected_sum = REF.add_rms_norm(x, residual, weight, 1e-5)
    torch.testing.assert_close(REF.rms_norm(x, weight, 1e-5), torch.nn.functional.rms_norm(x, (hidden,), weight, 1e-5))
    dev = [t.to(DEVICE, DTYPE) for t in (x, residual, weight)]
    torch.testing.assert_close(TRITON.rms_norm(dev[0], dev[2], 1e-5).cpu().float(), REF.rms_norm(x, weight, 1e-5),
                               **TOL)
    x_in, residual_in = dev[0].clone(), dev[1].clone()
    norm, total = TRITON.add_rms_norm(x_in, residual_in, dev[2], 1e-5)
    assert norm.data_ptr() == x_in.data_ptr() and total.data_ptr() == residual_in.data_ptr()  # in place
    torch.testing.assert_close(total.cpu().float(), expected_sum, **TOL)
    torch.testing.assert_close(norm.cpu().float(), expected_norm, **TOL)


@pytest.mark.parametrize("heads,kv_heads,dim", HEADS)
def test_fused_rotary_rotates_q_and_k_in_place_like_the_reference(heads, kv_heads, dim):
    """q, k as the model has them: views of one fused QKV projection (row stride of all three)."""
    tokens = 9
    qkv = _rows(tokens, (heads + 2 * kv_heads) * dim, 4)
    angles = torch.arange(tokens).float()[:, None] * 10000.0 ** -(torch.arange(0, dim, 2).float() / dim)
    cos, sin = angles.cos(), angles.sin()
    results = []
    for ops, device, dtype in ((REF, "cpu", torch.float32), (TRITON, DEVICE, DTYPE)):
        fused = qkv.to(device, dtype, copy=True).view(tokens, heads + 2 * kv_heads, dim)
        q, k, v = fused.split([heads, kv_heads, kv_heads], dim=1)
        ops.rotary_(q, k, cos.to(device), sin.to(device))
        results.append(fused.cpu().float())
    ref, tri = results
    torch.testing.assert_close(tri, ref, **TOL)
    v_cols = slice(heads + kv_heads, None)
    torch.testing.assert_close(ref[:, v_cols], qkv.view(tokens, -1, dim)[:, v_cols])  # v untouched
    torch.testing.assert_close(ref[0], qkv.view(tokens, -1, dim)[0])  # position 0: angle 0
    assert not torch.allclose(ref[1:, :heads], qkv.view(tokens, -1, dim)[1:, :heads])


@pytest.mark.parametrize("width", [688, 2000])  # 2000: two column tiles, the second partial
def test_fused_silu_mul_matches_reference(width):
    gate_up = _rows(5, 2 * width, 5)
    expected = REF.silu_mul(gate_up)
    torch.testing.assert_close(expected, torch.nn.functional.silu(gate_up[:, :width]) * gate_up[:, width:])
    torch.testing.assert_close(TRITON.silu_mul(gate_up.to(DEVICE, DTYPE)).cpu().float(), expected, **TOL)
