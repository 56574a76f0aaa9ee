"""An independent brute-force optimiser for tiny instances: the tests' exact oracle.

It re-implements the semantics of docs/semantics.md (issue 2) from the text, on purpose
without importing `kvbound.schedule.ReplayState`, so that the oracle and the validator
check each other.

The search is A* over states

    (per request (m, n), clock t)

with m the cached tokens and n the tokens generated (n == O: finished). A move is one
batch, started either at once (at t) or after waiting for a later arrival (an optimal
schedule may idle for one; waiting until any other moment never helps). In the batch
every arrived, unfinished request idles, is evicted (m > 0), or processes c in 1..S-m
tokens (S = I + n), subject to C, P, M (block rounding) and optionally a maximum number
of processing requests. A batch that only evicts takes no time (it only matters when the
next batch refills the evicted request).

Each objective is a sum (or max) of event times, so it is written as a cost that grows
along a path:

* total_latency  J = end of the last batch
* mean_latency   J = sum of completion times  (minus the sum of arrivals, then / k)
* mean_ttft      J = sum of first-token times (minus the sum of arrivals, then / k)

The priority of a search node is f = (the events already fixed) + (a lower bound on each
pending event: it cannot happen before max(t, a_i) + r_i * t_min, where r_i is the
number of batches request i still needs (each batch generates at most one of its tokens)
and t_min = intercept + per_token is the cheapest batch). f never decreases along a move,
so the first goal node popped is optimal.

Two nodes with the same (m, n) are compared by (t, fixed events): a node that is no later
and has no worse fixed events dominates, because any continuation of the later one can be
replayed from the earlier one with every batch starting no later. Dominated nodes are
skipped. `heuristic=False, dominance=False` turns both off (plain uniform-cost search over
exact (m, n, t) states), which the tests use to check the pruned search.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from kvbound import Batch, CostModel, Instance, Request, Schedule, SystemConfig
from kvbound.costs import PRESETS

OBJECTIVES = ("total_latency", "mean_latency", "mean_ttft")


@dataclass
class OracleResult:
    value: float  # the optimal value of the objective (seconds)
    schedule: Schedule  # a schedule that attains it


@dataclass
class _Node:
    f: float  # priority: fixed events + lower bounds on the pending ones
    t: float  # the clock: end of the last batch
    fixed: float  # sum of the event times already fixed (0 for total_latency)
    state: tuple  # per request (m, n)
    parent: "_Node | None"
    move: tuple | None  # (start or None, tokens {id: c}, evicted ids): the batch that led here


class _Problem:
    """The instance's numbers and the semantics of one batch, written out plainly."""

    def __init__(self, instance: Instance, allow_evict: bool, max_batch_size: int | None):
        self.I = [r.prompt for r in instance.requests]
        self.O = [r.output for r in instance.requests]
        self.a = [r.arrival for r in instance.requests]
        self.k = len(self.I)
        s = instance.system
        self.C, self.P, self.M, self.b = s.max_batch_tokens, s.max_prefill_tokens, s.kv_capacity, s.block_size
        self.cost = instance.cost
        self.allow_evict = allow_evict
        self.max_batch_size = max_batch_size
        self.t_min = self.cost.intercept + self.cost.per_token
        self.arrival_times = sorted(set(self.a))

    def blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.b) * self.b

    def options(self, i: int, state, t: float):
        """Per-request choices in one batch: (c, evicted, kv after, prefill?, time contribution)."""
        m, n = state[i]
        if n == self.O[i]:
            return [(0, False, 0, False, 0.0)]
        kv_idle = self.blocks(m)
        if self.a[i] > t:  # not arrived: it can only wait (and holds nothing)
            return [(0, False, kv_idle, False, 0.0)]
        out = [(0, False, kv_idle, False, 0.0)]
        if self.allow_evict and m > 0:
            out.append((0, True, 0, False, 0.0))
        S = self.I[i] + n
        cm = self.cost
        for c in range(1, S - m + 1):
            decode = n >= 1 and S - m == 1
            if decode:
                dt = cm.per_token * c + cm.decode_kv * m
            else:
                dt = (cm.per_token * c + cm.prefill_attention * (c * c + 2 * m * c)
                      + cm.prefill_kv * m + cm.per_prefill_request)
            out.append((c, False, self.blocks(m + c), not decode, dt))
        return out

    def batches(self, state, t: float):
        """Every valid batch from `state` at time `t`: (tokens, evict, duration)."""
        per_request = [self.options(i, state, t) for i in range(self.k)]
        for choice in itertools.product(*per_request):
            tokens = sum(o[0] for o in choice)
            evicts = [i for i, o in enumerate(choice) if o[1]]
            if tokens == 0 and not evicts:
                continue
            if tokens > self.C:
                continue
            if sum(o[0] for o in choice if o[3]) > self.P:
                continue
            if sum(o[2] for o in choice) > self.M:
                continue
            if self.max_batch_size is not None and sum(1 for o in choice if o[0] > 0) > self.max_batch_size:
                continue
            duration = self.cost.intercept + sum(o[4] for o in choice) if tokens else 0.0
            if tokens:  # the convex token term, if the cost model has knees
                duration += sum(s * max(0, tokens - k) for k, s in zip(self.cost.token_knees, self.cost.per_token_above))
            yield {i: o[0] for i, o in enumerate(choice) if o[0] > 0}, tuple(evicts), duration

    def apply(self, state, tokens: dict, evict: tuple):
        """The state after a batch: m += c; a token is generated when m reaches S; KV freed at finish."""
        new = list(state)
        for i in evict:
            new[i] = (0, state[i][1])
        for i, c in tokens.items():
            m, n = state[i]
            m += c
            if m == self.I[i] + n:
                n += 1
                if n == self.O[i]:
                    m = 0
            new[i] = (m, n)
        return tuple(new)


def _goal(problem: _Problem, state) -> bool:
    # every objective needs a complete schedule (for mean_ttft too: without evictions a
    # state where every request has its first token may have no way to finish)
    return all(n == o for (_, n), o in zip(state, problem.O))


def _events(problem: _Problem, objective: str, before, after, end: float) -> float:
    """Event times fixed by one batch ending at `end` (completions or first tokens)."""
    if objective == "total_latency":
        return 0.0
    total = 0.0
    for i in range(problem.k):
        if objective == "mean_latency" and before[i][1] < problem.O[i] == after[i][1]:
            total += end
        if objective == "mean_ttft" and before[i][1] == 0 < after[i][1]:
            total += end
    return total


def _bound(problem: _Problem, objective: str, state, t: float, fixed: float, heuristic: bool) -> float:
    """f: fixed events plus a lower bound on each pending event time."""
    pending = []
    for i, (m, n) in enumerate(state):
        if objective == "mean_ttft":
            need = 1 if n == 0 else 0
        else:
            need = problem.O[i] - n
        if need:
            pending.append(max(t, problem.a[i]) + need * problem.t_min if heuristic else t)
    if objective == "total_latency":
        return max([t] + pending)
    return fixed + sum(pending)


def _search(problem: _Problem, objective: str, heuristic: bool, dominance: bool) -> _Node:
    """A* from the empty state at time 0; returns the first complete node popped (optimal)."""
    counter = itertools.count()
    state = tuple((0, 0) for _ in range(problem.k))
    root = _Node(_bound(problem, objective, state, 0.0, 0.0, heuristic), 0.0, 0.0, state, None, None)
    # ties: the later clock (nearer the end) first; without dominance the earlier clock, since
    # after the last first token mean_ttft's f is flat and evict/refill loops would go on forever
    tie = -1.0 if dominance else 1.0
    heap = [(root.f, 0.0, next(counter), root)]
    labels: dict = {}  # (m, n) -> [(t, fixed)] expanded
    closed: set = set()
    while heap:
        _, _, _, node = heapq.heappop(heap)
        if _goal(problem, node.state):
            return node
        if dominance:
            seen = labels.setdefault(node.state, [])
            if any(t0 <= node.t and f0 <= node.fixed for t0, f0 in seen):
                continue
            seen.append((node.t, node.fixed))
        else:
            key = (node.state, node.t)
            if key in closed:
                continue
            closed.add(key)
        # a batch now, or after waiting for a later arrival (waiting is part of the move, so
        # a later start is never compared with, and pruned by, the node it waits from)
        for start in [node.t] + [a for a in problem.arrival_times if a > node.t]:
            for tokens, evict, duration in problem.batches(node.state, start):
                if start > node.t and not tokens:
                    continue  # evicting takes no time: do it now, not after a wait
                end = start + duration
                after = problem.apply(node.state, tokens, evict)
                fixed = node.fixed + _events(problem, objective, node.state, after, end)
                f = _bound(problem, objective, after, end, fixed, heuristic)
                child = _Node(f, end, fixed, after, node, (start if start > node.t else None, tokens, evict))
                heapq.heappush(heap, (f, tie * end, next(counter), child))
    raise AssertionError("no schedule finishes this instance (the case validation should have refused it)")


def _path(node: _Node) -> list[_Node]:
    out = []
    while node.parent is not None:
        out.append(node)
        node = node.parent
    return out[::-1]


def _batches(path: list[_Node]) -> list[Batch]:
    return [Batch(dict(tokens), tuple(evict), start) for start, tokens, evict in (node.move for node in path)]


def brute_force(instance: Instance, objective: str = "total_latency", allow_evict: bool = True,
                max_batch_size: int | None = None, *, heuristic: bool = True, dominance: bool = True) -> OracleResult:
    """The exact optimum of `objective` over every valid schedule of a tiny instance."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}")
    problem = _Problem(instance, allow_evict, max_batch_size)
    goal = _search(problem, objective, heuristic, dominance)
    if objective == "total_latency":
        value = goal.t
    else:
        value = (goal.fixed - sum(problem.a)) / problem.k
    return OracleResult(value, Schedule(instance.requests, _batches(_path(goal))))


# --------------------------------------------------------------------------- tiny instances for tests

#: cost models for tiny instances: every batch 1 s; the A100 preset; all six terms non-zero; a per-token
#: slope that bends at 3 and 6 tokens (dyadic numbers, so sums are exact and ties are real ties)
TINY_COSTS = {
    "unit-batches": CostModel(intercept=1.0),
    "llama2-7b-a100": PRESETS["llama2-7b-a100"],
    "all-terms": CostModel(intercept=1.0, per_token=0.25, decode_kv=0.125, prefill_attention=0.0625,
                           prefill_kv=0.5, per_prefill_request=0.75),
    "kinked": CostModel(intercept=1.0, per_token=0.125, decode_kv=0.0625, token_knees=(3, 6), per_token_above=(0.25, 0.5)),
}


def tiny_instances(min_requests: int = 2, max_requests: int = 3, max_prompt: int = 4, max_output: int = 3,
                   arrivals: bool | None = None, costs=tuple(TINY_COSTS)):
    """Hypothesis strategy: instances small enough for `brute_force` (2-3 requests, I <= 4, O <= 3).

    arrivals: False offline, True some request arrives later, None either. Arrivals are small
    multiples of the cost model's intercept, so that waiting for one is sometimes worth it.
    costs: names from TINY_COSTS to draw from.
    """
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        k = draw(st.integers(min_requests, max_requests))
        cost_name = draw(st.sampled_from(sorted(costs)))
        cost = TINY_COSTS[cost_name]
        online = draw(st.booleans()) if arrivals is None else arrivals
        requests = []
        for i in range(k):
            arrival = 0.0
            if online and i > 0:
                arrival = draw(st.sampled_from([0, 1, 2, 3, 5])) * 0.5 * cost.intercept
            requests.append(Request(draw(st.integers(1, max_prompt)), draw(st.integers(1, max_output)), arrival))
        if online and all(r.arrival == 0 for r in requests):
            requests[-1] = Request(requests[-1].prompt, requests[-1].output, 0.5 * cost.intercept)
        b = draw(st.integers(1, 3))
        blocks = [-(-r.peak_kv // b) * b for r in requests]
        M = draw(st.integers(max(blocks), sum(blocks) + b))
        C = draw(st.integers(1, 2 * max_prompt))
        P = draw(st.one_of(st.just(C), st.integers(1, C)))
        return Instance(tuple(requests), SystemConfig(M, C, P, b), cost, name=f"tiny/{cost_name}")

    return build()
