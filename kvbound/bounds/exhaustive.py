"""The optimum of a tiny instance by exhausting its states: a shortest path over batches.

A node is every request's (m cached, n generated) and the clock t (the end of the last batch); a move
is one batch (an evict-only one too: it takes no time) under the semantics' rules (C, P, M in blocks, evictions first, only arrived requests),
started at once or after waiting for a later arrival (waiting until any other moment never helps),
timed by `accounting.account_batch`. Each objective is a sum (total latency: the last) of event
times that moves fix: completions or first tokens. A* orders nodes by the events fixed so far plus
a lower bound on every pending one (`_cost_to_go`: each request's own least time from the later of
the clock and its arrival; for total latency also the batches still needed times the intercept plus
the work left, from the clock), so the first finished node popped is optimal, and the least priority
left open is a lower bound at every moment: a search cut short by its budget still certifies one.

Two nodes of the same state compare by (clock, events fixed): the one no later with no more fixed
dominates, as any continuation of the other can be replayed from it with every batch starting no
later. With every request at 0 the future of a state does not depend on the clock beyond a shift,
so one number orders them: the clock for total latency, the events fixed plus the clock times the
requests still waiting for the mean objectives. docs/formulation.md, "How a solve runs".
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from ..accounting import account_batch, round_to_blocks
from ..alone import fewest_batches, largest_chunk, token_work
from ..objective import Objective
from ..schedule import Batch, Schedule
from ..workload import Instance
from .kv_items import exclusive_holders

#: the most nodes the search expands (a few seconds in CPython on three requests)
MAX_EXPANSIONS = 200_000
#: it runs where the states within M (`state_count`) are at most this many (three_tight.toml: 26,221)
MAX_STATES = 30_000


@dataclass(frozen=True)
class Exhausted:
    """`bound`: every schedule's objective is at least this (seconds; mean objectives: the mean);
    `exact`: the search finished, so `bound` is the optimum and `schedule` an optimal schedule (None
    where cut short); `expanded`: the nodes it expanded."""

    bound: float
    exact: bool
    schedule: Schedule | None
    expanded: int


def state_count(instance: Instance, cap: int = MAX_STATES) -> int:
    """How many joint states (every request's m, n) hold at most M of KV, or a number above `cap`
    once the count passes it (counted by the KV held, request by request)."""
    s = instance.system
    # one request's own states, sum over n of (I + n + 1) and its finished one, are joint states too
    # (the others at nothing): past the cap, stop before counting any by KV (a loop that long request's
    # size would take, on every solve of a real trace)
    if any(r.output * (r.prompt + 1) + r.output * (r.output - 1) // 2 + 1 > cap for r in instance.requests):
        return cap + 1
    by_kv = {0: 1}  # KV held -> states of the requests so far
    for r in instance.requests:
        own: dict[int, int] = {0: 1}  # finished
        for n in range(r.output):
            for m in range(r.prompt + n + 1):
                kv = round_to_blocks(m, s.block_size)
                own[kv] = own.get(kv, 0) + 1
        joint: dict[int, int] = {}
        for a, x in by_kv.items():
            for c, y in own.items():
                if a + c <= s.kv_capacity:
                    joint[a + c] = joint.get(a + c, 0) + x * y
        by_kv = joint
        if sum(by_kv.values()) > cap:
            return cap + 1
    return sum(by_kv.values())


def searchable(instance: Instance) -> str | None:
    """Why `exhaust` does not run on this instance (None: it does)."""
    if state_count(instance) > MAX_STATES:
        return f"more than {MAX_STATES:,} states within M"
    return None


@dataclass
class _Node:
    state: tuple  # m_0, n_0, m_1, n_1, ...
    t: float  # the clock: the end of the last batch
    fixed: float  # the event times fixed so far (0 for total latency)
    parent: "_Node | None"
    batch: Batch | None  # the batch that led here


def exhaust(instance: Instance, objective: Objective, deadline=None, max_expansions: int = MAX_EXPANSIONS, *,
            allow_evict: bool = True, max_batch_size: int | None = None) -> Exhausted:
    """A* over the nodes of `instance` for `objective` (`searchable` should allow it), over the schedules
    without evictions where `allow_evict` is False and with at most `max_batch_size` requests processed
    per batch where one is given (the hypothesis constraints `no_evict` and `max_batch_size`)."""
    cost, s = instance.cost, instance.system
    C, P, M, b = s.max_batch_tokens, s.max_prefill_tokens, s.kv_capacity, s.block_size
    chunk = largest_chunk(instance)
    reqs = instance.requests
    k = len(reqs)
    prompt = [r.prompt for r in reqs]
    output = [r.output for r in reqs]
    arrival = [r.arrival for r in reqs]
    arrival_times = sorted(set(arrival))
    later_work = [[0.0, *itertools.accumulate(token_work(r, cost, chunk)[:0:-1])][::-1] for r in reqs]
    holders = {int(i) for i in exclusive_holders(instance)}
    mean, first, offline = objective.is_mean, objective.first_token, instance.offline
    most = k if max_batch_size is None else max_batch_size  # requests processed per batch

    def waiting(state, i) -> bool:
        """Whether request i's event (its completion, or its first token) is still to come."""
        n = state[2 * i + 1]
        return n == 0 if first else n < output[i]

    def priority(state, t: float, fixed: float) -> float:
        """The events fixed plus a lower bound on each pending one (module docstring)."""
        batches = later = prefill = 0
        first_pending = False
        work_left = 0.0
        pending = []
        for i in range(k):
            m, n = state[2 * i], state[2 * i + 1]
            if n == output[i]:
                continue
            uncached = prompt[i] + n - m
            decode = n >= 1 and uncached == 1
            # this token: each uncached token processed once, in at least one prefill-type chunk unless a
            # decode (an eviction only adds tokens); each later one its least work (`alone.token_work`)
            work = cost.per_token * uncached + (0.0 if decode else cost.per_prefill_request)
            left = output[i] - n
            own = left if decode else fewest_batches(uncached, left, chunk)
            work_left += work + later_work[i][n]
            if waiting(state, i):
                if first:
                    pending.append(max(t, arrival[i]) + fewest_batches(uncached, 1, chunk) * cost.intercept + work)
                else:
                    pending.append(max(t, arrival[i]) + own * cost.intercept + work + later_work[i][n])
            batches = max(batches, own)
            if not decode:
                prefill += uncached - (1 if n else 0)  # a refill's last token may be a decode
            if i in holders:
                later += output[i] - max(n, 1)
                first_pending = first_pending or n == 0
        if mean:
            return fixed + sum(pending)
        # batches from now: each alone; the exclusive holders' later tokens one a batch and their first
        # tokens in others; the prefill-type tokens over P
        batches = max(batches, later + first_pending, -(-prefill // P))
        return max([t + batches * cost.intercept + work_left, t, *pending])

    def moves(state, start: float, evict_only: bool):
        """(next state, tokens, evicted) for every batch starting at `start` that processes a token, and
        with `evict_only` every batch that only evicts (it takes no time: a request evicted and refilled
        may cost less than its decodes, and with no one else to process, that needs one)."""
        late = start + 1e-12 * (1.0 + abs(start))
        options = []
        for i in range(k):
            m, n = state[2 * i], state[2 * i + 1]
            if n == output[i] or arrival[i] > late:
                options.append(((m, n, round_to_blocks(m, b), 0, 0, False),))
                continue
            S = prompt[i] + n
            opts = [(m, n, round_to_blocks(m, b), 0, 0, False)]  # idle: m, n after, KV held, c, prefill c, evicted
            if m and allow_evict:
                opts.append((0, n, 0, 0, 0, True))  # evicted first, so it does not process
            decode = n >= 1 and S - m == 1
            for c in range(1, min(S - m, C if decode else chunk) + 1):
                after = m + c
                if after == S:
                    done = n + 1 == output[i]
                    opts.append((0 if done else after, n + 1, round_to_blocks(after, b), c, 0 if decode else c, False))
                else:
                    opts.append((after, n, round_to_blocks(after, b), c, c, False))
            options.append(opts)
        parts: list = []

        def extend(i, kv, tok, pre, busy):
            if i == k:
                if tok or (evict_only and any(o[5] for o in parts)):
                    nxt = tuple(x for o in parts for x in o[:2])
                    tokens = {j: o[3] for j, o in enumerate(parts) if o[3]}
                    yield nxt, tokens, tuple(j for j, o in enumerate(parts) if o[5])
                return
            for o in options[i]:
                if kv + o[2] > M or tok + o[3] > C or pre + o[4] > P or (o[3] and busy >= most):
                    continue
                parts.append(o)
                yield from extend(i + 1, kv + o[2], tok + o[3], pre + o[4], busy + (o[3] > 0))
                parts.pop()

        return extend(0, 0, 0, 0, 0)

    def rank(state, t: float, fixed: float) -> float:
        """With every request at 0: the one number that orders two nodes of a state (module docstring)."""
        if not mean:
            return t
        return fixed + t * sum(1 for i in range(k) if waiting(state, i))

    labels: dict = {}  # state -> its best rank (all at 0), or its undominated (clock, fixed) pairs

    def dominated(node: _Node, record: bool) -> bool:
        """A new node (`record`: kept as a label unless dominated, duplicates included), or a popped one
        (whether a node that dominates it was found after it was pushed)."""
        if offline or not mean:
            r = rank(node.state, node.t, node.fixed)
            seen = labels.get(node.state, math.inf)
            if not record:
                return seen < r
            if seen <= r:
                return True
            labels[node.state] = r
            return False
        seen = labels.setdefault(node.state, [])
        if not record:
            return (node.t, node.fixed) not in seen
        if any(t0 <= node.t and f0 <= node.fixed for t0, f0 in seen):
            return True
        seen[:] = [(t0, f0) for t0, f0 in seen if not (node.t <= t0 and node.fixed <= f0)]
        seen.append((node.t, node.fixed))
        return False

    cached, generated = [0] * k, [0] * k
    root = _Node(tuple(0 for _ in range(2 * k)), 0.0, 0.0, None, None)
    goal = tuple(x for i in range(k) for x in (0, output[i]))
    tie = itertools.count()
    # ties: the most batches first, so a search whose last moves fix nothing (mean TTFT once every first
    # token is out) runs on to a finished state instead of widening through them
    heap = [(priority(root.state, 0.0, 0.0), 0, next(tie), root)]
    dominated(root, True)
    expanded = 0
    scale, shift = (k, sum(arrival)) if mean else (1, 0.0)
    while heap:
        f, deeper, _, node = heapq.heappop(heap)
        if dominated(node, False):
            continue  # a node no later with no more fixed was found since
        if node.state == goal:
            value = node.fixed if mean else node.t
            return Exhausted((value - shift) / scale, True, _schedule(instance, node), expanded)
        expanded += 1
        # the clock at every node: one node's moves can number thousands (four requests' chunk sizes)
        if expanded > max_expansions or (deadline is not None and deadline.expired()):
            return Exhausted((f - shift) / scale, False, None, expanded)
        state = node.state
        for i in range(k):
            cached[i], generated[i] = state[2 * i], state[2 * i + 1]
        for start in [node.t, *(a for a in arrival_times if a > node.t)]:
            for nxt, tokens, evicted in moves(state, start, start == node.t):
                end = start + account_batch(tokens, cached, generated, prompt, evicted, b).time(cost)
                fixed = node.fixed
                if mean:
                    fixed += end * sum(1 for i in range(k) if waiting(state, i) and not waiting(nxt, i))
                child = _Node(nxt, end, fixed, node, Batch(tokens, evicted, start))
                if dominated(child, True):
                    continue
                heapq.heappush(heap, (priority(nxt, end, fixed), deeper - 1, next(tie), child))
    return Exhausted(math.inf, True, None, expanded)  # no finished state is reachable (a case is refused first)


def _schedule(instance: Instance, node: _Node) -> Schedule:
    batches = []
    while node.batch is not None:
        batches.append(node.batch)
        node = node.parent
    return Schedule(instance.requests, batches[::-1])
