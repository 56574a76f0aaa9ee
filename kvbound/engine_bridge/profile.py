"""`kvbound profile`: time a grid of batch compositions on the executor, one CSV row per batch.

A composition is P prefill-type requests, each processing a chunk of c tokens after m_p
cached ones, beside D decode-type requests with m_d cached tokens each. The cached KV is
allocated but not computed (its values do not change the time). Each row records the
composition, the batch's six cost features (docs/semantics.md section 6) and its time.
"""
from __future__ import annotations

import csv
import io
import itertools
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..costs.calibrate import FEATURE_COLUMNS, TIME_COLUMN
from ..fileio import write_user_file
from .executor import Executor
from .sequence import Sequence, work_features


@dataclass(frozen=True)
class Composition:
    prefill_requests: int
    chunk: int
    prefill_cached: int
    decode_requests: int
    decode_cached: int

    @property
    def kv_tokens(self) -> int:
        return self.prefill_requests * (self.prefill_cached + self.chunk) + self.decode_requests * (self.decode_cached + 1)

    @property
    def max_seq_len(self) -> int:
        return max(self.prefill_cached + self.chunk, self.decode_cached + 1)


COMPOSITION_COLUMNS = ("prefill_requests", "chunk", "prefill_cached", "decode_requests", "decode_cached")
PREPARE_COLUMN = "prepare_seconds"  # host preparation of the timed run; after `seconds`, not in it

# (prefill requests, chunks, prefill cached, decode requests, decode cached); sized so that the
# features span what schedules of the shipped cases produce on each device's shape. On CUDA the
# mixed and prefill batches hold 1-8 prefill-type requests: schedules put 1-2 in most of them but up
# to 8 in some (vLLM's prefill batches), and since they run as piecewise graphs their fixed cost is
# the decode graphs' (while they ran eagerly, 4 and 8 in the grid pulled the per-request term to
# where the eager fixed cost was: bench/results/replay_cuda.md)
GRIDS = {
    "cpu": ((1, 2, 4), (1, 8, 32, 128), (0, 32, 128), (1, 2, 4, 8, 16), (16, 64, 256)),
    "cuda": ((1, 2, 4, 8), (16, 128, 512, 2048), (0, 512, 2048), (1, 8, 32, 64), (128, 512, 1024)),
}
MAX_BATCH_TOKENS = {"cpu": 512, "cuda": 4096}
#: decode-only compositions besides the grid's (decode requests, cached tokens each, at most
#: DECODE_ONLY_KV in all): they are most of what schedules run (93-96% of the batches of the 40-request
#: conversation case's schedules) and the only batches CUDA graphs replay, which the grid's 12 of 486
#: under-weighed (on an H100 the fit put the intercept at 9.1 ms where graph-replayed decode batches
#: took 6.1-10 ms: replays predicted 10-15% too much; bench/results/replay_cuda.md)
DECODE_ONLY = {"cpu": ((), ()), "cuda": ((1, 2, 4, 8, 16, 32, 64), (64, 128, 256, 512, 1024, 2048))}
DECODE_ONLY_KV = 65536


def grid(device: str) -> list[Composition]:
    """Prefill-only, decode-only and mixed compositions, at most MAX_BATCH_TOKENS tokens each."""
    n_pre, chunks, pre_cached, n_dec, dec_cached = GRIDS[device]
    prefill = [(0, 0, 0)] + list(itertools.product(n_pre, chunks, pre_cached))
    decode = [(0, 0)] + list(itertools.product(n_dec, dec_cached))
    out = []
    for (p, c, mp), (d, md) in itertools.product(prefill, decode):
        if (p or d) and p * c + d <= MAX_BATCH_TOKENS[device]:
            out.append(Composition(p, c, mp, d, md))
    for d, md in itertools.product(*DECODE_ONLY[device]):
        extra = Composition(0, 0, 0, d, md)
        if d <= MAX_BATCH_TOKENS[device] and d * md <= DECODE_ONLY_KV and extra not in out:
            out.append(extra)
    return out


def _sequences(comp: Composition, vocab: int, rng: np.random.Generator) -> list[tuple[Sequence, int]]:
    work = []
    for k in range(comp.decode_requests):  # generated one token, only that one uncached
        tokens = rng.integers(vocab, size=comp.decode_cached + 1).tolist()
        work.append((Sequence(k, tokens, comp.decode_cached, 1 << 30, cached=comp.decode_cached), 1))
    for k in range(comp.prefill_requests):  # its prompt's last chunk after `prefill_cached` tokens
        tokens = rng.integers(vocab, size=comp.prefill_cached + comp.chunk).tolist()
        seq = Sequence(comp.decode_requests + k, tokens, len(tokens), 1 << 30, cached=comp.prefill_cached)
        work.append((seq, comp.chunk))
    return work


def run_profile(executor: Executor, points: list[Composition], *, repeat: int = 5, seed: int = 0) -> list[tuple]:
    """Time each composition: `repeat` passes over the grid, each in a fresh random order, and the
    fastest run of each composition counts (see Executor.replay for why passes).
    Rows of COMPOSITION_COLUMNS, the six features, seconds, prepare seconds (host preparation of
    that fastest run, not in seconds)."""
    rng = np.random.default_rng(seed)
    vocab = executor.runner.shape.vocab
    fastest = np.full(len(points), np.inf)
    prepare = np.zeros(len(points))
    features = [None] * len(points)
    with tqdm(total=repeat * len(points), desc="profile", unit="batch", disable=None) as bar:  # no bar unless stderr is a terminal
        for _ in range(repeat):
            for k in rng.permutation(len(points)):
                comp = points[k]
                work = _sequences(comp, vocab, rng)
                for seq, _ in work:
                    executor.blocks.allocate(seq, seq.cached)
                features[k] = work_features(work)
                out = executor.step(work)
                if out.seconds < fastest[k]:
                    fastest[k], prepare[k] = out.seconds, out.prepare_seconds
                for seq, _ in work:
                    executor.blocks.free(seq)
                bar.update()
    return [(*astuple(comp), *f.tolist(), t, h) for comp, f, t, h in zip(points, features, fastest, prepare)]


def write_profile_csv(path: str | Path, rows: list[tuple]) -> None:
    """The profile CSV, written atomically: never half a file."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow((*COMPOSITION_COLUMNS, *FEATURE_COLUMNS, TIME_COLUMN, PREPARE_COLUMN))
    for row in rows:
        writer.writerow([f"{v:.9g}" if isinstance(v, float) else v for v in row])
    write_user_file(path, buffer.getvalue())  # a full disk: one error line naming the file
