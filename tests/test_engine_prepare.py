"""The executor's serving-engine structure (kvbound/engine_bridge): host batch preparation gives
the positions, slot mapping and block tables the paged layout implies; padding a decode batch
to a graph size writes only the dummy slot and leaves the real rows' outputs unchanged; the
decode-graph bookkeeping (which sizes are captured, which graph a batch replays in) with
CUDA's graph API replaced by fakes; replay reports host preparation apart from the model run.
Capturing and replaying real CUDA graphs needs a GPU: that test skips without one."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the executor extra (torch) is not installed")

import kvbound  # noqa: E402
from kvbound.engine_bridge.config import model_shape  # noqa: E402
from kvbound.engine_bridge.executor import Executor  # noqa: E402
from kvbound.engine_bridge.graphs import DecodeGraphs, graph_batch_sizes, padded_batch_size  # noqa: E402
from kvbound.engine_bridge.prepare import prepare_batch  # noqa: E402
from kvbound.engine_bridge.runner import PreparedBatch  # noqa: E402
from kvbound.engine_bridge.sequence import Sequence  # noqa: E402
from kvbound.kernels import decode_split_count  # noqa: E402
from kvbound.schedulers import run_scheduler  # noqa: E402

SHAPE = model_shape("tiny", layers=2)
BLOCK = 4


def _executor(**kw) -> Executor:
    return Executor.build(SHAPE, block_size=BLOCK, max_tokens=96, max_sequences=5, max_seq_len=40, **kw)


def _cached_sequences(executor: Executor) -> list[Sequence]:
    """Three decode-type sequences with 13, 7 and 20 cached tokens (prefilled on the executor)."""
    rng = np.random.default_rng(0)
    seqs = [Sequence(i, rng.integers(SHAPE.vocab, size=n).tolist(), n, 8) for i, n in enumerate((13, 7, 20))]
    executor.step([(s, s.prompt_len) for s in seqs])
    assert all(s.decode_type for s in seqs)
    return seqs


def test_preparation_gives_the_paged_layouts_positions_slots_and_tables():
    rng = np.random.default_rng(1)
    a = Sequence(0, rng.integers(99, size=10).tolist(), 9, 4, cached=9, block_table=[7, 2, 5])  # decode
    b = Sequence(1, rng.integers(99, size=12).tolist(), 12, 4, cached=5, block_table=[0, 3, 9])  # chunk of 6
    c = Sequence(2, rng.integers(99, size=3).tolist(), 3, 4, cached=0, block_table=[4])  # whole prompt
    work = [(a, 1), (b, 6), (c, 3)]
    host = prepare_batch(work, 1, block_size=BLOCK, table_width=5, dummy_block=11)
    expected_positions = [9] + list(range(5, 11)) + [0, 1, 2]
    np.testing.assert_array_equal(host.positions, expected_positions)
    owners = [a] + [b] * 6 + [c] * 3
    np.testing.assert_array_equal(host.slot_mapping, [s.block_table[p // BLOCK] * BLOCK + p % BLOCK
                                                      for s, p in zip(owners, expected_positions)])
    np.testing.assert_array_equal(host.token_ids, [s.tokens[p] for s, p in zip(owners, expected_positions)])
    np.testing.assert_array_equal(host.block_tables, [[7, 2, 5, 0, 0], [0, 3, 9, 0, 0], [4, 0, 0, 0, 0]])
    np.testing.assert_array_equal(host.seq_lens, [10, 11, 3])
    np.testing.assert_array_equal(host.query_lens, [1, 6, 3])
    np.testing.assert_array_equal(host.query_starts, [0, 0, 6])  # the prefill kernel's rows start at 0
    assert (host.num_decode, host.real_requests, host.real_tokens, host.max_prefill_query_len) == (1, 3, 10, 6)


def test_padding_is_for_decode_only_batches_and_points_at_the_dummy_block():
    a = Sequence(0, [1] * 6, 5, 4, cached=5, block_table=[3, 1])
    host = prepare_batch([(a, 1)], 1, block_size=BLOCK, table_width=3, dummy_block=8, pad_to=4)
    assert (host.num_requests, host.num_tokens, host.num_decode, host.real_requests, host.real_tokens) == (4, 4, 4, 1, 1)
    np.testing.assert_array_equal(host.slot_mapping, [1 * BLOCK + 1] + [8 * BLOCK] * 3)
    np.testing.assert_array_equal(host.block_tables[1:], [[8, 0, 0]] * 3)
    np.testing.assert_array_equal(host.seq_lens, [6, 1, 1, 1])
    np.testing.assert_array_equal(host.positions, [5, 0, 0, 0])
    b = Sequence(1, [1] * 3, 3, 4)
    with pytest.raises(ValueError, match="only a decode-only batch pads"):
        prepare_batch([(a, 1), (b, 3)], 1, block_size=BLOCK, table_width=3, dummy_block=8, pad_to=4)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_padded_rows_write_only_the_dummy_slot_and_leave_real_rows_unchanged(kernels, monkeypatch):
    if kernels == "triton":
        if torch.cuda.is_available():
            pytest.skip("the CPU test of the Triton interpreter; on CUDA the graph test below covers it")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        pytest.importorskip("triton", reason="the executor extra (triton) is not installed")
    executor = _executor(kernels=kernels)
    runner = executor.runner
    seqs = _cached_sequences(executor)
    work = [(s, 1) for s in seqs]
    for s, c in work:
        executor.blocks.allocate(s, s.cached + c)
    plain = runner.run(runner.prepare(work, 3)).clone()
    before = [k.clone() for k, _ in runner.kv_caches]
    padded = prepare_batch(work, 3, block_size=BLOCK, table_width=runner.table_width,
                           dummy_block=runner.dummy_block, pad_to=5)
    runner.buffers.load(padded)
    hidden = runner.run(PreparedBatch(padded, None))
    assert hidden.shape[0] == 5
    torch.testing.assert_close(hidden[:3], plain, atol=1e-5, rtol=1e-5)
    for (k, _), old in zip(runner.kv_caches, before):
        # real slots are rewritten with the same KV (up to the matmul's rounding at another row count)
        changed = ((k - old).abs() > 1e-5).flatten(0, 1).any(-1).any(-1).nonzero().flatten().tolist()
        assert changed == [runner.dummy_block * BLOCK]
    assert runner.dummy_block == executor.blocks.num_blocks  # never handed out


def test_graph_sizes_are_powers_of_two_then_the_largest_batch():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(16) == [1, 2, 4, 8, 16]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    sizes = graph_batch_sizes(40)
    assert [padded_batch_size(n, sizes) for n in (1, 3, 8, 17, 33, 40, 41)] == [1, 4, 8, 32, 40, 40, None]


def test_decode_graphs_capture_every_size_largest_first_and_replay_the_padded_one():
    """CUDA's graph API replaced by fakes: the bookkeeping, not the capture itself."""
    runs, pools = [], []

    class FakeGraph:
        def __init__(self):
            self.size = None
            self.replays = 0

        def pool(self):
            return ("pool", self.size)

        def replay(self):
            self.replays += 1

    @contextlib.contextmanager
    def capturing(graph, pool=None):
        pools.append(pool)
        yield
        graph.size = runs[-1]

    def run_decode(size):
        runs.append(size)
        return torch.full((size, 3), float(size))

    graphs = DecodeGraphs(graph_batch_sizes(12), run_decode, new_graph=FakeGraph, capturing=capturing)
    assert graphs.captured == []
    graphs.capture()
    assert graphs.captured == [1, 2, 4, 8, 12]
    assert runs == [12, 12, 8, 8, 4, 4, 2, 2, 1, 1]  # an eager run before each capture
    assert pools == [None] + [("pool", 12)] * 4  # the smaller graphs share the largest one's memory pool
    assert graphs.size_for(5) == 8 and graphs.size_for(13) is None
    out = graphs.replay(8)
    assert out.shape == (8, 3) and (out == 8).all() and graphs._graphs[8].replays == 1


def test_cpu_runs_eagerly_and_graphs_need_cuda_and_triton():
    executor = _executor()
    executor.warm_up(rounds=1)
    assert executor.runner.graphs is None
    with pytest.raises(ValueError, match="CUDA graphs need device cuda and the triton kernels"):
        _executor(graphs=True)


def test_split_count_bounds_the_longest_program_and_fills_the_gpu():
    assert decode_split_count(4, 32, 8192, 0) == 1  # not a GPU
    assert decode_split_count(8, 32, 1520, 132) == 3  # the longest request's keys in programs of <= 512
    assert decode_split_count(8, 32, 8192, 132) == 16  # 8192 keys: capped at 16 splits
    assert decode_split_count(256, 32, 8192, 132) == 1  # 8,192 programs: the others fill the wait
    assert decode_split_count(1, 32, 1024, 132) == 4  # two programs a multiprocessor, but splits of >= 256 keys
    assert decode_split_count(1, 32, 300, 132) == 1  # too short to split
    assert decode_split_count(1, 1, 1 << 20, 132) == 16  # capped


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device; not a hidden failure: "
                    "the bookkeeping is tested above with fakes, the capture itself only on a GPU")
def test_graph_replay_gives_the_eager_logits_on_cuda():
    pytest.importorskip("triton")
    graphed = Executor.build(SHAPE, device="cuda", block_size=BLOCK, max_tokens=96, max_sequences=5, max_seq_len=40)
    eager = Executor.build(SHAPE, device="cuda", block_size=BLOCK, max_tokens=96, max_sequences=5, max_seq_len=40,
                           graphs=False)
    outputs = []
    for executor in (graphed, eager):
        executor.warm_up(rounds=1)
        seqs = _cached_sequences(executor)
        steps = [executor.step([(s, 1) for s in seqs], keep_logits=True) for _ in range(3)]
        outputs.append([out.logits for out in steps])
    assert graphed.runner.graphs.captured == [1, 2, 4, 5]
    for g, e in zip(*outputs):
        for seq_id in g:
            torch.testing.assert_close(g[seq_id], e[seq_id], atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device; not a hidden failure: "
                    "the piecewise path is tested on CPU with replayed pieces (test_executor)")
def test_piecewise_graph_replay_gives_the_eager_logits_on_cuda():
    pytest.importorskip("triton")
    outputs = []
    for graphs in (True, False):
        executor = Executor.build(SHAPE, device="cuda", block_size=BLOCK, max_tokens=96, max_sequences=5,
                                  max_seq_len=40, graphs=graphs)
        executor.warm_up(rounds=1)
        seqs = _cached_sequences(executor)  # their prefill runs piecewise where graphed
        rng = np.random.default_rng(1)
        new = Sequence(3, rng.integers(SHAPE.vocab, size=30).tolist(), 30, 4)
        steps = [executor.step([(s, 1) for s in seqs] + [(new, 10)], keep_logits=True),
                 executor.step([(s, 1) for s in seqs] + [(new, 20)], keep_logits=True)]
        outputs.append([out.logits for out in steps])
        if graphs:
            assert executor.runner.pieces.captured[:2] == [16, 32]
    for g, e in zip(*outputs):
        for seq_id in g:
            torch.testing.assert_close(g[seq_id], e[seq_id], atol=2e-2, rtol=2e-2)


def test_replay_of_tiny_reports_preparation_apart_with_the_same_features():
    inst = kvbound.load_case("cases/replay_tiny.toml")
    schedule = run_scheduler(inst, "sarathi").schedule
    executor = Executor.for_instance(inst, SHAPE)
    result = executor.replay(inst, schedule)
    replay = kvbound.validate(inst, schedule)
    nonempty = [j for j, b in enumerate(schedule.batches) if b.tokens]
    np.testing.assert_array_equal(result.features, replay.batch_features[nonempty])
    assert result.prepare_seconds.shape == result.measured.shape
    assert (result.prepare_seconds > 0).all() and (result.measured > 0).all()
