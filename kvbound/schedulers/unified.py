"""Algorithm 1 of the seed paper: one configurable scheduler behind vLLM, Sarathi and the rest.

Per batch, requests are visited in priority order (groups, then an order inside each
group). For each candidate: skip it if hybrid batching is off and it is of the other
phase than the batch; size its chunk (decode 1, prefill all remaining tokens or, with
chunked prefill, what the C and P budgets leave); then check the KV reservation. A
running candidate short of memory evicts lower-priority running requests (or itself
when none is left); a waiting candidate short of memory or budget stops admission.

Memory is accounted in reservations (`Policy.reserved`): a request admitted from the
waiting queue reserves its whole sequence S (or I + O - 1 for eviction-free variants; or,
with `reserve="chunk"`, only the KV it holds after this batch, m + c, as vLLM V1 allocates
blocks), a decode grows its reservation by one token. Actual KV never exceeds the reservations,
so every batch respects M. With `reserve="future"` a waiting request is admitted only while
MC-SF's projection of the running set's KV (each request one token a batch until its last)
fits in M at every future batch (`_future_fits`).
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from ..accounting import is_decode_type
from ..schedule import Batch, ReplayState
from ..workload import Instance
from .base import Policy, future_kv_fits

PRIORITIES = ("prefill", "decode", "rank-i", "rank-o", "running")


@dataclass(frozen=True)
class UnifiedParams:
    priority: str = "decode"  # prefill: waiting first (vLLM); decode: running decodes first (Sarathi); rank-i/o: one group by I or O;
    # running: every running request (decodes and unfinished prefills alike, by admission key) before waiting ones (vLLM V1)
    hybrid: bool = True  # prefill-type and decode-type requests in one batch
    chunked: bool = True  # prefill chunks smaller than the remaining tokens
    prefill_limit: int | None = None  # the policy's P; None: the system's P (min of both applies)
    victim: str = "lowest-priority"  # or "shortest": the running request with the fewest cached tokens
    reserve: str = "incremental"  # or "peak": reserve I + O - 1 at admission (eviction-free); "future": _future_fits
    admit_order: str = "arrival"  # with priority prefill/decode, waiting requests by: arrival; output (O); work (I + O)
    decode_order: str = "arrival"  # or "longest-first": running decodes with larger m first (evict-short)
    max_running: int | None = None  # at most this many running requests (admitted, unfinished); None: no cap
    token_limit: int | None = None  # the policy's per-batch token budget (min with C applies); None: C
    admit_after_evict: bool = True  # false: no admission in a batch that evicts (vLLM V1)

    def __post_init__(self):
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}")
        if self.prefill_limit is not None and self.prefill_limit < 1:
            raise ValueError(f"prefill_limit must be >= 1 (or none: the system's P), got {self.prefill_limit}")
        if self.victim not in ("lowest-priority", "shortest"):
            raise ValueError("victim must be lowest-priority or shortest")
        if self.reserve not in ("incremental", "peak", "future", "chunk"):
            raise ValueError("reserve must be incremental, peak, future or chunk")
        for key in ("max_running", "token_limit"):
            v = getattr(self, key)
            if v is not None and v < 1:
                raise ValueError(f"{key} must be >= 1 (or none: no limit), got {v}")
        if self.admit_order not in ("arrival", "output", "work"):
            raise ValueError("admit_order must be arrival, output or work")
        if self.decode_order not in ("arrival", "longest-first"):
            raise ValueError("decode_order must be arrival or longest-first")


class UnifiedScheduler(Policy):
    #: whether an admission pattern's keys order this scheduler (`OrderedScheduler`)
    ranks_by_keys = True

    def __init__(self, name: str, params: UnifiedParams):
        super().__init__()
        self.name = name
        self.params = params

    def options(self) -> dict:
        """The constructor's options beyond the parameters (subclasses with their own knobs)."""
        return {}

    def _P(self, instance: Instance) -> int:
        s = instance.system
        p = self.params.prefill_limit
        P = s.max_prefill_tokens if p is None else min(p, s.max_prefill_tokens)
        return P if self.params.token_limit is None else min(P, self.params.token_limit)

    def refuse_reason(self, instance: Instance) -> str | None:
        if self.params.chunked:
            return None
        P = self._P(instance)
        may_evict = self.params.reserve == "incremental"
        for i, r in enumerate(instance.requests):
            if r.prompt > P:
                return f"request {i} has a prompt of {r.prompt} tokens, more than P = {P}, and this scheduler does not chunk prefills"
            if may_evict and r.peak_kv > P:
                return (f"request {i} may need a refill of up to I + O - 1 = {r.peak_kv} tokens after an eviction, "
                        f"more than P = {P}, and this scheduler does not chunk prefills")
        return None

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        self.P = self._P(instance)
        if self.params.token_limit is not None:
            self.C = min(self.C, self.params.token_limit)
        reqs = instance.requests
        pr = self.params.priority
        if pr == "rank-i":
            self._rank = [(r.prompt, r.arrival) for r in reqs]
        elif pr == "rank-o":
            self._rank = [(r.output, r.arrival) for r in reqs]
        elif self.params.admit_order == "output":
            self._rank = [(0, r.output, r.arrival) for r in reqs]
        elif self.params.admit_order == "work":
            self._rank = [(0, r.prompt + r.output, r.arrival) for r in reqs]
        else:
            self._rank = [(0, r.arrival) for r in reqs]
        self._peak = [r.peak_kv for r in reqs]
        self._ordinal = self._ordinal_of = None  # position of each request in the running order (`_by_rank`)
        self._gate = [True]  # whether `_order` may still read the waiting queue in this batch

    def waiting_key(self, i: int) -> tuple:
        return self._rank[i]

    # ------------------------------------------------------------------ ordering
    def _waiting_order(self, st: ReplayState):
        """The waiting requests in admission order (subclasses with a time-dependent order override
        this and return a list); here the queue's own order, read lazily: a batch reads the queue only
        up to where admission stops."""
        return map(itemgetter(1), self.waiting)

    def _running_rank(self, st: ReplayState) -> list:
        """Per request: the key that orders running requests (and picks lowest-priority victims)."""
        return self._rank

    def _by_rank(self, ids, st: ReplayState) -> list[int]:
        """`ids` by (running rank, id): with the class's own ranks (fixed per request), by their
        precomputed position in that order."""
        if type(self)._running_rank is UnifiedScheduler._running_rank:
            if self._ordinal is None or self._ordinal_of is not self._rank:
                order = sorted(range(len(self._rank)), key=lambda i: (self._rank[i], i))
                self._ordinal = [0] * len(order)
                for pos, i in enumerate(order):
                    self._ordinal[i] = pos
                self._ordinal_of = self._rank
            return sorted(ids, key=self._ordinal.__getitem__)
        rank = self._running_rank(st)
        return sorted(ids, key=lambda i: (rank[i], i))

    def _order(self, st: ReplayState) -> tuple:
        """(candidates in priority order, running requests in priority order). A candidate is a
        request id or a list of decode-type running requests in a row (`next_batch` takes such a
        run at once where it can); waiting requests come from `_gated`, which stops reading the
        queue once `next_batch` closes admission."""
        running = self.reserved
        decoding = st.decoding  # the decode-type requests (`is_decode_type`, kept by the replay)
        pr = self.params.priority
        gate = self._gate
        if pr in ("rank-i", "rank-o"):
            run = self._by_rank(running, st)
            rank = self._running_rank(st)
            return _merged([(rank[i], i) for i in run], self.waiting, gate), run
        waiting_ids = _gated(self._waiting_order(st), gate)
        if pr in ("prefill", "running"):
            run = self._by_rank(running, st)
            runs = []  # the decode-type ones in a row as one list each
            for dec, group in itertools.groupby(run, decoding.__contains__):
                if dec:
                    runs.append(list(group))
                else:
                    runs.extend(group)
            return (itertools.chain(waiting_ids, runs) if pr == "prefill" else itertools.chain(runs, waiting_ids)), run
        decodes = decoding.intersection(running)
        if self.params.decode_order == "longest-first":
            m = st.m
            rank = self._running_rank(st)
            decodes = sorted(decodes, key=lambda i: (-m[i], rank[i], i))
        else:
            decodes = self._by_rank(decodes, st)
        prefills = self._by_rank(running.keys() - decoding, st)  # _by_rank's keys are unique: any input order
        run = decodes + prefills
        return itertools.chain([decodes] if decodes else (), prefills, waiting_ids), run

    # ------------------------------------------------------------------ one batch
    def next_batch(self, st: ReplayState) -> Batch:
        p = self.params
        m, n, prompt = st.m, st.n, st.prompt
        C, P, M = self.C, self.P, self.M
        blocks = self.blocks
        reserved = self.reserved
        peak_reserve = p.reserve == "peak"
        chunk_reserve = p.reserve == "chunk"
        max_running = p.max_running
        gate = self._gate
        gate[0] = True
        candidates, run_order = self._order(st)
        tail = len(run_order)  # victims are taken from run_order[.. tail)
        tokens: dict[int, int] = {}
        evicted: list[int] = []
        gone: set[int] = set()
        admitted: list[int] = []
        tok = ptok = 0
        phase = None
        admit_open = True
        todo: deque = deque()
        for i in _flatten(candidates, todo):
            if tok >= C:
                break
            if type(i) is list:  # decode-type running requests in a row: c = 1 each
                if not p.hybrid and phase == "p":
                    continue  # each would be left out
                take = i if tok + len(i) <= C else i[:C - tok]  # the loop stops at C tokens
                if gone and not gone.isdisjoint(take) or not self._decodes_fit(take, st):
                    todo.extend(i)  # one at a time below: some may evict
                    continue
                if tokens:
                    tokens.update(dict.fromkeys(take, 1))
                else:
                    tokens = dict.fromkeys(take, 1)
                tok += len(take)
                if phase is None:
                    phase = "d"
                    if not p.hybrid:
                        gate[0] = False  # every waiting request is prefill-type
                continue
            if i in gone:
                continue
            running = i in reserved
            if not running and (not admit_open or (evicted and not p.admit_after_evict)):
                continue
            if not running and max_running is not None and len(reserved) >= max_running:
                admit_open = gate[0] = False
                continue
            S = prompt[i] + n[i]
            remaining = S - m[i]
            decode = running and is_decode_type(n[i], remaining)
            if not p.hybrid:
                kind = "d" if decode else "p"
                if phase is not None and kind != phase:
                    continue
            if decode:
                c = 1
            else:
                room = min(C - tok, P - ptok)
                c = min(remaining, room) if p.chunked else remaining
                if c < 1 or c > room or (tokens and not self._rides_along(st, i, c, tokens)):
                    if not running:
                        admit_open = gate[0] = False
                    continue
            # KV reservation
            if running:
                new_res = max(reserved[i], m[i] + c if chunk_reserve else S)
                extra = blocks(new_res) - blocks(reserved[i])
            else:
                new_res = self._peak[i] if peak_reserve else (m[i] + c if chunk_reserve else S)
                extra = blocks(new_res)
            if not running and p.reserve == "future" and not self._future_fits(st, tokens, gone, i, c, C - len(tokens)):
                admit_open = gate[0] = False
                continue
            if self.kv_reserved + extra > M:
                if not running:
                    admit_open = gate[0] = False
                    continue
                k = run_order.index(i)
                while self.kv_reserved + extra > M:
                    victim = self._victim(run_order, k, tail, gone, m)
                    if victim is None:
                        break
                    if p.victim == "lowest-priority":
                        tail = run_order.index(victim, k + 1, tail)
                    self.evict_to_waiting(victim, evicted)
                    gone.add(victim)
                if not p.admit_after_evict:
                    gate[0] = False
                if self.kv_reserved + extra > M:
                    self.evict_to_waiting(i, evicted)  # self-eviction
                    gone.add(i)
                    continue
            if running:
                if new_res != reserved[i]:
                    self.reserve(i, new_res)
            else:
                self.reserve(i, new_res)
                admitted.append(i)
            tokens[i] = c
            tok += c
            if not decode:
                ptok += c
            if phase is None:
                phase = "d" if decode else "p"
                if phase == "d" and not p.hybrid:
                    gate[0] = False  # every waiting request is prefill-type
        if admitted:
            waiting = self.waiting
            if len(admitted) <= len(waiting) and all(w[1] == a for w, a in zip(waiting, admitted)):
                del waiting[:len(admitted)]  # admitted in the queue's order: its head
            else:
                drop = set(admitted)
                self.waiting = [w for w in waiting if w[1] not in drop]
        return Batch(tokens, tuple(evicted))

    def _decodes_fit(self, ids: list[int], st: ReplayState) -> bool:
        """Whether the decode-type running requests `ids` (c = 1 each, none evicted) all keep their
        reservations within M; if so, reserve for them: each grows its reservation to S (= m + 1),
        as one at a time would, and none can push a later one over M since none shrinks."""
        reserved, b = self.reserved, self.b
        prompt, n = st.prompt, st.n
        grown = {}  # the reservations that grow, to S
        extra = 0  # their growth in blocks-rounded tokens (`blocks`, written out: one loop, no call a request)
        for i in ids:
            S = prompt[i] + n[i]
            old = reserved[i]
            if S > old:
                grown[i] = S
                extra += S - old if b == 1 else (-(-S // b) + old // -b) * b
        if self.kv_reserved + extra > self.M:
            return False
        reserved.update(grown)
        self.kv_reserved += extra
        return True

    def _rides_along(self, st: ReplayState, i: int, c: int, ahead: dict[int, int]) -> bool:
        """Whether request i's prefill chunk of c tokens joins a batch that already holds the
        higher-priority requests `ahead` (every preset: always; a subclass may keep chunks out)."""
        return True

    def _future_fits(self, st: ReplayState, tokens: dict, gone: set, new: int, c: int, budget: int) -> bool:
        """MC-SF's admission test with chunked prefill: with `new` admitted (chunk c now), does the
        KV of every running request stay within M at each future batch? A request with S = I + n
        tokens to cache and a prefill left is taken to hold S from now until its prefill ends, d
        batches from now (the rest of its prompt at `budget` tokens a batch), and one more token each
        batch after that until its last token. Reservations still guard the current batch; a
        prefill that ends later than projected can still force an eviction."""
        m, n, prompt, out = st.m, st.n, st.prompt, st.output
        ids = [x for x in self.reserved if x not in gone] + [new]
        S = np.array([prompt[x] + n[x] for x in ids])
        cached = np.array([m[x] for x in ids])
        now = np.array([tokens.get(x, 0) for x in ids])
        now[-1] = c
        rem = S - cached
        decode = is_decode_type(np.array([n[x] for x in ids]), rem)
        budget = max(1, budget)
        d = np.where(rem <= now, 1, 1 + -(-(rem - now) // budget))
        left = np.array([out[x] - n[x] for x in ids])  # tokens still to generate
        # a prefill's batch d - 1 generates the next token and holds S; batch t >= d holds S + t - d + 1.
        # A decode holds m + 1 + t: the same with S = m, d = 0, but its next token comes in batch 0.
        last = np.where(decode, left - 1, d + left - 2)
        S = np.where(decode, cached, S)
        d = np.where(decode, 0, d)
        return future_kv_fits(S, d - 1, last, self.M, self.b)

    def _victim(self, run_order, k, tail, gone, m):
        """The lowest-priority running request after position k that is still running, or None."""
        if self.params.victim == "lowest-priority":
            for idx in range(tail - 1, k, -1):
                v = run_order[idx]
                if v not in gone:
                    return v
            return None
        best = None
        for idx in range(k + 1, tail):
            v = run_order[idx]
            if v not in gone and (best is None or m[v] < m[best] or (m[v] == m[best])):
                best = v  # ties: the later (lower-priority) one
        return best


class OrderedScheduler(UnifiedScheduler):
    """A unified preset whose ranking (admission, and for rank-i the running order) is a given key
    per request, smallest first, and that admits no request before its `hold` batch (its position
    in the schedule; none: at once) unless nothing else could run: how the solver turns a Lagrangian
    solution or a perturbed admission pattern into a schedule. A base with its own order
    (`ranks_by_keys` false, e.g. srpt) keeps it and takes only the holds."""

    def __new__(cls, base: UnifiedScheduler, keys, hold=None):
        if cls is OrderedScheduler and type(base) is not UnifiedScheduler:
            cls = _ordered_class(type(base))
        return super().__new__(cls)

    def __init__(self, base: UnifiedScheduler, keys, hold=None):
        super().__init__(f"{base.name}[ordered]", base.params, **base.options())
        self.keys = [float(k) for k in keys]
        self.hold = None if hold is None else [float(h) for h in hold]

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        for what in (self.keys, self.hold):
            if what is not None and len(what) != len(instance):
                raise ValueError(f"{len(what)} keys or holds for {len(instance)} requests")
        if self.ranks_by_keys:
            self._rank = [(0, k, i) for i, k in enumerate(self.keys)]
        self.batches_made = 0

    def next_batch(self, st: ReplayState) -> Batch:
        held = [] if self.hold is None else [w for w in self.waiting if self.hold[w[1]] > self.batches_made]
        if held and (self.reserved or len(held) < len(self.waiting)):
            self.waiting = [w for w in self.waiting if self.hold[w[1]] <= self.batches_made]
            batch = super().next_batch(st)
            self.waiting = sorted(self.waiting + held)
        else:
            batch = super().next_batch(st)
        self.batches_made += 1
        return batch


_ORDERED: dict[type, type] = {}


def _ordered_class(base: type) -> type:
    """OrderedScheduler over a subclass of UnifiedScheduler (its order and rules, the pattern's holds)."""
    if base not in _ORDERED:
        _ORDERED[base] = type(f"Ordered{base.__name__}", (OrderedScheduler, base), {})
    return _ORDERED[base]


def _gated(ids, gate: list):
    """`ids` while gate[0] holds (read before each)."""
    for i in ids:
        if not gate[0]:
            return
        yield i


def _merged(run: list[tuple], waiting: list[tuple], gate: list):
    """The ids of two sorted lists of (key, id), merged by key; the waiting ones only while gate[0] holds."""
    r, R = 0, len(run)
    for w in waiting:
        while r < R and run[r] < w:
            yield run[r][1]
            r += 1
        if not gate[0]:
            break
        yield w[1]
    for k in range(r, R):
        yield run[k][1]


def _flatten(items, todo: deque):
    """`items`, each followed by whatever the consumer put in `todo` meanwhile."""
    for x in items:
        yield x
        while todo:
            yield todo.popleft()
