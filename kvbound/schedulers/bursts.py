"""Burst schedules: a constructive builder for the mean objectives that does what the exact optima of
the ground-truth set do and the work-conserving schedulers do not (bench/results/NOTES.md, "Issue 33,
item 4: schedules"):

* **first tokens first** (mean TTFT): batches hold only first prefills, the shortest in the order
  first (or, `shortest_left`, the least prompt still to process first, as shortest remaining processing
  time does), each batch filled to its token budget with a chunk of the next (or, without `fill`,
  whole prompts only, a chunk only alone); a request that has its first token is evicted when the KV
  it holds is needed (it changes no first token) and decodes wait until every first token is out,
  where `complete_schedule` finishes the requests;
* **waiting for a burst**: with arrival times, a batch may start later, at the next arrival, so that
  the new request joins it instead of waiting a whole batch (the intercept) for the next one;
* **groups**: at most `group` requests admitted and unfinished at once, each admitted only while the
  peaks (I + O - 1) of those admitted fit in M, so a group is prefilled together, then decoded
  together, without evictions;
* **refill instead of decode**: where the cost model makes recomputing a request's S tokens cheaper
  than decoding with its m cached ones (per_token S + attention < per_token + decode_kv m), it is
  evicted in a batch of its own (no time) and refilled.

`build_burst(instance, keys, params, constraints)` returns a schedule (every batch applied through
`ReplayState.apply`, the one implementation of the semantics, so it is valid by construction; a
ledger validates it again) or None where it cannot finish under the constraints. The order is
`keys` (lowest first); the search (`kvbound.solvers.phases.bursts`) moves orders and parameters.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

import numpy as np

from ..accounting import is_decode_type
from ..constraints import Constraints
from ..schedule import Batch, ReplayState, Schedule, ScheduleError
from ..workload import Instance
from .rewrite import complete_schedule


#: how many waiting requests a batch passes over (they do not fit) before it stops admitting: keeps a
#: batch's cost bounded on traces of thousands of requests
SCAN = 32


@dataclass(frozen=True)
class BurstParams:
    """first_tokens: the first-tokens-first mode (for mean TTFT); group: at most this many requests
    admitted and unfinished (None: as many as M allows); wait: a batch waits for the next arrival while
    (that arrival - now) x (requests the batch would serve) <= wait x intercept; refill: recompute
    instead of decode where cheaper; fill: a new prefill may be a chunk that fills the batch's budget;
    reserve: admit a request only while the peaks of the admitted ones fit in M (never evicts), else
    while the batch's KV fits, evicting the latest admitted requests in the order where one that comes
    before them in it needs the room; shortest_left (first-tokens mode): the least uncached prompt first
    (ties: the order), and without `fill` no chunk that leaves a prompt unfinished beside others (a
    started one's included)."""

    first_tokens: bool = False
    group: int | None = None
    wait: float = 0.0
    refill: bool = False
    fill: bool = True
    reserve: bool = True
    shortest_left: bool = False

    def label(self) -> str:
        parts = ["first-tokens" if self.first_tokens else f"group={self.group or 'M'}"]
        if self.wait:
            parts.append(f"wait={self.wait:g}")
        if self.refill:
            parts.append("refill")
        if not self.fill:
            parts.append("no-fill")
        if not self.reserve:
            parts.append("greedy-kv")
        if self.shortest_left:
            parts.append("shortest-left")
        return "burst(" + ",".join(parts) + ")"


def refill_pays(instance: Instance) -> bool:
    """Whether recomputing some request's S = I + 1 tokens costs less than its first decode (m = I):
    only then can `refill` change a schedule."""
    cost = instance.cost
    for r in instance.requests:
        if r.output < 2:
            continue
        if cost.work(r.prompt + 1, 0, False) < cost.work(1, r.prompt, True):
            return True
    return False


class _Builder:
    def __init__(self, instance: Instance, keys, params: BurstParams, constraints: Constraints):
        self.inst, self.p, self.cons = instance, params, constraints
        s = instance.system
        self.C, self.P, self.M, self.b = s.max_batch_tokens, s.max_prefill_tokens, s.kv_capacity, s.block_size
        self.cap = constraints.max_batch_size or len(instance)
        self.evict_ok = not constraints.no_evict
        self.chunk_ok = not constraints.no_chunk
        self.cost = instance.cost
        order = np.argsort(np.asarray(keys, dtype=float), kind="stable")
        self.rank = np.empty(len(instance), dtype=np.int64)
        self.rank[order] = np.arange(len(instance))
        self.rank = self.rank.tolist()
        self._blocks = s.blocks  # KV charged for cached tokens, in whole blocks
        self.peak = [s.blocks(r.peak_kv) for r in instance.requests]
        self.by_arrival = sorted(range(len(instance)), key=lambda i: (instance.requests[i].arrival, i))
        self.arrival = [r.arrival for r in instance.requests]
        self.st = ReplayState(instance)
        self.batches: list[Batch] = []
        self.ptr = 0  # next in by_arrival not yet arrived
        self.waiting: list[tuple[int, int]] = []  # (rank, id): arrived, not admitted
        self.running: list[tuple[int, int]] = []  # (rank, id): admitted, unfinished
        self.reserved = 0  # the peaks of the running requests
        self.has_first = [False] * len(instance)
        self.firsts = 0  # requests with their first token
        self.holders: list[tuple[int, int]] = []  # (rank, id): unfinished, first token out, KV cached

    # ------------------------------------------------------------------ helpers
    def _arrive(self, now: float) -> None:
        late = now + 1e-9 * (1.0 + abs(now))
        while self.ptr < len(self.by_arrival) and self.arrival[self.by_arrival[self.ptr]] <= late:
            i = self.by_arrival[self.ptr]
            bisect.insort(self.waiting, (self.rank[i], i))
            self.ptr += 1

    def _next_arrival(self) -> float | None:
        return self.arrival[self.by_arrival[self.ptr]] if self.ptr < len(self.by_arrival) else None

    def _apply(self, batch: Batch) -> None:
        st = self.st
        st.apply(batch)  # ScheduleError: a builder bug, caught by build_burst
        self.batches.append(batch)
        for i in batch.evict:
            self._drop(self.holders, i)
        for i in batch.tokens:
            if st.n[i] >= 1 and not self.has_first[i]:
                self.has_first[i] = True
                self.firsts += 1
                if self.p.first_tokens:  # out of the queue: the completion serves it
                    self._drop(self.waiting, i)
            if st.finished[i]:
                self._drop(self.holders, i)
            elif st.n[i] >= 1 and st.m[i] > 0:
                k = bisect.bisect_left(self.holders, (self.rank[i], i))
                if k == len(self.holders) or self.holders[k][1] != i:
                    self.holders.insert(k, (self.rank[i], i))

    def _drop(self, queue: list, i: int) -> None:
        k = bisect.bisect_left(queue, (self.rank[i], i))
        if k < len(queue) and queue[k][1] == i:
            del queue[k]

    def _room(self, queue: list, budget: int, used: int = 0) -> bool:
        """Whether the next arrival could join a batch of `budget` tokens (`used` taken already) that
        takes the uncached prompts of `queue` whole in its order where they fit: if its prompt fits in
        what they leave, or it comes before one they took in the order (waiting can only pay then)."""
        if self.ptr >= len(self.by_arrival):
            return False
        nxt = self.by_arrival[self.ptr]
        left, last, skipped = budget - used, -1, 0
        for rank, i in queue:
            need = self.st.prompt[i] + self.st.n[i] - self.st.m[i]
            if need <= left:
                left -= need
                last = rank
                if left <= 0:
                    break
            else:
                skipped += 1
                if skipped > SCAN:
                    break
        return self.st.prompt[nxt] <= left or self.rank[nxt] < last

    def _start(self, now: float, ready: int, room) -> float:
        """When the next batch starts: now, or the later arrivals it waits for, one at a time while
        (arrival - now) x (requests it serves, `ready`) <= wait x intercept and `room()` says the
        batch still has room for the next one."""
        if self.p.wait <= 0:
            return now
        start, budget = now, self.p.wait * self.cost.intercept
        while room():
            a = self._next_arrival()
            if a is None or (a - now) * max(1, ready) > budget:
                break
            start = a
            self._arrive(start)
            ready += 1
        return start

    # ------------------------------------------------------------------ the modes
    def run(self) -> Schedule | None:
        st = self.st
        stall = 0
        limit = 4 * (sum(st.prompt) + sum(st.output)) + 4 * len(self.inst) + 16
        while st.unfinished:
            if self.p.first_tokens and self.firsts == len(self.inst):
                if not self.evict_ok or self.cons.no_chunk:
                    return complete_schedule(self.inst, self.batches, self.cons)
                self._to_groups()
            made = self._first_token_batch() if self.p.first_tokens else self._group_batch()
            stall = 0 if made else stall + 1
            if stall > 3 or len(self.batches) > limit:
                return None
        return Schedule(self.inst.requests, self.batches)

    def _to_groups(self) -> None:
        """Every first token is out: the rest is served in groups with peak reservation (what it costs
        changes no first token). The holders earliest in the order stay while their peaks fit in M;
        the others are evicted (a batch of evictions only: no time) and queue again, in the order."""
        st = self.st
        self.p = replace(self.p, first_tokens=False, group=None, wait=0.0, refill=False, reserve=True)
        keep, out = [], []
        for rank, i in self.holders:
            if self.reserved + self.peak[i] <= self.M:
                keep.append((rank, i))
                self.reserved += self.peak[i]
            else:
                out.append(i)
        if out:
            self._apply(Batch({}, tuple(out), None))
        kept = {i for _, i in keep}
        self.running = keep
        self.waiting = sorted((self.rank[i], i) for i in range(len(self.inst)) if not st.finished[i] and i not in kept)

    def _first_token_batch(self) -> bool:
        st = self.st
        now = st.now
        self._arrive(now)
        if not self.waiting:  # every arrived request has its first token: to the next arrival
            a = self._next_arrival()
            if a is None:
                return False
            self._arrive(a)
            now = a
        start = self._start(now, len(self.waiting), lambda: self._room(self.waiting, min(self.C, self.P)))
        tokens: dict[int, int] = {}
        evict: list[int] = []
        tok = 0
        kv = st.kv_used
        victim = len(self.holders)  # first tokens out, KV held: the latest in the order evicted first
        skipped = 0
        queue = self.waiting
        if self.p.shortest_left:  # the least prompt left first (ties: the order), not the order alone
            prompt, m = st.prompt, st.m
            queue = sorted(queue, key=lambda w: (prompt[w[1]] - m[w[1]], w[0]))
        for _, i in queue:
            if len(tokens) >= self.cap or tok >= min(self.C, self.P) or skipped > SCAN:
                break
            m = st.m[i]
            rem = st.prompt[i] - m
            c = min(rem, self.C - tok, self.P - tok)
            if c < rem and (not self.chunk_ok or (not self.p.fill and (m == 0 or self.p.shortest_left) and tokens)):
                skipped += 1
                continue
            grow = self._blocks(m + c) - self._blocks(m)
            while kv + grow > self.M and self.evict_ok and victim > 0:
                victim -= 1
                h = self.holders[victim][1]
                evict.append(h)
                kv -= self._blocks(st.m[h])
            if kv + grow > self.M:
                c = min(c, (self.M - kv + self._blocks(m)) // self.b * self.b - m)  # the largest chunk that fits
                if c < 1 or (c < rem and not self.chunk_ok):
                    skipped += 1
                    continue
                grow = self._blocks(m + c) - self._blocks(m)
            tokens[i] = c
            tok += c
            kv += grow
        if not tokens:
            # nothing fits (KV held, evictions forbidden): decode the holders until some finish
            tokens, evict = self._decodes(), []
            if not tokens:
                return False
        self._apply(Batch(tokens, tuple(evict), start if start > st.now else None))
        return True

    def _decodes(self) -> dict[int, int]:
        st = self.st
        out, kv = {}, st.kv_used
        for _, i in self.holders:
            if len(out) >= min(self.cap, self.C):
                break
            if not is_decode_type(st.n[i], st.prompt[i] + st.n[i] - st.m[i]):
                continue
            grow = self._blocks(st.m[i] + 1) - self._blocks(st.m[i])
            if kv + grow <= self.M:
                out[i] = 1
                kv += grow
        return out

    def _group_batch(self) -> bool:
        st, p = self.st, self.p
        now = st.now
        self._arrive(now)
        if not self.running and not self.waiting:
            a = self._next_arrival()
            if a is None:
                return False
            self._arrive(a)
            now = a
        group = p.group or len(self.inst)
        start = self._start(now, len(self.running) + len(self.waiting),
                            lambda: len(self.running) < group and self._room(self.waiting, min(self.C, self.P), len(self.running)))
        # refills: decode-type running requests whose recompute is cheaper, evicted in a batch of their own
        if p.refill and self.evict_ok:
            refill = []
            for _, i in self.running:
                S = st.prompt[i] + st.n[i]
                if (st.n[i] >= 1 and S - st.m[i] == 1 and S <= min(self.C, self.P)
                        and self.cost.work(S, 0, False) < self.cost.work(1, st.m[i], True)):
                    refill.append(i)
            if refill:
                self._apply(Batch({}, tuple(refill), start if start > st.now else None))
                start = st.now
        tokens: dict[int, int] = {}
        evict: list[int] = []
        evicted: set[int] = set()
        victim = len(self.running)
        tok = ptok = 0
        kv = st.kv_used
        admitted = []
        w = 0  # walk running and waiting merged by rank
        run_list, wait_list = self.running, self.waiting
        r = 0
        admitting = True
        skipped = 0
        while (r < len(run_list) or w < len(wait_list)) and len(tokens) < self.cap and tok < self.C:
            if w >= len(wait_list) or (r < len(run_list) and run_list[r] < wait_list[w]):
                i, new = run_list[r][1], False
                r += 1
            else:
                i, new = wait_list[w][1], True
                w += 1
                if not admitting:
                    if r >= len(run_list):
                        break
                    continue
                if len(self.running) + len(admitted) >= group or skipped > SCAN:
                    admitting = False
                    continue
                if p.reserve and self.reserved + self.peak[i] > self.M:
                    skipped += 1
                    continue  # a smaller one may still fit
            if kv >= self.M and self.b == 1 and (p.reserve or not self.evict_ok or victim == 0
                                                  or self.running[victim - 1][0] <= self.rank[i]):
                break  # M is full, nothing after i in the order to evict: no later request can grow a block
            if i in evicted:
                continue
            m = st.m[i]
            S = st.prompt[i] + st.n[i]
            decode = is_decode_type(st.n[i], S - m)
            if decode:
                c = 1
            else:
                c = min(S - m, self.C - tok, self.P - ptok)
                if c < 1:
                    continue
                if c < S - m and (not self.chunk_ok or (new and not p.fill and tokens)):
                    continue
            grow = self._blocks(m + c) - self._blocks(m)
            if kv + grow > self.M and not p.reserve and self.evict_ok:
                # room from the running requests latest in the order, not in this batch, holding KV (one
                # pointer down the running list per batch: the walk goes up the order, victims must come after)
                while kv + grow > self.M and victim > 0 and self.running[victim - 1][0] > self.rank[i]:
                    victim -= 1
                    h = self.running[victim][1]
                    if h not in tokens and st.m[h] > 0:
                        evict.append(h)
                        evicted.add(h)
                        kv -= self._blocks(st.m[h])
            if kv + grow > self.M:
                if decode or not self.chunk_ok:
                    continue
                c = min(c, (self.M - kv + self._blocks(m)) // self.b * self.b - m)  # the largest chunk that fits
                if c < 1 or (new and not p.fill and tokens):
                    continue
                grow = self._blocks(m + c) - self._blocks(m)
            tokens[i] = c
            tok += c
            ptok += 0 if decode else c
            kv += grow
            if new:
                admitted.append(i)
                self.reserved += self.peak[i]
        if not tokens:
            return False
        self._apply(Batch(tokens, tuple(evict), start if start > st.now else None))
        for i in admitted:
            self._drop(self.waiting, i)
            bisect.insort(self.running, (self.rank[i], i))
        done = set(st.done)
        if done:
            for i in done:
                self._drop(self.running, i)
                self.reserved -= self.peak[i]
        return True


def build_burst(instance: Instance, keys, params: BurstParams, constraints: Constraints = Constraints()) -> Schedule | None:
    """The burst schedule of `instance` in the order `keys` (lowest first) under `params`; None where
    it gets stuck under `constraints` (every batch it returns passed the semantics' replay)."""
    if constraints.no_hybrid or constraints.admission_order is not None:
        return None  # the builder mixes phases and picks its own admission order
    try:
        return _Builder(instance, keys, params, constraints).run()
    except ScheduleError as exc:  # a builder bug, not bad input: say so plainly
        raise RuntimeError(f"burst builder produced an invalid batch: {exc}") from exc


def build_prefill_groups(instance: Instance, groups: list[list[int]],
                         constraints: Constraints = Constraints()) -> Schedule | None:
    """First tokens in `groups` (request ids, in order): each group's prompts whole in one batch
    where they fit min(C, P) and the batch-size cap, else in as few batches as fit, in the group's
    order; a request with its first token is evicted (the latest made first) when a prompt needs the
    KV (and where a group's prompts overfill M together, the last ones wait for the next batch),
    decodes wait; then `complete_schedule` finishes every request. The groups of the mean-TTFT
    batching bound (`bounds.analytic.first_prefill_groups`) make a schedule whose first tokens come
    as that bound's relaxation has them where no group needs more than one batch. None where
    `constraints` forbid it (no chunks and a prompt over min(C, P); no evictions and KV that does
    not fit; an admission order, as the groups set their own) or were not tried with it (no hybrid
    batches, as `build_burst`)."""
    if constraints.no_hybrid or constraints.admission_order is not None:
        return None
    st = ReplayState(instance)
    s = instance.system
    budget, cap = min(s.max_batch_tokens, s.max_prefill_tokens), constraints.max_batch_size or len(instance)
    batches: list[Batch] = []
    holders: list[int] = []  # first token out, KV held: the latest evicted first
    for group in groups:
        left = {i: st.prompt[i] for i in group}
        while left:
            tokens, room = {}, budget
            for i, rem in left.items():
                if room <= 0 or len(tokens) >= cap:
                    break
                c = min(rem, room)
                if c < rem and constraints.no_chunk:
                    if tokens:
                        break
                    return None
                tokens[i] = c
                room -= c
            need = {i: s.blocks(st.m[i] + c) - s.blocks(st.m[i]) for i, c in tokens.items()}  # KV each adds
            grow = sum(need.values())
            kv, evict = st.kv_used, []
            while kv + grow > s.kv_capacity and holders and not constraints.no_evict:
                h = holders.pop()
                evict.append(h)
                kv -= s.blocks(st.m[h])
            while kv + grow > s.kv_capacity and len(tokens) > 1:  # the group's prompts overfill M together:
                i, _ = tokens.popitem()  # the last one added waits for the next batch
                grow -= need[i]
            if kv + grow > s.kv_capacity:
                return None
            batch = Batch(tokens, tuple(evict))
            try:
                st.apply(batch)
            except ScheduleError as exc:  # a builder bug, not bad input: say so plainly
                raise RuntimeError(f"prefill-group builder produced an invalid batch: {exc}") from exc
            batches.append(batch)
            for i, c in tokens.items():
                left[i] -= c
                if not left[i]:
                    del left[i]
                    if not st.finished[i]:
                        holders.append(i)
    return complete_schedule(instance, batches, constraints)


__all__ = ["BurstParams", "build_burst", "build_prefill_groups", "refill_pays"]
