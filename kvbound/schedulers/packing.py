"""Packed schedules for total latency: each request runs as it would alone, without a pause, from a
start batch chosen so that every batch keeps within M, C and P (docs/formulation.md, "Packed schedules").

Without arrivals and evictions, total latency is the intercept times the number of batches plus
work that the schedule does not change (per token, decode KV reads, and the chunked prefill
attention, which telescopes to I^2), so fewer batches is a shorter schedule. A request run without
pauses from batch s holds in its k-th batch what it holds alone there (its `Profile`), so the
starts are a cumulative scheduling problem. Greedy fits turn an order of the requests into
starts (request by request at its earliest fit, or batch by batch starting every request that fits
there; each also from the last batch backwards); a search over orders (random moves of the best
order's ranks, kept when the span is no longer, and each shorter schedule re-packed by the other
fits in the order of its starts or ends) improves the best of them for ORDER_SEARCH_SHARE of the
time, and CP-SAT's interval model (two or three cumulative resources, minimum makespan) the best of
those until its deadline. Decode batches are charged per segment of SEGMENT batches at the
segment's largest KV (at most a block more than they hold), so every CP-SAT solution fits; the
validator checks every schedule anyway, and the search keeps one only if the validator's latency
is lower.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..constraints import Constraints
from ..cpsat_process import cpsat_solver, run_cpsat_process
from ..deadline import Deadline
from ..schedule import Batch, Schedule, validate
from ..workload import Instance, SystemConfig

#: decode batches charged together, at their largest KV (fewer intervals for CP-SAT)
SEGMENT = 16
#: the fewest tokens a prefill chunk leaves in its batch for other requests' decodes (where C allows
#: it); `decode_room` leaves more where M holds more requests at once
DECODE_ROOM = 16
#: CP-SAT's search threads (its LNS workers do the improving)
WORKERS = 8
#: share of packing's time, after the greedy fits, that the search over orders takes (CP-SAT the rest):
#: the search gains more than CP-SAT seeded with the same fit (bench/results/NOTES.md, "Constants",
#: has the runs behind this and the constants below)
ORDER_SEARCH_SHARE = 0.75
#: spreads of the noise a move adds to each rank (ranks in [0, 1)), taken in turn: small ones refine an
#: order, large ones leave a plateau
ORDER_NOISE = (0.003, 0.01, 0.03)
#: moves without a shorter span after which the search over orders hands the rest of its time to CP-SAT
STALLED_MOVES = 2000
#: moves of the timed fit's search (with arrivals) without a shorter makespan after which it hands its
#: time to the pattern search
TIMED_STALLED_MOVES = 300
#: a fit whose span is not the shortest moves only every TRAILING_TURN-th round of the search over
#: orders (which fit gains most differs by trace)
TRAILING_TURN = 4


@dataclass(frozen=True)
class Profile:
    """A request run alone without pauses: per batch the tokens it processes and the KV charged for
    it (nondecreasing), and how many of its batches are prefill chunks (the first ones)."""

    tokens: np.ndarray
    kv: np.ndarray
    prefill_batches: int
    #: run backwards in time (prefill chunks last, KV nonincreasing), as the fits from the end place it
    backward: bool = False
    #: seconds of work per batch, alone (its batch time less the intercept): what it adds to a batch
    #: under the linear cost model, at least that with token knees
    work: np.ndarray | None = None

    @property
    def batches(self) -> int:
        return len(self.tokens)

    @property
    def prefill(self) -> slice:
        """The batches of its prefill chunks."""
        n = self.batches
        return slice(n - self.prefill_batches, n) if self.backward else slice(0, self.prefill_batches)

    def reversed(self) -> Profile:
        return Profile(self.tokens[::-1], self.kv[::-1], self.prefill_batches, not self.backward,
                       None if self.work is None else self.work[::-1])

    def segments(self) -> list[tuple[int, int]]:
        """(offset, length): each prefill chunk alone, then the decodes SEGMENT at a time."""
        out = [(j, 1) for j in range(self.prefill_batches)]
        out += [(j, min(SEGMENT, self.batches - j)) for j in range(self.prefill_batches, self.batches, SEGMENT)]
        return out


def applies(instance: Instance, constraints: Constraints) -> bool:
    """Packed schedules chunk prefills, mix them with decodes and admit in any order: they serve
    cases where no constraint forbids these (with arrivals through `timed_starts`)."""
    return (not (constraints.no_chunk or constraints.no_hybrid)
            and constraints.max_batch_size is None and constraints.admission_order is None)


def decode_room(instance: Instance) -> int:
    """Tokens a packed prefill chunk leaves for decodes: about as many requests as M holds at once
    (their mean KV halfway through their decodes), at least DECODE_ROOM and at most half of C. With
    M loose, 300 conversation requests decode about 96 at a time; chunks leaving 16 tokens let a
    prefill join a batch only while at most 16 decode, and packed 1,025 batches in 40 s, against 942
    leaving 96 (64: 982, 128: 947, 256: 961)."""
    s = instance.system
    if s.max_batch_tokens - DECODE_ROOM < 4 * DECODE_ROOM:
        return 0  # C too small to spare: chunks as large as P allows
    halfway = s.blocks(instance.prompts + instance.outputs // 2)
    together = min(len(instance), s.kv_capacity / max(1.0, float(np.mean(halfway))))
    return int(min(max(DECODE_ROOM, math.ceil(together)), s.max_batch_tokens // 2))


def chunk_size(instance: Instance) -> int:
    """Prefill chunk of a packed request: leaves `decode_room` tokens for decodes."""
    s = instance.system
    return max(1, min(s.max_prefill_tokens, s.max_batch_tokens - decode_room(instance)))


def profiles(instance: Instance, chunk: int | None = None) -> list[Profile]:
    """Every request's `Profile` with prefill chunks of `chunk` tokens (default `chunk_size`); the KV
    each batch holds comes from the semantics (the validator replaying the request alone)."""
    chunk = chunk_size(instance) if chunk is None else chunk
    out = []
    for r in instance.requests:
        alone = Instance([type(r)(r.prompt, r.output, 0.0)], instance.system, instance.cost, "alone")
        prefill = [chunk] * (r.prompt // chunk) + ([r.prompt % chunk] if r.prompt % chunk else [])
        tokens = np.array(prefill + [1] * (r.output - 1), dtype=np.int64)
        replay = validate(alone, Schedule(alone.requests, [Batch({0: int(c)}) for c in tokens]))
        kv = np.maximum.accumulate(replay.batch_kv.astype(np.int64))
        for j, length in [(j, n) for j, n in Profile(tokens, kv, len(prefill)).segments() if n > 1]:
            kv[j:j + length] = kv[j + length - 1]
        work = np.maximum(replay.batch_end - replay.batch_start - instance.cost.intercept, 0.0)  # no rounding below 0
        out.append(Profile(tokens, kv, len(prefill), work=work))
    return out


class _Load:
    """Per batch, the KV, tokens and prefill tokens of the profiles placed so far (both greedy fits)."""

    def __init__(self, system: SystemConfig, horizon: int):
        self.M, self.C, self.P = system.kv_capacity, system.max_batch_tokens, system.max_prefill_tokens
        self.kv = np.zeros(horizon, dtype=np.int64)
        self.tokens = np.zeros(horizon, dtype=np.int64)
        self.prefill = np.zeros(horizon, dtype=np.int64)

    def tokens_fit(self, p: Profile, t: int) -> bool:
        """`p` started at batch t keeps every batch within C and P (M is each fit's own check)."""
        pre = p.prefill
        return bool((self.tokens[t:t + p.batches] + p.tokens <= self.C).all()
                    and (self.prefill[t + pre.start:t + pre.stop] + p.tokens[pre] <= self.P).all())

    def place(self, p: Profile, t: int) -> None:
        pre = p.prefill
        self.kv[t:t + p.batches] += p.kv
        self.tokens[t:t + p.batches] += p.tokens
        self.prefill[t + pre.start:t + pre.stop] += p.tokens[pre]


def greedy_starts(profiles: list[Profile], system: SystemConfig, order,
                  deadline: Deadline | None = None) -> np.ndarray | None:
    """Earliest-fit starts, request by request in `order` (None if `deadline` passes first: on
    1,000 requests a fit takes seconds). Where a KV profile starting at t does not fit at batch
    t + j, no start up to t + j - i does either, i being the longest prefix of the profile that
    fits there (the profile is nondecreasing): the scan jumps there. A backward profile
    (nonincreasing) puts at least as much there from every start up to t + j."""
    load = _Load(system, sum(p.batches for p in profiles))
    M, kv = load.M, load.kv
    starts = np.zeros(len(profiles), dtype=np.int64)
    for k, r in enumerate(order):
        if deadline is not None and k % 16 == 0 and deadline.expired():
            return None
        p = profiles[r]
        t = 0
        while True:
            kv_over = np.nonzero(kv[t:t + p.batches] + p.kv > M)[0]
            if not len(kv_over) and load.tokens_fit(p, t):
                break
            step = 1
            if len(kv_over) and p.backward:
                step = int(kv_over.max()) + 1
            elif len(kv_over):
                fits = np.searchsorted(p.kv, M - kv[t + kv_over], side="right") - 1
                step = max(step, int((kv_over - fits).max()))
            t += step
        load.place(p, t)
        starts[r] = t
    return starts


def batchwise_starts(profiles: list[Profile], system: SystemConfig, order,
                     deadline: Deadline | None = None) -> np.ndarray | None:
    """Batch by batch from the first, start every request not yet started whose profile fits from
    there, in `order` (None if `deadline` passes first). Where `greedy_starts` places each request
    in turn at its earliest fit, this one fills M more evenly on requests of similar size: on 300
    tight arXiv requests 25,987 batches against 26,875. A first check of every request at once
    (its first and last batch against the KV held there) spares the full check of most, and the
    scan skips the batches where not even the smallest first batch of a waiting request fits (the
    fit from the end: 0.46 s instead of 1.39 s on 1,000 tight arXiv requests, 2.0 s instead of 2.5 s
    forward)."""
    order = np.asarray(order, dtype=np.int64)
    lengths = np.array([p.batches for p in profiles], dtype=np.int64)[order]
    first = np.array([p.kv[0] for p in profiles], dtype=np.int64)[order]
    last = np.array([p.kv[-1] for p in profiles], dtype=np.int64)[order]
    load = _Load(system, 2 * int(lengths.sum()) + 1)  # every start is before the sum of the lengths
    M, kv = load.M, load.kv
    starts = np.zeros(len(profiles), dtype=np.int64)
    waiting = np.ones(len(order), dtype=bool)
    smallest_first = int(first.min())  # of the requests waiting
    t = steps = 0
    while waiting.any():
        if deadline is not None and steps % 256 == 0 and deadline.expired():
            return None
        maybe = np.nonzero(waiting & (kv[t] + first <= M) & (kv[t + lengths - 1] + last <= M))[0]
        for i in maybe:
            r = int(order[i])
            p = profiles[r]
            if (kv[t:t + p.batches] + p.kv > M).any() or not load.tokens_fit(p, t):
                continue
            load.place(p, t)
            starts[r] = t
            waiting[i] = False
        if len(maybe) and waiting.any():
            smallest_first = int(first[waiting].min())
        t = _next_with_room(kv, t + 1, M - smallest_first)  # no request starts where its first batch does not fit
        steps += 1
    return starts


def timed_starts(profiles: list[Profile], arrivals: np.ndarray, system: SystemConfig, intercept: float, order,
                 deadline: Deadline | None = None) -> tuple[np.ndarray, float] | None:
    """`batchwise_starts` with arrivals: batch by batch from the first, on a clock, start every
    request that has arrived and whose profile fits from there, in `order`; where nothing runs the
    clock jumps to the next arrival. Batch t's contents are final once the fit has passed it (later
    starts only add to later batches), so its time, the intercept plus its requests' `Profile.work`,
    is known there. Answers the starts and the clock at the end (the makespan under the linear cost
    model; more with token knees), or None if `deadline` passes first."""
    order = np.asarray(order, dtype=np.int64)
    lengths = np.array([p.batches for p in profiles], dtype=np.int64)
    load = _Load(system, 2 * int(lengths.sum()) + 1)
    work = np.zeros(len(load.kv))
    M, kv = load.M, load.kv
    starts = np.zeros(len(profiles), dtype=np.int64)
    waiting = np.ones(len(order), dtype=bool)
    arrived = np.asarray(arrivals, dtype=float)[order]
    first = np.array([p.kv[0] for p in profiles], dtype=np.int64)[order]
    last = np.array([p.kv[-1] for p in profiles], dtype=np.int64)[order]
    ordered_lengths = lengths[order]
    t, clock = 0, 0.0
    while waiting.any():
        if deadline is not None and t % 256 == 0 and deadline.expired():
            return None
        if not load.tokens[t]:  # nothing runs here: wait for the next arrival if none is waiting yet
            clock = max(clock, float(arrived[waiting].min()))
        # its first and last batch against the KV held there first: spares the full check of most
        maybe = waiting & (arrived <= clock) & (kv[t] + first <= M) & (kv[t + ordered_lengths - 1] + last <= M)
        for i in np.nonzero(maybe)[0]:
            r = int(order[i])
            p = profiles[r]
            if (kv[t:t + p.batches] + p.kv > M).any() or not load.tokens_fit(p, t):
                continue
            load.place(p, t)
            work[t:t + p.batches] += p.work
            starts[r] = t
            waiting[i] = False
        if load.tokens[t]:
            clock += intercept + work[t]
        t += 1
    end = int((starts + lengths).max())
    return starts, float(clock + intercept * np.count_nonzero(load.tokens[t:end]) + work[t:end].sum())


def _next_with_room(kv: np.ndarray, t: int, room: int, window: int = 512) -> int:
    """The first batch from t that holds at most `room` of KV (`kv` ends in empty batches)."""
    while True:
        hits = np.flatnonzero(kv[t:t + window] <= room)
        if len(hits):
            return t + int(hits[0])
        t += window


def from_the_end(fit):
    """`fit` run backwards in time: the requests' reversed profiles packed from the schedule's last
    batch, the first in the order ending last. A schedule read backwards packs the reversed profiles
    (each batch holds the same sums), so these search the same schedules from the other side: where
    the forward fits leave the last batches half empty, these leave the first ones. On 300 tight
    conversation requests the latest fit packs 10,788 batches, the forward fits 10,900 at best."""
    def backward_fit(profiles: list[Profile], system: SystemConfig, order,
                     deadline: Deadline | None = None) -> np.ndarray | None:
        starts = fit([p.reversed() for p in profiles], system, order, deadline)
        if starts is None:
            return None
        ends = starts + np.array([p.batches for p in profiles], dtype=np.int64)
        return ends.max() - ends
    return backward_fit


#: the fits that pack from the end (their orders are of the requests' last batches, latest first)
BACKWARD = {"latest fit": from_the_end(greedy_starts), "batch by batch from the end": from_the_end(batchwise_starts)}
#: the greedy fits, by name
FITS = {"earliest fit": greedy_starts, "batch by batch": batchwise_starts, **BACKWARD}


def justified_order(starts: np.ndarray, lengths: np.ndarray, fit: str) -> np.ndarray:
    """The order in which `fit` re-packs these starts: by start for the forward fits, by end (latest
    first) for the fits from the end. Packing a schedule from the end in the order of its ends and
    then from the start in the order of those starts (forward-backward improvement) shortens it where
    its first or last batches are half empty: on 100 tight arXiv requests 8,974 -> 8,881 batches in
    two rounds."""
    if fit in BACKWARD:
        return np.argsort(-(starts + lengths), kind="stable")
    return np.argsort(starts, kind="stable")


@dataclass
class _Chain:
    """An order's ranks in the search over orders, with its fit's starts and span."""

    ranks: np.ndarray
    starts: np.ndarray
    span: int
    fit: str

    @classmethod
    def of(cls, order, starts: np.ndarray, lengths: np.ndarray, fit: str) -> _Chain:
        return cls(_ranks(order), starts, int((starts + lengths).max()), fit)


def _ranks(order) -> np.ndarray:
    """Each request's rank in `order`, in [0, 1) (a move adds noise to them)."""
    ranks = np.empty(len(order))
    ranks[np.asarray(order)] = np.arange(len(order)) / max(1, len(order))
    return ranks


def _moved(ranks: np.ndarray, rng: np.random.Generator, moves: int) -> np.ndarray:
    """`ranks` with normal noise of the ORDER_NOISE spread whose turn it is after `moves` moves."""
    return ranks + rng.normal(0.0, ORDER_NOISE[moves % len(ORDER_NOISE)], len(ranks))


def search_orders(profiles: list[Profile], system: SystemConfig, seeds: dict[str, tuple[np.ndarray, np.ndarray]],
                  deadline: Deadline, rng: np.random.Generator,
                  fewest: int = 0) -> tuple[np.ndarray, np.ndarray, int, str, int]:
    """From each fit's best order (`seeds`: fit -> (order, its starts)), moves that add noise
    (ORDER_NOISE, its spreads in turn) to every rank, kept when that fit's span is no longer. The
    fits take turns, each on its own order, the ones whose span is not the shortest every
    TRAILING_TURN-th round; each span shorter than all before is re-packed by the other fits in
    their `justified_order`, and so on while that shortens it (those schedules are candidates, not
    the fits' own orders: on 30 tight arXiv requests handing them over left every fit in the same
    place, 2,316-2,317 batches where the search stalls, against 2,281-2,318 without). Until
    `deadline`, a span of `fewest` (a lower bound on the batches) or STALLED_MOVES moves without a
    fit's span shortening. Answers the best order, its starts and span, the fit's name and the
    moves made."""
    lengths = np.array([p.batches for p in profiles], dtype=np.int64)
    chains = {fit: _Chain.of(order, starts, lengths, fit) for fit, (order, starts) in seeds.items()}
    best = min(chains.values(), key=lambda c: c.span)
    moves = last_gain = 0

    def stop() -> bool:
        return deadline.expired() or best.span <= fewest

    def justify(found: _Chain) -> None:
        """Re-pack a new shortest schedule with the other fits in their justified orders, while that shortens it."""
        nonlocal best, moves
        pending = [found]
        while pending and not stop():
            found = pending.pop()
            for fit in chains:
                if fit == found.fit or stop():
                    continue
                order = justified_order(found.starts, lengths, fit)
                starts = FITS[fit](profiles, system, order, deadline)
                if starts is None:
                    return
                moves += 1
                tried = _Chain.of(order, starts, lengths, fit)
                if tried.span < best.span:
                    best = tried
                    pending.append(tried)

    justify(best)
    rounds = 0
    while not stop() and moves - last_gain < STALLED_MOVES:
        rounds += 1
        shortest = min(c.span for c in chains.values())
        for fit, chain in chains.items():
            if stop():
                break
            if chain.span > shortest and rounds % TRAILING_TURN:
                continue
            ranks = _moved(chain.ranks, rng, moves)
            starts = FITS[fit](profiles, system, np.argsort(ranks, kind="stable"), deadline)
            if starts is None:
                break
            moves += 1
            tried = _Chain(ranks, starts, int((starts + lengths).max()), fit)
            if tried.span < chain.span:
                last_gain = moves
            if tried.span <= chain.span:  # ties too: moves along a plateau
                chains[fit] = chain = tried
            if tried.span < best.span:
                best = tried
                justify(tried)
    return np.argsort(best.ranks, kind="stable"), best.starts, best.span, best.fit, moves


def packed_schedule(instance: Instance, profiles: list[Profile], starts) -> Schedule:
    """The schedule of these starts: request r's k-th batch of its profile in batch starts[r] + k
    (batches no request is in are left out). With arrivals, a batch that starts requests may not
    start before the last of them arrives (its `start`)."""
    span = max(int(s) + p.batches for s, p in zip(starts, profiles))
    batches: list[dict[int, int]] = [{} for _ in range(span)]
    released = np.full(span, -np.inf)
    for r, (s, p) in enumerate(zip(starts, profiles)):
        for k, c in enumerate(p.tokens):
            batches[int(s) + k][r] = int(c)
        released[int(s)] = max(released[int(s)], instance.requests[r].arrival)
    timed = not instance.offline
    return Schedule(instance.requests, [Batch(b, start=float(released[t]) if timed and released[t] > -np.inf else None)
                                        for t, b in enumerate(batches) if b])


@dataclass
class Packing:
    """The best packed schedule found (None if none fit) and how it was found."""

    schedule: Schedule | None
    batches: int
    stats: dict = field(default_factory=dict)


def pack(instance: Instance, deadline: Deadline, orders: dict[str, np.ndarray] | None = None,
         fewest: int = 0) -> Packing:
    """Both greedy fits in `orders` (and a few of its own), the search over orders from the best of
    each for ORDER_SEARCH_SHARE of the time left, then CP-SAT from the best until `deadline`; both
    stop at `fewest` batches, a lower bound on every schedule's (none can pack in fewer). With
    arrivals, `_pack_arriving`."""
    profs = profiles(instance)
    lengths = np.array([p.batches for p in profs])
    orders = dict(orders or {})
    if not instance.offline:
        return _pack_arriving(instance, profs, deadline, orders)
    orders.update({"longest first": np.argsort(-lengths, kind="stable"),
                   "largest prompt first": np.argsort(-instance.prompts, kind="stable"),
                   "largest peak KV first": np.argsort(-np.array([p.kv[-1] for p in profs]), kind="stable")})
    system = instance.system
    best_starts, best_span, best_order, best_fit = None, math.inf, "", ""
    seeds: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # each fit's best order and its starts
    for name, order in orders.items():
        for fit, starts_of in FITS.items():
            starts = starts_of(profs, system, order, deadline)
            if starts is None:
                break
            span = int((starts + lengths).max())
            if fit not in seeds or span < int((seeds[fit][1] + lengths).max()):
                seeds[fit] = (order, starts)
            if span < best_span:
                best_starts, best_span, best_order, best_fit = starts, span, name, fit
    stats = {"greedy_batches": None if best_starts is None else best_span, "greedy_order": best_order,
             "greedy_fit": best_fit}
    if best_starts is None:
        return Packing(None, 0, stats)
    if deadline.remaining() > 1.0 and best_span > fewest:
        _, starts, span, fit, moves = search_orders(profs, system, seeds, deadline.share(ORDER_SEARCH_SHARE),
                                                    np.random.default_rng(0), fewest)
        if span < best_span:
            best_starts, best_span = starts, span
        stats.update({"order_search_batches": span, "order_search_fit": fit, "order_search_moves": moves})
    if deadline.remaining() > 1.0 and best_span > fewest:
        payload = (profs, (system.kv_capacity, system.max_batch_tokens, system.max_prefill_tokens), best_starts,
                   best_span, WORKERS, fewest)
        # half a second kept back: the schedule is built and validated after CP-SAT
        answer = run_cpsat_process(_solve_packing_here, payload, deadline.shifted(-0.5))
        found = answer.outcome if answer.outcome is not None else answer.last
        if found is not None and found[1] is not None and found[1] < best_span:
            best_starts, best_span = np.asarray(found[3], dtype=np.int64), int(found[1])
        stats.update({"cpsat_batches": None if found is None else found[1],
                      "cpsat_bound": None if found is None else found[2],
                      "cpsat_seconds": round(answer.seconds, 3)})
    return Packing(packed_schedule(instance, profs, best_starts), best_span, stats)


def _pack_arriving(instance: Instance, profs: list[Profile], deadline: Deadline, orders: dict[str, np.ndarray]) -> Packing:
    """Packing with arrivals: `timed_starts` in each of `orders` (and arrival order, longest first
    and largest peak KV first), then moves that add noise to the best order's ranks (ORDER_NOISE,
    its spreads in turn), kept when the makespan is no longer, until `deadline` or TIMED_STALLED_MOVES
    moves without a gain. The fits from the end and CP-SAT's model have no clock, so they are left out."""
    lengths = np.array([p.batches for p in profs])
    orders.update({"arrival": np.argsort(instance.arrivals, kind="stable"),
                   "longest first": np.argsort(-lengths, kind="stable"),
                   "largest peak KV first": np.argsort(-np.array([p.kv[-1] for p in profs]), kind="stable")})
    args = (instance.arrivals, instance.system, instance.cost.intercept)
    best, best_span, best_order, best_ranks = None, math.inf, "", None
    for name, order in orders.items():
        found = timed_starts(profs, *args, order, deadline)
        if found is None:
            break
        if found[1] < best_span:
            best, best_span, best_order, best_ranks = found[0], found[1], name, _ranks(order)
    stats = {"greedy_makespan": None if best is None else best_span, "greedy_order": best_order,
             "greedy_fit": "timed batch by batch"}
    if best is None:
        return Packing(None, 0, stats)
    rng, moves, last_gain = np.random.default_rng(0), 0, 0
    while not deadline.expired() and moves - last_gain < TIMED_STALLED_MOVES:
        ranks = _moved(best_ranks, rng, moves)
        found = timed_starts(profs, *args, np.argsort(ranks, kind="stable"), deadline)
        if found is None:
            break
        moves += 1
        if found[1] < best_span:
            last_gain = moves
        if found[1] <= best_span:  # ties too: moves along a plateau
            best, best_span, best_ranks = found[0], found[1], ranks
    stats.update({"order_search_makespan": best_span, "order_search_moves": moves})
    return Packing(packed_schedule(instance, profs, best), int((best + lengths).max()), stats)


def _solve_packing_here(payload, at: float, say=None, stop_conn=None, on_start=lambda: None):
    """The CP-SAT model of the starts (run in a child process by `run_cpsat_process`): one fixed-size
    interval per segment of each request, cumulative on KV (M), tokens (C) and prefill tokens (P),
    minimum makespan, hinted with the greedy starts. Answers ("final", batches, bound, starts)."""
    from ortools.sat.python import cp_model

    profs, (M, C, P), hint, horizon, workers, fewest = payload
    lengths = [p.batches for p in profs]
    model = cp_model.CpModel()
    starts = [model.NewIntVar(0, int(horizon - n), f"start{r}") for r, n in enumerate(lengths)]
    kv_items, token_items, prefill_items = [], [], []
    for r, p in enumerate(profs):
        for offset, length in p.segments():
            interval = model.NewFixedSizeIntervalVar(starts[r] + offset, length, f"r{r}k{offset}")
            kv_items.append((interval, int(p.kv[offset + length - 1])))
            token_items.append((interval, int(p.tokens[offset:offset + length].max())))
            if offset < p.prefill_batches:
                prefill_items.append((interval, int(p.tokens[offset])))
    resources = [(kv_items, M), (token_items, C)] + ([(prefill_items, P)] if P < C else [])
    for items, capacity in resources:
        model.AddCumulative([i for i, _ in items], [d for _, d in items], int(capacity))
    span = model.NewIntVar(0, int(horizon), "span")
    model.AddMaxEquality(span, [s + int(n) for s, n in zip(starts, lengths)])
    model.Add(span >= int(fewest))  # no schedule has fewer batches: CP-SAT can prove its answer there
    model.Minimize(span)
    for s, h in zip(starts, hint):
        model.AddHint(s, int(h))
    model.AddHint(span, int(horizon))
    class Report(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self):
            if say is not None:
                say(("incumbent", int(self.ObjectiveValue()), self.BestObjectiveBound(),
                     [self.Value(s) for s in starts]))

    on_start()
    solver = cpsat_solver(workers, at, stop_conn)
    status = solver.Solve(model, Report())
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return ("final", None, solver.BestObjectiveBound(), None)
    return ("final", int(solver.ObjectiveValue()), solver.BestObjectiveBound(), [solver.Value(s) for s in starts])
