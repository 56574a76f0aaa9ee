"""The accounting of one batch under docs/semantics.md, each rule written once.

* `is_decode_type`: which processing requests are decode-type (section 3);
* `block_count`, `round_to_blocks`: KV charged in whole blocks (section 4);
* `account_batch`: a batch's cost features (section 6, `FEATURES`), its prefill-type tokens (the P
  rule) and the KV its processing requests add (the M rule); `BatchAccount.time` is its time;
* `largest_batch_time`: an upper bound on the time of any valid batch.

The validator and the simulator (`ReplayState.apply`), the schedulers, the executor and the
formulations count batches with these. This module imports nothing else from kvbound (the
cost model and the system only arrive as arguments, `BatchCost` and `Limits`), so anything may
import it.
"""
from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import NamedTuple, Protocol

#: the features of a batch the cost model weighs, in its coefficients' order (the intercept's is 1
#: for a batch that processes anything)
FEATURES = (
    "intercept",
    "per_token",
    "decode_kv",
    "prefill_attention",
    "prefill_kv",
    "per_prefill_request",
)


class BatchCost(Protocol):
    """What accounting needs of a cost model (`kvbound.costs.CostModel`)."""

    def batch_time(self, tokens: int, decode_kv: int, prefill_attention: int, prefill_kv: int,
                   prefill_requests: int) -> float: ...


class Limits(Protocol):
    """What accounting needs of the system limits (`kvbound.workload.SystemConfig`)."""

    kv_capacity: int
    max_batch_tokens: int


def block_count(tokens, block: int):
    """Blocks of `block` tokens that hold `tokens` tokens (ceil; ints or numpy arrays)."""
    return -(-tokens // block)


def round_to_blocks(tokens, block: int):
    """KV tokens charged for `tokens` cached tokens: rounded up to whole blocks (ints or numpy arrays)."""
    return tokens if block == 1 else block_count(tokens, block) * block


def is_decode_type(generated, uncached):
    """Decode-type: the request has generated a token (n >= 1) and only that token is uncached
    (S - m == 1); every other processing request is prefill-type. Ints or numpy arrays."""
    return (generated >= 1) & (uncached == 1)


class BatchAccount(NamedTuple):
    """What one batch costs; the first six fields after `tokens` follow the cost model's features."""

    tokens: int  # sum of c
    decode_kv: int  # sum of m over decode-type requests
    prefill_attention: int  # sum of c^2 + 2 m c over prefill-type requests
    prefill_kv: int  # sum of m over prefill-type requests
    prefill_requests: int
    prefill_tokens: int  # sum of c over prefill-type requests (the P rule)
    kv_growth: int  # blocks-rounded KV the processing requests add (the M rule)
    overdrawn: bool  # some request processes more than its S - m uncached tokens: not a valid batch

    @property
    def features(self) -> tuple:
        """The batch's `FEATURES`; all 0 for a batch that processes nothing."""
        return (1.0 if self.tokens else 0.0, self.tokens, self.decode_kv, self.prefill_attention,
                self.prefill_kv, self.prefill_requests)

    def time(self, cost: BatchCost) -> float:
        return cost.batch_time(self.tokens, self.decode_kv, self.prefill_attention, self.prefill_kv,
                               self.prefill_requests)


def account_batch(tokens: Mapping[int, int], cached: Sequence[int] | Mapping[int, int],
                  generated: Sequence[int] | Mapping[int, int], prompt: Sequence[int] | Mapping[int, int],
                  evicted: Container[int] = (), block: int = 1) -> BatchAccount:
    """Account a batch that processes `tokens[i]` = c tokens of each request i, whose state
    before the batch is `cached[i]` = m, `generated[i]` = n and `prompt[i]` = I (S = I + n);
    requests in `evicted` are counted with m = 0, as the batch's evictions happen first.

    This is the validator's hot path, one call per batch: `is_decode_type` is written out inline
    (`n >= 1 and S - m == 1`), and a batch that evicts nobody skips the membership test, because a
    call or a test per request costs measurably there (the full Splitwise trace: 4.2 million).
    """
    tok = decode_kv = attention = prefill_kv = prefill_requests = prefill_tokens = 0
    overdrawn = False
    for i, c in tokens.items():
        m = 0 if evicted and i in evicted else cached[i]
        n = generated[i]
        uncached = prompt[i] + n - m
        if c > uncached:
            overdrawn = True
        tok += c
        if n >= 1 and uncached == 1:  # is_decode_type(n, uncached)
            decode_kv += m
        else:
            prefill_tokens += c
            prefill_requests += 1
            attention += c * c + 2 * m * c
            prefill_kv += m
    if block == 1:  # in tokens, the KV added is what is processed
        kv = tok
    else:
        kv = 0
        for i, c in tokens.items():
            m = 0 if i in evicted else cached[i]
            kv += round_to_blocks(m + c, block) - round_to_blocks(m, block)
    return BatchAccount(tok, decode_kv, attention, prefill_kv, prefill_requests, prefill_tokens, kv, overdrawn)


def largest_batch_time(system: Limits, cost: BatchCost, n_requests: int, tokens_held: int | None = None) -> float:
    """An upper bound on the time of any valid batch of an instance with `n_requests` requests, whose
    requests together process or hold at most `tokens_held` tokens in one batch (their I + O - 1
    summed; None: no such cap).

    A batch processes at most C tokens, its requests hold at most M cached tokens together (the
    M rule), so sum c^2 + 2 m c <= C^2 + 2 M C, and each prefill-type request processes >= 1
    token, so there are at most min(N, C) of them; every feature's coefficient is >= 0, and the
    convex token term is largest at C tokens. The models' Big-M constants come from this bound, so
    a loose one (C = 4,096 beside a few tokens) lets a solver's tolerance buy a wrong optimum.
    """
    C, M = system.max_batch_tokens, system.kv_capacity
    if tokens_held is not None:
        C, M = min(C, tokens_held), min(M, tokens_held)
    return cost.batch_time(C, M, C * C + 2 * M * C, M, min(n_requests, C))
