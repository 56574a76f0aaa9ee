"""The executor: runs schedule batches on the model, one `step` per batch, under docs/semantics.md.

`replay` drives it from a Schedule and an Instance and checks it batch by batch against
`kvbound.schedule.ReplayState` (the one implementation of the semantics): after every batch,
each touched request's cached and generated counts, and the batch's cost features, must be
the ones the semantics gives.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..accounting import FEATURES, block_count
from ..costs import CostModel
from ..schedule import ReplayState, Schedule
from ..workload import Instance
from .block_manager import BlockManager
from .config import ModelShape
from .runner import ModelRunner
from .sequence import Sequence, work_features
from .timing import HostTimer, Timer

#: KV block size when the case's own is 1 (PagedAttention's default; a larger one only wastes part of a block)
DEFAULT_BLOCK_SIZE = 16
_WARMUP_ROUNDS = 3
_WARMUP_BLOCKS = 6  # the two warm-up sequences hold at most 4 + 2 blocks


def _warmup_tokens(block_size: int) -> int:
    return block_size + 1  # the warm-up's largest batch


@dataclass
class ReplayResult:
    """Features and measured seconds of every non-empty batch, in schedule order."""

    batch_index: list[int]  # position of each in the schedule
    decode_requests: list[int]  # decode-type requests in each (the prefill-type ones are features[:, 5])
    features: np.ndarray  # [batches, len(FEATURES)]
    measured: np.ndarray  # seconds: the model run (GPU time on CUDA), what the cost model predicts
    # host seconds preparing each batch (block allocation, input arrays, upload), not in `measured`
    prepare_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    paths: list[str] = field(default_factory=list)  # how each ran: "graph", "pieces" or "eager" (runner.PreparedBatch)

    def predicted(self, cost: CostModel) -> np.ndarray:
        return cost.predict(self.features)


@dataclass
class StepOutput:
    seconds: float  # model execution time of the batch (0 for a batch that processes nothing)
    logits: dict[int, torch.Tensor] | None = None  # with keep_logits: each sequence's [c, vocab] logits
    prepare_seconds: float = 0.0  # host time preparing the batch, not in `seconds`
    path: str = ""  # how the batch ran (runner.PreparedBatch.path); "" for one that processes nothing


class Executor:
    def __init__(self, runner: ModelRunner, blocks: BlockManager):
        self.runner, self.blocks = runner, blocks
        self.timer = Timer(runner.device)
        self.prepare_timer = HostTimer(runner.device)

    @classmethod
    def build(cls, shape: ModelShape, *, device: str = "cpu", block_size: int = DEFAULT_BLOCK_SIZE,
              max_tokens: int, max_sequences: int, max_seq_len: int, max_batch_tokens: int | None = None,
              kernels: str | None = None, graphs: bool | None = None, piecewise_tokens: int | None = None,
              prefill_split: bool = False, seed: int = 0) -> "Executor":
        """An executor whose pool holds `max_tokens` KV tokens of up to `max_sequences` sequences at
        once, each of up to `max_seq_len` tokens, running batches of up to `max_batch_tokens`
        tokens (default `max_tokens`: a batch's tokens are cached after it). Each sequence may
        leave its last block partly empty, hence one spare block per sequence, plus the warm-up's.
        `graphs`: capture decode-only batches as CUDA graphs and mixed ones of up to `piecewise_tokens`
        tokens (default runner.PIECEWISE_MAX_TOKENS) as piecewise graphs (default: on CUDA with the Triton kernels).
        `prefill_split`: split-K prefill attention where its programs are few (runner.ModelRunner)."""
        num_blocks = block_count(max_tokens, block_size) + max_sequences + _WARMUP_BLOCKS
        table_width = max(block_count(max_seq_len, block_size), _WARMUP_BLOCKS)
        batch_tokens = max(max_tokens if max_batch_tokens is None else max_batch_tokens, _warmup_tokens(block_size))
        runner = ModelRunner(shape, device=device, kernels=kernels, num_blocks=num_blocks, block_size=block_size,
                             table_width=table_width, max_batch_tokens=batch_tokens,
                             max_batch_requests=max(max_sequences, 2), graphs=graphs, piecewise_tokens=piecewise_tokens,
                             prefill_split=prefill_split, seed=seed)
        return cls(runner, BlockManager(num_blocks, block_size))

    @classmethod
    def for_instance(cls, instance: Instance, shape: ModelShape, *, device: str = "cpu", kernels: str | None = None,
                     graphs: bool | None = None, piecewise_tokens: int | None = None, prefill_split: bool = False,
                     seed: int = 0) -> "Executor":
        """Sized for any valid schedule of `instance`: at most M KV tokens at once (the M rule),
        KV blocks of the case's block size (or DEFAULT_BLOCK_SIZE where that is 1)."""
        system = instance.system
        return cls.build(shape, device=device, block_size=system.block_size if system.block_size > 1 else DEFAULT_BLOCK_SIZE,
                         max_tokens=system.kv_capacity, max_sequences=len(instance.requests),
                         max_seq_len=max(r.prompt + r.output - 1 for r in instance.requests),
                         max_batch_tokens=min(system.max_batch_tokens, system.kv_capacity), kernels=kernels,
                         graphs=graphs, piecewise_tokens=piecewise_tokens, prefill_split=prefill_split, seed=seed)

    # ------------------------------------------------------------------ one batch

    def step(self, work: list[tuple[Sequence, int]], evict: list[Sequence] = (), *,
             keep_logits: bool = False) -> StepOutput:
        """Execute one batch: free the KV of `evict`, then for each (sequence, c) process its next c
        tokens, write their KV, attend over its cache, and where all its tokens are now cached
        generate one (argmax); free the blocks of sequences that finish. The model execution
        (forward pass, LM head, sampling) is timed; the preparation before it (block allocation,
        the batch's input arrays and their upload to the static buffers) is timed apart.
        """
        with self.prepare_timer:
            for seq in evict:
                self.blocks.free(seq)
                seq.cached = 0
            work = sorted(work, key=lambda item: not item[0].decode_type)  # decode-type rows first
            num_decode = sum(seq.decode_type for seq, _ in work)
            for seq, c in work:
                self.blocks.allocate(seq, seq.cached + c)
            last_rows = np.cumsum([c for _, c in work], dtype=np.int64) - 1
            sampled = [k for k, (seq, c) in enumerate(work) if seq.cached + c == len(seq.tokens)]
            prepared = self.runner.prepare(work, num_decode) if work else None
        if not work:
            return StepOutput(0.0)
        with self.timer:
            hidden = self.runner.run(prepared)
            if keep_logits:
                logits = self.runner.logits(hidden)
                next_tokens = logits[last_rows[sampled]].argmax(-1).tolist()
            else:  # the LM head only for the tokens that generate, as serving systems do
                next_tokens = self.runner.logits(hidden[last_rows[sampled]]).argmax(-1).tolist()
        for seq, c in work:
            seq.cached += c
        for k, token in zip(sampled, next_tokens):
            seq = work[k][0]
            seq.tokens.append(token)
            if seq.finished:  # its KV is freed at once (semantics section 5)
                self.blocks.free(seq)
                seq.cached = 0
        if not keep_logits:
            return StepOutput(self.timer.seconds, prepare_seconds=self.prepare_timer.seconds, path=prepared.path)
        bounds = np.concatenate([[0], last_rows + 1])
        return StepOutput(self.timer.seconds,
                          {seq.id: logits[bounds[k]:bounds[k + 1]] for k, (seq, _) in enumerate(work)},
                          self.prepare_timer.seconds, prepared.path)

    def warm_up(self, rounds: int = _WARMUP_ROUNDS) -> None:
        """Run a few small prefill, decode and mixed batches (allocations, kernel compilation), then
        capture the decode graphs where they are enabled."""
        size = self.blocks.block_size
        for _ in range(rounds):
            a = Sequence(-1, [1] * (size + 1), size + 1, 3)
            b = Sequence(-2, [2] * max(size - 1, 1), max(size - 1, 1), 3)
            self.step([(a, size + 1)])
            self.step([(a, 1), (b, b.prompt_len)])
            self.step([(a, 1), (b, 1)])
            for seq in (a, b):
                self.blocks.free(seq)
        self.runner.capture_graphs()

    # ------------------------------------------------------------------ a whole schedule

    def replay(self, instance: Instance, schedule: Schedule, *, repeat: int = 1, seed: int = 0,
               on_batch: Callable[[int], None] | None = None) -> ReplayResult:
        """Execute every batch of a valid `schedule`, timing the non-empty ones.

        With `repeat` > 1 the whole schedule runs that many times (identical work: same token ids,
        argmax decoding) and each batch's fastest run counts. Passes, rather than back-to-back
        runs of one batch, so that a spell of interference from other processes on a shared
        machine, which only ever adds time, hits one pass of a batch and not all of its runs.
        """
        runs = [self._replay_once(instance, schedule, seed, on_batch) for _ in range(repeat)]
        first = runs[0]
        return ReplayResult(first.batch_index, first.decode_requests, first.features,
                            np.min([r.measured for r in runs], axis=0),
                            np.min([r.prepare_seconds for r in runs], axis=0), first.paths)

    def _replay_once(self, instance: Instance, schedule: Schedule, seed: int,
                     on_batch: Callable[[int], None] | None) -> ReplayResult:
        rng = np.random.default_rng(seed)
        vocab = self.runner.shape.vocab
        seqs = [Sequence(i, rng.integers(vocab, size=r.prompt).tolist(), r.prompt, r.output)
                for i, r in enumerate(instance.requests)]
        state = ReplayState(instance)
        index, decode, features, measured, prepare, paths = [], [], [], [], [], []
        for j, batch in enumerate(schedule.batches):
            evict = [seqs[i] for i in batch.evict]
            work = [(seqs[i], c) for i, c in batch.tokens.items()]
            if work:
                features.append(work_features(work))
                decode.append(sum(s.decode_type for s, _ in work))
                index.append(j)
                out = self.step(work, evict)
                measured.append(out.seconds)
                prepare.append(out.prepare_seconds)
                paths.append(out.path)
            else:  # evictions only: no work, and no time under the cost model
                self.step([], evict)
            state.apply(batch)
            _check_against_semantics(j, state, seqs, [s for s, _ in work] + evict, features[-1] if work else None)
            if on_batch:
                on_batch(j)
        if self.blocks.num_free != self.blocks.num_blocks:
            raise AssertionError(f"{self.blocks.num_blocks - self.blocks.num_free} KV blocks still held after the "
                                 "last batch")
        return ReplayResult(index, decode, np.array(features).reshape(-1, len(FEATURES)), np.array(measured),
                            np.array(prepare), paths)


def _check_against_semantics(j: int, state: ReplayState, seqs: list[Sequence], touched: list[Sequence],
                             features: np.ndarray | None) -> None:
    for seq in touched:
        i = seq.id
        if (seq.cached, seq.generated) != (state.m[i], state.n[i]):
            raise AssertionError(f"batch {j}, request {i}: the executor has m = {seq.cached}, n = {seq.generated}; "
                                 f"the semantics (kvbound.schedule) m = {state.m[i]}, n = {state.n[i]}")
        if (not seq.block_table) != (seq.cached == 0):
            raise AssertionError(f"batch {j}, request {i}: holds {len(seq.block_table)} blocks with m = {seq.cached}")
    if features is not None and not np.array_equal(features, np.array(state.features[-1])):
        raise AssertionError(f"batch {j}: executor features {features.tolist()} differ from the semantics' "
                             f"{list(state.features[-1])}")
