"""The executor (kvbound/engine_bridge): a request processed in chunks, evicted and refilled, or
batched with others gives the logits of one plain full-sequence forward pass without a cache;
replaying a schedule agrees with the semantics of kvbound/schedule.py batch by batch; the block
manager hands out and takes back whole blocks."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the executor extra (torch) is not installed")

import kvbound  # noqa: E402
from kvbound.engine_bridge.block_manager import BlockManager, OutOfBlocks  # noqa: E402
from kvbound.engine_bridge.config import SHAPES, model_shape  # noqa: E402
from kvbound.engine_bridge.executor import Executor  # noqa: E402
from kvbound.engine_bridge.sequence import Sequence  # noqa: E402
from kvbound.schedulers import run_scheduler  # noqa: E402

SHAPE = model_shape("tiny", layers=2)


def _sequence(i: int, prompt: int, output: int = 8, seed: int = 0) -> Sequence:
    tokens = np.random.default_rng(seed + i).integers(SHAPE.vocab, size=prompt).tolist()
    return Sequence(i, tokens, prompt, output)


def _run_mixed_schedule(executor: Executor) -> tuple[list[Sequence], dict[int, list[tuple[int, torch.Tensor]]]]:
    """Four batches: chunked prefill, decode, eviction and refill, batching with others.
    Returns the sequences and, per sequence, (first position, logits) of every processed piece."""
    a, b, c = _sequence(0, 13), _sequence(1, 7), _sequence(2, 20)
    pieces: dict[int, list] = {0: [], 1: [], 2: []}

    def run(work, evict=()):
        start = {seq.id: seq.cached for seq, _ in work}
        out = executor.step(work, list(evict), keep_logits=True)
        for seq_id, logits in out.logits.items():
            pieces[seq_id].append((start[seq_id], logits))

    run([(a, 5), (b, 7)])  # a: first chunk; b: whole prompt (generates)
    run([(a, 8), (b, 1)])  # a: last chunk (generates); b: decode
    run([(a, 1), (c, 20)], evict=[b])  # b evicted; a decodes beside c's prefill
    run([(b, b.uncached), (a, 1), (c, 1)])  # b refills its 7 + 2 tokens; a and c decode
    run([(b, 1), (c, 1)])
    return [a, b, c], pieces


def _check_against_dense(executor: Executor, seqs, pieces, atol: float, rtol: float = 1e-3) -> None:
    model = executor.runner.model
    for seq in seqs:
        tokens = torch.tensor(seq.tokens, device=executor.runner.device)
        with torch.inference_mode():
            dense = model.logits(model(tokens, torch.arange(len(tokens), device=tokens.device))).cpu()
        covered = 0
        for start, logits in pieces[seq.id]:
            torch.testing.assert_close(logits.cpu(), dense[start:start + len(logits)], atol=atol, rtol=rtol)
            covered += len(logits)
        assert covered >= seq.prompt_len  # every prompt token was checked at least once
        if executor.runner.dtype == torch.float32:  # (in fp16 near-ties may flip an argmax)
            # every generated token is the argmax of the dense logits at the position before it
            generated = dense[seq.prompt_len - 1:len(seq.tokens) - 1].argmax(-1).tolist()
            assert generated == seq.tokens[seq.prompt_len:]


def _attention_kernels_per_mixed_batch(monkeypatch, splits: int | None) -> None:
    """With `splits`, every batch's decode-type requests ask for that many split-K ranges, which keeps
    a mixed batch's decode and prefill attention apart (two kernels); None: the executor's own count
    (1 on CPU: mixed batches run one attention kernel for all rows)."""
    if splits is not None:
        monkeypatch.setattr("kvbound.engine_bridge.runner.decode_split_count", lambda *a, **k: splits)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("splits", [None, 2])
def test_chunked_evicted_refilled_and_batched_logits_match_a_dense_forward(block_size, splits, monkeypatch):
    _attention_kernels_per_mixed_batch(monkeypatch, splits)
    executor = Executor.build(SHAPE, block_size=block_size, max_tokens=64, max_sequences=3, max_seq_len=32)
    seqs, pieces = _run_mixed_schedule(executor)
    assert [s.generated for s in seqs] == [3, 4, 3]
    assert sum(len(logits) for _, logits in pieces[1]) == 7 + 1 + 9 + 1  # b's refill recomputed its 9 tokens
    _check_against_dense(executor, seqs, pieces, atol=1e-4)
    for seq in seqs:
        executor.blocks.free(seq)
    assert executor.blocks.num_free == executor.blocks.num_blocks


@pytest.mark.parametrize("splits,prefill_split,decode_calls", [(None, False, 1), (2, False, 4), (2, True, 1)])
def test_mixed_batches_run_one_attention_kernel_unless_decode_needs_split_k(splits, prefill_split, decode_calls,
                                                                            monkeypatch):
    """The decode kernel serves only decode-only batches (1 of the five) unless a mixed batch's decode-type
    requests need split-K ranges (then the three mixed batches with decodes use it too), which the prefill
    kernel gives them with `prefill_split`."""
    _attention_kernels_per_mixed_batch(monkeypatch, splits)
    executor = Executor.build(SHAPE, block_size=4, max_tokens=64, max_sequences=3, max_seq_len=32,
                              prefill_split=prefill_split)
    calls = {"decode": 0}
    real = executor.runner.ops.decode_attention

    def counted(*args, **kwargs):
        calls["decode"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(executor.runner.ops, "decode_attention", counted)
    _run_mixed_schedule(executor)
    assert calls["decode"] == decode_calls * SHAPE.layers


def test_the_check_is_not_vacuous():
    """A wrong position (here: a stale KV block table) must change the logits beyond the tolerance."""
    executor = Executor.build(SHAPE, block_size=4, max_tokens=64, max_sequences=3, max_seq_len=32)
    seqs, pieces = _run_mixed_schedule(executor)
    start, logits = pieces[0][1]
    shifted = torch.cat([logits[1:], logits[:1]])
    with pytest.raises(AssertionError):
        _check_against_dense(executor, seqs, {0: [(start, shifted)], 1: pieces[1], 2: pieces[2]}, atol=1e-4)


@pytest.mark.parametrize("splits,prefill_split", [(None, False), (2, False), (2, True)])
def test_triton_kernels_give_the_same_logits(splits, prefill_split, monkeypatch):
    """(2, True): split-K in the prefill kernel too, which then serves every row of each mixed batch."""
    _attention_kernels_per_mixed_batch(monkeypatch, splits)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # Triton's interpreter: read when triton and the kernels are first imported
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton", reason="the executor extra (triton) is not installed")
    executor = Executor.build(SHAPE, device=device, kernels="triton", block_size=4, max_tokens=64, max_sequences=3,
                              max_seq_len=32, prefill_split=prefill_split)
    seqs, pieces = _run_mixed_schedule(executor)
    if device == "cuda":  # fp16: the paged and the dense pass accumulate in different orders
        _check_against_dense(executor, seqs, pieces, atol=0.1, rtol=0.05)
    else:
        _check_against_dense(executor, seqs, pieces, atol=1e-4)


class _ReplayedPiece:
    """CUDA graph stand-in: replaying it runs the captured piece again (on CPU)."""

    def __init__(self, piece, pool):
        self.piece, self.replays = piece, 0

    def replay(self):
        self.replays += 1
        self.piece()

    def pool(self):
        return "pool"


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_piecewise_graphs_give_the_dense_logits(kernels, monkeypatch):
    """Mixed and prefill batches through the piecewise path (pieces replayed, attention eager
    between them, token counts padded to the captured sizes) give one dense pass's logits."""
    if kernels == "triton":
        if torch.cuda.is_available():
            pytest.skip("on CUDA the real piecewise graphs are compared with eager runs (test_engine_prepare)")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        pytest.importorskip("triton", reason="the executor extra (triton) is not installed")
    from kvbound.engine_bridge.piecewise import PiecewiseGraphs, token_sizes
    executor = Executor.build(SHAPE, kernels=kernels, block_size=4, max_tokens=64, max_sequences=3, max_seq_len=32)
    runner = executor.runner
    runner.pieces = PiecewiseGraphs(runner.model, runner.ops, token_sizes(64), lambda: runner.buffers.token_ids,
                                    lambda: runner.buffers.positions, runner.device, runner.dtype, record=_ReplayedPiece)
    assert runner.pieces.sizes == [16, 32, 48, 64]
    with torch.inference_mode():
        runner.pieces.capture()
    seqs, pieces = _run_mixed_schedule(executor)
    _check_against_dense(executor, seqs, pieces, atol=1e-4)
    replays = {size: graphs[0].replays for size, graphs in runner.pieces._graphs.items()}
    # the four mixed batches: 12 and 9 tokens padded to 16, 21 and 11 + ... to 32 and 16
    assert replays == {16: 3, 32: 1, 48: 0, 64: 0}
    assert all(g.replays == replays[size] for size, graphs in runner.pieces._graphs.items() for g in graphs)


@pytest.mark.parametrize("case,scheduler", [("cases/evict_better.toml", "vllm"),
                                            ("cases/evict_better.toml", "sarathi"),
                                            ("cases/example.toml", "sarathi")])
def test_replay_follows_the_semantics(case, scheduler):
    inst = kvbound.load_case(case)
    schedule = run_scheduler(inst, scheduler).schedule
    executor = Executor.for_instance(inst, SHAPE)
    result = executor.replay(inst, schedule)  # raises if any batch disagrees with ReplayState
    replay = kvbound.validate(inst, schedule)
    nonempty = [j for j, b in enumerate(schedule.batches) if b.tokens]
    assert result.batch_index == nonempty
    np.testing.assert_array_equal(result.features, replay.batch_features[nonempty])
    assert (result.measured > 0).all()
    np.testing.assert_allclose(result.predicted(inst.cost), np.diff(np.r_[0, replay.batch_end])[nonempty], rtol=1e-9)


def test_replay_catches_an_executor_that_breaks_the_semantics(monkeypatch):
    inst = kvbound.load_case("cases/evict_better.toml")
    schedule = run_scheduler(inst, "vllm").schedule
    executor = Executor.for_instance(inst, SHAPE)
    original = executor.step

    def forgets_evictions(work, evict=(), **kw):  # keeps the KV of evicted requests
        return original(work, (), **kw)

    monkeypatch.setattr(executor, "step", forgets_evictions)
    with pytest.raises(AssertionError, match="the semantics"):
        executor.replay(inst, schedule)


def test_block_manager_allocates_appends_and_frees_whole_blocks():
    blocks = BlockManager(num_blocks=5, block_size=4)
    a, b = Sequence(0, [0] * 9, 9, 2), Sequence(1, [0] * 3, 3, 2)
    blocks.allocate(a, 5)
    assert len(a.block_table) == 2 and blocks.num_free == 3
    blocks.allocate(a, 8)  # still two blocks
    assert len(a.block_table) == 2
    blocks.allocate(a, 9)  # appends a third
    blocks.allocate(b, 3)
    assert len(set(a.block_table + b.block_table)) == 4 and blocks.num_free == 1
    with pytest.raises(OutOfBlocks, match="request 1 needs 2 more KV blocks, 1 of 5"):
        blocks.allocate(b, 12)
    blocks.free(a)
    assert a.block_table == [] and blocks.num_free == 4


def test_named_shapes():
    s = SHAPES["llama-2-7b"]
    assert (s.hidden, s.heads, s.kv_heads, s.intermediate, s.vocab, s.layers, s.head_dim) == \
        (4096, 32, 32, 11008, 32000, 32, 128)
    assert s.kv_bytes_per_token(2) == 512 * 1024  # the figure behind the llama2-7b presets' decode_kv
    assert model_shape("llama-2-7b", layers=2).layers == 2 and model_shape("tiny").layers == SHAPES["tiny"].layers
    model = kvbound.engine_bridge.model.LlamaModel.random(model_shape("tiny", layers=1), torch.device("cpu"),
                                                          torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == 1024 * 256 * 2 + 256 * 512 + 256 * 256 + 3 * 256 * 688 + 3 * 256


def test_cuda_profile_grid_is_shaped_like_schedules_and_fits_an_80gb_gpu():
    # schedules are mostly decode-only batches (graph-replayed on CUDA) and their mixed batches hold
    # 1-8 prefill-type requests: the grid must weigh the one and span the other, and every
    # composition must fit beside the llama-2-7b weights on an 80 GB GPU
    from kvbound.engine_bridge.profile import MAX_BATCH_TOKENS, grid

    points = grid("cuda")
    decode_only = [p for p in points if p.prefill_requests == 0]
    assert len(decode_only) >= 40 and len(set(decode_only)) == len(decode_only)
    assert {p.decode_requests for p in decode_only} >= {1, 2, 4, 8, 16, 32, 64}
    assert {p.prefill_requests for p in points} == {0, 1, 2, 4, 8}
    assert all(p.prefill_requests * p.chunk + p.decode_requests <= MAX_BATCH_TOKENS["cuda"] for p in points)
    shape = SHAPES["llama-2-7b"]
    kv_gb = max(p.kv_tokens for p in points) * shape.kv_bytes_per_token(2) / 1e9
    assert kv_gb + 13.5 < 70  # the weights take 13.5 GB; leave room for activations and graphs


def _grid_features(points) -> np.ndarray:
    from kvbound.engine_bridge.sequence import work_features
    rows = []
    for p in points:
        work = [(Sequence(k, [1] * (p.decode_cached + 1), p.decode_cached, 1 << 30, cached=p.decode_cached), 1)
                for k in range(p.decode_requests)]
        work += [(Sequence(100 + k, [1] * (p.prefill_cached + p.chunk), p.prefill_cached + p.chunk, 1 << 30,
                           cached=p.prefill_cached), p.chunk) for k in range(p.prefill_requests)]
        rows.append(work_features(work))
    return np.array(rows)


def test_cuda_profile_grid_covers_the_batches_of_real_schedules(shared_data):
    """Every batch vllm and sarathi run on the first 40 conversation requests (M = 4,096, C = P = 2,048,
    the GPU replay case) lies within the ranges the CUDA grid spans for its kind: the fit interpolates."""
    from kvbound.costs.calibrate import profile_coverage
    from kvbound.engine_bridge.profile import grid
    from kvbound.io.traces import load_trace
    from kvbound.workload import Instance, Request, SystemConfig

    rows = [r for r in load_trace(shared_data / "traces" / "splitwise_conv.csv", limit=200)
            if r.prompt <= 2048 and -(-(r.prompt + r.output - 1) // 16) * 16 <= 4096][:40]
    inst = Instance(tuple(Request(r.prompt, r.output) for r in rows),
                    SystemConfig(kv_capacity=4096, max_batch_tokens=2048, max_prefill_tokens=2048, block_size=16),
                    kvbound.load_case("cases/example.toml").cost)
    profile = _grid_features(grid("cuda"))
    for scheduler in ("vllm", "sarathi"):
        schedule = run_scheduler(inst, scheduler).schedule
        replay = kvbound.validate(inst, schedule)
        batches = replay.batch_features[[j for j, b in enumerate(schedule.batches) if b.tokens]]
        assert (batches[:, 5] > 2).any()  # batches with more prefill-type requests than the old grid's 2
        assert profile_coverage(profile, batches) == {"covered": 1.0, "outside": {}}


def test_the_timer_pauses_the_garbage_collector_and_restores_it():
    """A collection falls on the same batch of every replay pass (it follows allocation counts), so the
    timed block runs without one; the collector's state before the block is left as it was."""
    import gc

    from kvbound.engine_bridge.timing import Timer
    timer = Timer(torch.device("cpu"))
    assert gc.isenabled()
    with timer:
        assert not gc.isenabled()
    assert gc.isenabled() and timer.seconds >= 0
    gc.disable()
    try:
        with timer:
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
