"""The KV each request holds in distinct batches of any schedule, and what that says about batch counts.

The batch generating token q of request i holds at least I + q - 1 KV tokens (block-rounded), in any
schedule, with pauses or evictions; before its first token, its prefill's batches hold what they
have processed. These *items* share batches of capacity M, so their area, their dual-feasible weights
(Fekete and Schepers) and the configuration LP (`configuration_lp`) all count batches. The first
batches hold less while prefills fill the cache: the *prefill ramp* (docs/formulation.md, "Bounds",
"The prefill ramp").
"""
from __future__ import annotations

import math

import numpy as np

from ..alone import batches_alone, tokens_waited
from ..objective import Objective
from ..workload import Instance

#: the dual-feasible functions u^(k) tried, k = 1 .. this many
DFF_FUNCTIONS = 64


def dual_feasible_weights(used: np.ndarray, capacity: int, k: int) -> np.ndarray:
    """Fekete and Schepers' dual-feasible function u^(k) of used / capacity: x if (k + 1) x is an
    integer, else floor((k + 1) x) / k. Superadditive with u(1) = 1, so the weights of whatever fits
    in one batch sum to at most 1."""
    return dff_numerators(used, capacity, k) / (k * capacity)


def dff_numerators(used, capacity: int, k: int) -> np.ndarray:
    """u^(k) times k * capacity: integers, so that the integer (CP-SAT) model can take the rows."""
    used = np.asarray(used, dtype=np.int64)
    scaled = (k + 1) * used
    return np.where(scaled % capacity == 0, k * used, (scaled // capacity) * capacity)


def kv_room(system) -> int:
    """The most KV a batch can charge: M rounded down to whole blocks (each request's KV is)."""
    return system.kv_capacity // system.block_size * system.block_size


def ramp_capacities(instance: Instance) -> np.ndarray:
    """The most KV items batch t = 1, 2, ... can hold while the cache fills, up to the first batch
    that can hold `kv_room`.

    An item's tokens were each processed in its batch or before, and the first t batches process at
    most C t tokens, so the unrounded items of batch t sum to at most C t; block rounding adds at
    most b - 1 per request holding an item there, and those are at most the most requests whose
    smallest items (the least each has processed) fit in C t together."""
    s = instance.system
    room, per_batch = kv_room(s), s.max_batch_tokens
    t = np.arange(1, -(-room // per_batch) + 1, dtype=np.int64)
    least = (instance.prompts.astype(np.int64) - 1) % s.max_prefill_tokens + 1  # each request's smallest item, unrounded
    holding = np.searchsorted(np.cumsum(np.sort(least)), per_batch * t, side="right")
    return np.minimum(room, per_batch * t + (s.block_size - 1) * holding)


def batches_to_hold(total, ramp: np.ndarray, full: float):
    """The fewest batches whose capacities add up to `total` (a number, or an array of them; a hair
    less passes: `total` may be a floating-point sum with relative error ~1e-12): batch t holds
    ramp[t - 1] while the ramp lasts (never empty), `full` after it."""
    totals = np.asarray(total, dtype=float) * (1 - 1e-9)
    filled = np.cumsum(ramp, dtype=float)
    within = np.searchsorted(filled, totals - 1e-9) + 1
    beyond = len(filled) + np.maximum(0.0, np.ceil((totals - filled[-1]) / full - 1e-9)) if full > 0 else len(filled)
    batches = np.where(totals <= 1e-9, 0, np.where(totals <= filled[-1], within, beyond)).astype(np.int64)
    return int(batches) if batches.ndim == 0 else batches


def kv_items(instance: Instance, objective: Objective = Objective.TOTAL_LATENCY) -> tuple[np.ndarray, np.ndarray]:
    """(items, owner): KV that a request holds at least in distinct batches of any schedule, block-rounded,
    and the request each item belongs to. The batch generating its token q holds I + q - 1 (q = 1..O;
    only q = 1 where the objective waits for first tokens); before the first, it holds I - j p in the
    j-th batch back of the prefill that brings its KV to I (j = 1, 2, .. while positive; p = P, the most
    a batch prefills or refills), whatever pauses or evictions came between."""
    prompts = instance.prompts.astype(np.int64)
    count = tokens_waited(instance, objective)
    owner = np.repeat(np.arange(len(count)), count)
    q = np.arange(len(owner)) - np.repeat(np.cumsum(count) - count, count) + 1  # 1..O within each request
    p = instance.system.max_prefill_tokens
    chunks = batches_alone(instance, Objective.MEAN_TTFT) - 1  # batches of the prefill before its last
    before = np.repeat(np.arange(len(count)), chunks)
    j = np.arange(len(before)) - np.repeat(np.cumsum(chunks) - chunks, chunks) + 1  # 1..chunks within each request
    tokens = np.r_[prompts[owner] + q - 1, prompts[before] - j * p]
    return np.asarray(instance.system.blocks(tokens), dtype=np.int64), np.r_[owner, before]


def kv_weights(instance: Instance, objective: Objective = Objective.TOTAL_LATENCY, items=None) -> np.ndarray:
    """Per request (rows) the weights of its KV items (`kv_items`) under each dual-feasible function
    u^(k), k = 1..DFF_FUNCTIONS (columns): whatever shares one batch weighs at most 1 in every column.
    `items`: `kv_items`' answer where the caller has it already."""
    from scipy.sparse import csr_matrix

    items, owner = items if items is not None else kv_items(instance, objective)
    M, n = instance.system.kv_capacity, len(instance)
    # each function once per distinct item size (block-rounded: a few thousand), its integer numerators summed
    # exactly per request through the (request, size) counts; 13x faster than item by item on 4 million items
    sizes, size_of = np.unique(items, return_inverse=True)
    counts = csr_matrix((np.ones(len(items), dtype=np.int64), (owner, size_of)), shape=(n, len(sizes)))
    k = np.arange(1, DFF_FUNCTIONS + 1)
    numerators = np.stack([dff_numerators(sizes, M, j) for j in k], axis=1)
    return np.asarray(counts @ numerators) / (k * M)


def dff_batches(instance: Instance, items=None) -> int:
    """Batches needed by the KV items (`kv_items`, or `items` where the caller has them; one per
    request and batch): max over k of sum u^(k)(item / M), rounded up."""
    return math.ceil(kv_weights(instance, items=items).sum(axis=0).max() - 1e-9)


def min_batches(instance: Instance) -> int:
    """The fewest batches of any complete schedule: the longest output, all tokens over C, the prompts
    over P, the KV items' area over the prefill ramp and their dual-feasible weights."""
    s = instance.system
    reqs = instance.requests
    by_output = max(r.output for r in reqs)
    by_tokens = math.ceil(sum(r.peak_kv for r in reqs) / s.max_batch_tokens)
    by_prefill = math.ceil(sum(r.prompt for r in reqs) / s.max_prefill_tokens)
    items = kv_items(instance)
    by_area = batches_to_hold(float(items[0].sum()), ramp_capacities(instance), kv_room(s))
    return max(by_output, by_tokens, by_prefill, by_area, dff_batches(instance, items))


def batches_for_smallest(tokens, capacity_tokens: int, area, ramp: np.ndarray, room: float) -> np.ndarray:
    """Per k = 1, 2, ..: the fewest batches that process the k smallest of `tokens` (at most
    `capacity_tokens` a batch) and hold the k smallest of `area` (`batches_to_hold`: the prefill ramp,
    then `room` a batch); any k requests with these token counts and KV areas need that many."""
    by_tokens = np.ceil(np.cumsum(np.sort(tokens)) / capacity_tokens - 1e-9)
    return np.maximum(by_tokens, batches_to_hold(np.cumsum(np.sort(area)), ramp, room)).astype(np.int64)


class CompletionFloor:
    """The fewest batches by which k requests can all have completed, k = 1..N (batches that process a
    token). The k requests done first processed their tokens (I + O - 1 each, at most C a batch) and held
    their KV items (`kv_items`) in those batches: so at least the k smallest token counts over C, the k
    smallest areas over the prefill ramp and the k smallest sums of each dual-feasible weight
    (`completion_order_bounds` prices the same sets in time). Called with each request's earliest
    completion batch, only requests whose earliest batch is below j count among those done before
    batch j, and the tokens and the areas are those of the smallest of them."""

    def __init__(self, instance: Instance):
        s, n = instance.system, len(instance)
        self.tokens = np.array([r.peak_kv for r in instance.requests], dtype=np.int64)
        self.C = s.max_batch_tokens
        items, owner = kv_items(instance, Objective.MEAN_LATENCY)
        self.area = np.bincount(owner, items, n).astype(float)
        self.ramp, self.room = ramp_capacities(instance), kv_room(s)
        weights = np.sort(kv_weights(instance, Objective.MEAN_LATENCY, (items, owner)), axis=0)
        by_weights = np.ceil(np.cumsum(weights, axis=0) - 1e-9).max(axis=1).astype(np.int64)
        #: floor[k - 1] over every set of k requests
        self.floor = np.maximum(self._held(np.arange(n)), by_weights)

    def _held(self, among: np.ndarray) -> np.ndarray:
        return batches_for_smallest(self.tokens[among], self.C, self.area[among], self.ramp, self.room)

    def __call__(self, earliest: np.ndarray) -> np.ndarray:
        """floor[k - 1], where request i completes no earlier than batch earliest[i]: the first batch j
        such that K_{j+1} >= k, K_j (the most requests done before batch j) being the fewest of the
        requests with earliest < j, of those of them whose smallest tokens and areas fit in j - 1
        batches, and of the ranks whose `floor` is below j."""
        n = len(earliest)
        order = np.argsort(earliest, kind="stable")
        ranked = np.asarray(earliest)[order]
        top = int(max(ranked[-1], self.floor[-1])) + 1  # K_top = n: every request fits by then
        K = np.zeros(top + 1, dtype=np.int64)
        plain = np.searchsorted(self.floor, np.arange(top + 1) - 1, side="right")
        for m in range(n + 1):  # batches j where exactly m requests have earliest < j
            lo = 0 if m == 0 else int(ranked[m - 1]) + 1
            hi = top if m == n else int(ranked[m])
            if hi < lo:
                continue
            j = np.arange(lo, hi + 1)
            K[lo:hi + 1] = np.minimum.reduce([np.full(len(j), m), plain[lo:hi + 1],
                                              np.searchsorted(self._held(order[:m]), j - 1, side="right")])
        K[top] = n  # by the floor every request fits: rounding cannot make a later claim
        return np.searchsorted(K, np.arange(1, n + 1), side="left") - 1


def exclusive_holders(instance: Instance) -> np.ndarray:
    """The requests (indices, longest prompt first) of the largest set G, among those with at least two
    tokens to generate, no two of which hold KV together from their first token on unless one was
    evicted: for every pair, blocks(I_a + 1) + blocks(I_b) > M. After its first token a request holds at
    least I (blocks) until it finishes or is evicted, and the batch generating a later token holds at
    least I + 1; so in a batch where a member generates a token after its first, no other member has
    its first token and is neither finished nor evicted since (`analytic.exclusive_holders_bound`).
    The condition grows with both prompts, so the largest such set is the longest prompts down to the
    first pair that breaks it (ties: the longer output first)."""
    s = instance.system
    order = np.array(sorted((i for i, r in enumerate(instance.requests) if r.output >= 2),
                            key=lambda i: (-instance.requests[i].prompt, -instance.requests[i].output)), dtype=np.int64)
    prompts = instance.prompts[order].astype(np.int64)
    k = 1
    while k < len(order):  # the set's two shortest prompts decide it
        a, b = int(prompts[k]), int(prompts[k - 1])  # a <= b
        if not (s.blocks(a + 1) + s.blocks(b) > s.kv_capacity and s.blocks(b + 1) + s.blocks(a) > s.kv_capacity):
            break
        k += 1
    return order[:k] if k >= 2 else order[:0]
