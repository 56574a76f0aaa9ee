"""Every analytic lower bound on the optimal latency, cheapest first; each is valid for every schedule.

Analytic bounds (docs/formulation.md, "Bounds"):
* batches: `kv_items.min_batches` (the longest output, tokens over C, prompts over P, the KV items'
  area over the prefill ramp and their dual-feasible weights), each batch paying the intercept.
* work: `alone.minimum_work` (per token the cheaper of a decode or a refill, the first prefill).
* per request: request i alone needs its fewest batches after its arrival, and its own work.
* release: for every arrival time t, t plus the batch bound and the work of the requests
  arriving at t or later (`release_bound`).
* mean TTFT, every request arriving together: the first prefills on one batching machine, shortest
  first in groups (`first_prefill_batches`).
* mean objectives: the k-th completion against capacity shares (`completion_order_bounds`), one
  preemptive machine (`one_machine_completions`), each request's own intercepts beside one machine of
  every request's work (`own_intercepts_and_work_machine`) and the pairwise work waits
  (`pairwise_work_waits`).
"""
from __future__ import annotations

import heapq
import math
import time

import numpy as np

from ..accounting import round_to_blocks
from ..alone import (batches_alone, fewest_batches, first_prefill_work, largest_chunk, least_work, minimum_work,
                     refilled_token_work, time_alone, token_work, work_alone)
from ..deadline import Deadline
from ..objective import Objective
from ..workload import Instance
from .base import Bound, Stage, register
from .kv_items import (batches_for_smallest, batches_to_hold, exclusive_holders, kv_items, kv_room, kv_weights,
                       min_batches, ramp_capacities)


@register
class AnalyticBounds:
    """Every bound of this module, from the instance alone."""

    # half of the time left: the heuristics need the rest for a schedule (on 19,366 requests all of these
    # take 31 s, bench/results/NOTES.md)
    name, stage, share = "analytic", Stage.FIRST, 0.5

    def skip_reason(self, known) -> str | None:
        return None

    def compute(self, known, deadline) -> list[Bound]:
        return analytic_bounds(known.instance, known.objective, deadline)


def analytic_bounds(instance: Instance, objective: Objective, deadline: Deadline | None = None) -> list[Bound]:
    """The module's bounds, cheapest first. With `deadline`, those done when it passes (each loop over
    release times or multipliers stops there too: a maximum over part of them is a bound all the same)."""
    t0 = time.perf_counter()
    cost = instance.cost
    out = []

    def expired() -> bool:
        return deadline is not None and deadline.expired()

    if not objective.is_mean:
        nb = min_batches(instance)
        out.append(Bound("batches x intercept + minimum work", nb * cost.intercept + minimum_work(instance),
                         time.perf_counter() - t0, note=f"at least {nb} batches", batches=nb))
        if expired():
            return out
        held = exclusive_holders_bound(instance, nb)
        if held is not None:
            value, batches, note = held
            out.append(Bound("requests that cannot hold KV together: batches x intercept + minimum work + refills",
                             value, time.perf_counter() - t0, note=note, batches=batches))
        per_req = float((instance.arrivals + time_alone(instance, objective)).max())
        out.append(Bound("latest arrival + own work", per_req, time.perf_counter() - t0))
        if not instance.offline and not expired():
            value, t = release_bound(instance)
            out.append(Bound("arrival t + batches x intercept + work of the requests arriving from t", value,
                             time.perf_counter() - t0, note=f"t = {t:.6g} s"))
        return out
    first = objective.first_token
    own = time_alone(instance, objective)
    alone = float(own.sum()) / len(instance)
    out.append(Bound("mean first prefill of each request alone" if first else "mean of each request alone", alone,
                     time.perf_counter() - t0))
    if expired():
        return out
    shares = request_shares(instance, objective)  # the dual-feasible weights are the costly part: computed once
    ordered = completion_order_bounds(instance, objective, shares=shares, deadline=deadline)
    out.append(Bound("k-th first token >= k smallest capacity shares + prefill work" if first else
                     "k-th completion >= k smallest capacity shares + work",
                     float(ordered.sum() - instance.arrivals.sum()) / len(instance), time.perf_counter() - t0))
    if first and len(instance) and float(np.ptp(instance.arrivals)) == 0.0 and not expired():
        out.append(Bound("first prefills in batches, shortest first, each batch waited for by every request "
                         "without its first token", first_prefill_batches(instance), time.perf_counter() - t0))
    if not instance.offline and not expired():  # all at once it is the shares bound above
        out.append(Bound("one machine, shortest remaining prefill share first, and each prefill alone" if first else
                         "one machine, shortest remaining share first, and each request alone",
                         float(one_machine_completions(instance, objective, shares=shares, own=own, deadline=deadline)
                               - instance.arrivals.sum()) / len(instance),
                         time.perf_counter() - t0))
        if expired():
            return out
        out.append(Bound("each first prefill's own intercepts + one machine of every prefill's work, shortest "
                         "remaining first" if first else
                         "each request's own intercepts + one machine of every request's work, shortest remaining first",
                         own_intercepts_and_work_machine(instance, objective) / len(instance),
                         time.perf_counter() - t0))
    if expired():
        return out
    waits = pairwise_work_waits(instance, objective)
    out.append(Bound("each first prefill alone + pairwise prefill waits" if first else
                     "each request alone + pairwise work waits", alone + waits / len(instance),
                     time.perf_counter() - t0))
    return out


def exclusive_holders_bound(instance: Instance, fewest: int | None = None) -> tuple[float, int, str] | None:
    """(bound, batches every schedule has, a note) on the total latency from a set G of requests no two of which
    hold KV together past their first tokens (`kv_items.exclusive_holders`; None where there is none).

    In a batch where a member generates a token after its first, it holds at least blocks(I + 1), and
    every other member that has its first token, is not finished and was not evicted since holds at
    least blocks(I'); the two exceed M, so there is no such other member, nor a second generation of
    a member. So the members' later tokens (sum of O - 1) take that many distinct batches, and their
    first tokens other batches, several to a batch at most. Where k first tokens share a batch, the
    first of those k requests to generate its second token does so with the other k - 1 holding nothing
    of what they held: each was evicted between its first and second token, and processes its S = I + 1
    tokens again (`alone.refilled_token_work`), delta_i more work than the minimum work counts for that
    token (>= 0). With E such refills, at least sum(O) - E batches (and at least `fewest`, every
    schedule's), each paying the intercept, and the minimum work plus the E smallest deltas: the bound
    is the least of these over E = 0 .. |G| - 1 (more refills only add work). Valid with arrivals
    (idle only adds) and under any constraints (they only remove schedules)."""
    members = exclusive_holders(instance)
    if not len(members):
        return None
    cost = instance.cost
    fewest = min_batches(instance) if fewest is None else fewest
    reqs = [instance.requests[i] for i in members]
    delta = np.sort([max(0.0, float(refilled_token_work(r.prompt, 1, cost)) - float(token_work(r, cost)[1]))
                     for r in reqs])
    total = sum(r.output for r in reqs)
    batches = np.maximum(fewest, total - np.arange(len(reqs)))  # with E = 0 .. |G| - 1 refills
    values = cost.intercept * batches + np.r_[0.0, np.cumsum(delta)[:-1]]
    E = int(np.argmin(values))
    note = (f"{len(reqs)} requests: at least {total} batches less one per refill after a first token; "
            f"least at {E} refills, {int(batches[E])} batches")
    return float(values[E]) + minimum_work(instance), int(batches[-1]), note


def one_machine_completions(instance: Instance, objective: Objective, steps: int = 11, shares=None,
                            own: np.ndarray | None = None, deadline: Deadline | None = None) -> float:
    """A lower bound on the sum of completion (first-token) times: one preemptive machine with arrivals.

    Give request r in each batch it generates a token in the share k0 (lam kv / M + (1 - lam)
    tokens / C) plus its work there (kv: the KV it holds, or its dual-feasible weight): the shares
    of one batch add up to at most k0 + its work, at most the batch's time. So every schedule is a
    preemptive schedule of one unit-speed machine on which request r, released at a_r, is processed
    for at least its total share p_r (`completion_order_bounds`' shares) by some M_r <= C_r.
    Shortest-remaining-processing-time first completes the most jobs by every time, so its k-th
    completion S_(k) is at most M_(k); and C_r >= e_r = a_r + r's own time (`own`). Pairing sorted
    with sorted minimises a sum of maxima, so sum_r C_r >= sum_k max(S_(k), e_(k)): the machine's
    backlog after a burst and each request's least span together. The largest over lam and the
    dual-feasible functions counts (with `deadline`, over those tried by then: the KV area's always).
    """
    cost = instance.cost
    share_parts, work, tokens, capacity_tokens = shares or request_shares(instance, objective)
    own = time_alone(instance, objective) if own is None else own
    spans = np.sort(instance.arrivals + own)
    order = np.argsort(instance.arrivals, kind="stable")
    arrivals = instance.arrivals[order]
    best = -math.inf
    for kv_share in share_parts:
        for lam in np.linspace(0.0, 1.0, steps):
            p = cost.intercept * (lam * kv_share + (1 - lam) * tokens / capacity_tokens) + work
            best = max(best, float(np.maximum(srpt_completions(arrivals, p[order]), spans).sum()))
        if deadline is not None and deadline.expired():
            break
    return best


def own_intercepts_and_work_machine(instance: Instance, objective: Objective) -> float:
    """A lower bound on the sum over requests of C_r - a_r (the first token's time for TTFT): every
    request's own fewest batches' intercepts, plus the least total flow time of one preemptive machine
    that processes each request's least work, released at its arrival.

    Cut every batch into its intercept and its work. A request's latency is the length of everything
    between its arrival and its completion; of the intercepts there, at least its own batches'; of the
    work, that of every request processed meanwhile. Remove the intercepts and idle time from the time
    line (a clock that only runs while work is done): each request's work then runs in a preemptive
    one-machine schedule between its arrival and its completion on that clock, and the work parts of the
    latencies are that schedule's flow times. The clock moves arrivals closer together, never apart,
    and spreading arrivals out never raises the least total flow time, so the least flow time with
    the real arrivals, which shortest remaining processing time first attains, bounds the work parts
    (docs/formulation.md, "Bounds"). Unlike `one_machine_completions` it adds the intercepts in full
    where that one shares them out: a request that must queue behind a burst's work still pays every
    intercept of its own decodes."""
    order = np.argsort(instance.arrivals, kind="stable")
    arrivals = instance.arrivals[order]
    work = work_alone(instance, objective)[order]
    intercepts = instance.cost.intercept * float(batches_alone(instance, objective).sum())
    return intercepts + float(srpt_completions(arrivals, work).sum() - arrivals.sum())


def srpt_completions(arrivals: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The completion times, ascending, of shortest remaining processing time first on one unit-speed
    machine (preemptive; jobs sorted by arrival): the optimum of 1 | r_j, pmtn | sum C_j, and at
    every time the most jobs completed (so each k-th completion is the earliest possible)."""
    heap: list[float] = []
    t = 0.0
    done: list[float] = []
    k, n = 0, len(sizes)
    while k < n or heap:
        if not heap:
            t = max(t, float(arrivals[k]))
        while k < n and arrivals[k] <= t:
            heapq.heappush(heap, float(sizes[k]))
            k += 1
        left = heapq.heappop(heap)
        nxt = float(arrivals[k]) if k < n else math.inf
        if t + left <= nxt:
            t += left
            done.append(t)
        else:  # the next arrival comes first: run until then and compare again
            heapq.heappush(heap, left - (nxt - t))
            t = nxt
    return np.array(done)


def request_shares(instance: Instance, objective: Objective):
    """([kv share per request: area / M and each dual-feasible weight], work, tokens, token capacity)
    of `completion_order_bounds` and `one_machine_completions` (their `shares`)."""
    s = instance.system
    if objective.first_token:
        tokens, capacity_tokens = instance.prompts.astype(float), s.max_prefill_tokens
    else:
        tokens, capacity_tokens = np.array([r.peak_kv for r in instance.requests], dtype=float), s.max_batch_tokens
    items, owner = kv_items(instance, objective)
    kv_shares = [np.bincount(owner, items / kv_room(s), len(instance)), *kv_weights(instance, objective, (items, owner)).T]
    return kv_shares, work_alone(instance, objective), tokens, capacity_tokens


def pairwise_work_waits(instance: Instance, objective: Objective) -> float:
    """A lower bound on the sum over requests of the work of others done while each waits.

    A request's latency is the length of the batches between its arrival and its completion: its
    own batches and work (`alone.time_alone`) plus the work of other requests processed in
    that window (work, unlike an intercept, belongs to one request, so these add up). Of two
    requests r and q with a_r <= a_q, whichever finishes last has waited for work of the other: if
    r does, for all of W_q; if q does, for r's work after a_q, `_work_left_after`: at least
    W_r - (a_q - a_r) (at most a_q - a_r of it is done before a_q; of a batch running at a_q, q
    waits for the rest, which the requests in it share out without counting any time twice), and at
    least the work of the tokens r cannot have reached by then. So the pair adds at least
    min(r's work left at a_q, W_q). For mean latency each request q also adds the intercepts of its
    earlier partners' later batches that it is not in, or the work it does in them, which every
    partner still running waits for (`_intercept_parts`). For TTFT the same holds with each
    request's first prefill work and its first token. docs/formulation.md, "Bounds".
    """
    _, rows, extra = pair_terms(instance, objective)
    return sum(float(pair.sum()) for _, pair in rows) + float(extra.sum())


def pair_terms(instance: Instance, objective: Objective):
    """The terms of `pairwise_work_waits`: `order` (the requests by arrival); `rows`, one per request r
    in that order but the last: (`later`: the positions in `order` of the requests q arriving while
    r can still be working, `pair`: min(r's work left at a_q, W_q) for each); and `extra`, per
    position q in `order`, what q adds with its earlier partners' later batches over the pairs
    (`_intercept_parts`; 0 for first tokens). The block bound (blocks.py) reads them per pair."""
    cost = instance.cost
    order = np.argsort(instance.arrivals, kind="stable")
    arrivals = instance.arrivals[order]
    n = len(order)
    if objective.first_token:
        work = first_prefill_work(instance.prompts[order], cost, largest_chunk(instance))
        reach = np.searchsorted(arrivals, arrivals + work, side="left")  # pairs further apart add nothing
        steps = None
    else:
        first_prefill = time_alone(instance, Objective.MEAN_TTFT)
        steps = [_token_steps(instance, int(i), first_prefill[i]) for i in order]
        work = np.array([float(w.sum()) for _, w in steps])
        reach = np.searchsorted(arrivals, arrivals + np.array([t[-1] for t, _ in steps]), side="left")
    positions = np.arange(n)
    rows = []
    partners = []  # per r: (the later q, r's work left at a_q, r's batches after a_q, the pair's term)
    for k in range(n - 1):
        later = slice(k + 1, max(k + 1, int(reach[k])))
        gap = arrivals[later] - arrivals[k]
        left = np.maximum(work[k] - gap, 0.0)
        if steps is not None:
            times, token_work_k = steps[k]
            reached = np.searchsorted(times, gap, side="right")  # the most tokens r can have at a_q
            left = np.maximum(left, _work_left_after(times, token_work_k, gap, reached))
        pair = np.minimum(left, work[later])
        rows.append((positions[later], pair))
        if steps is not None:
            late = np.maximum(len(times) - 1 - reached, 0)  # r's batches that start after a_q
            partners.append(np.column_stack([positions[later], left, late, pair]))
    extra = np.zeros(n)
    if steps is not None and partners:
        terms = np.concatenate(partners)
        terms = terms[np.argsort(terms[:, 0], kind="stable")]
        cuts = np.searchsorted(terms[:, 0], np.arange(n + 1))
        for q in range(n):
            if cuts[q + 1] > cuts[q]:
                progress = _progress_work(instance, int(order[q]), steps[q][1])
                extra[q] = _intercept_parts(terms[cuts[q]:cuts[q + 1], 1:], progress, work[q], cost.intercept)
    return order, rows, extra


def _progress_work(instance: Instance, i: int, work: np.ndarray) -> np.ndarray:
    """Request i's least work to come p batches closer to done, p = 0 .. its fewest batches.

    Its fewest batches from the start are ceil(I / P) + O - 1 and each batch removes at most one:
    the j-th of the first ceil(I / P) needs the prompt's tokens up to I - (ceil(I / P) - j) P (their
    per_token work; the last, the first prefill's whole work), the rest one token each."""
    r, cost = instance.requests[i], instance.cost
    P = instance.system.max_prefill_tokens
    chunks = fewest_batches(r.prompt, 1, P)
    prefix = cost.per_token * (r.prompt - (chunks - np.arange(1, chunks)) * P)
    return np.r_[0.0, prefix, work[0] + np.r_[0.0, np.cumsum(work[1:])]]  # p = 0, the chunks, then each token


def _intercept_parts(partners: np.ndarray, progress: np.ndarray, own_work: float, intercept: float) -> float:
    """What request q adds over its pairs' work waits, from its earlier partners r at once.

    `partners`: per r, (L: r's work left at a_q, R: r's batches that must start after a_q, the pair's
    term); `progress`: q's least work to come p batches closer to done (`_progress_work`). Let A be
    the partners that finish before q, and s_r how much closer q came by r's end (s_r <= S - 1, S
    q's fewest batches: q is not done). Then q's window holds r's R batches, and q needs S - s_r more
    after them, so at least max over A of (R - s_r) batches more than its fewest, each an intercept
    more; r waits for q's work of that progress (`progress[s_r]`) besides q waiting for L; a partner
    finishing after q waits for all of q's work. Over m = that maximum, each partner takes its
    cheaper side: min over m >= 0 of m k0 + sum_r min(W_q, L + progress[max(0, R - m)]) (the
    second only where max(0, R - m) <= S - 1), less the pairs. With one partner it is the pair's
    intercept step; with several, every partner still running pays the work q does in its batches.

    The minimum is exact but found without trying every m (all at 0 a thousand partners with hundreds
    of batches each): the sum over partners, F(m), does not grow with m, so over m in [g, g'] the value
    is at least k0 g + F(g'); F is evaluated on a grid (`_counts_up_to`), then at every m of the
    intervals whose lower end could still beat the best value found."""
    L, R, pair = partners[:, 0], partners[:, 1].astype(int), partners[:, 2]
    fewest = len(progress) - 1

    def total(ms: np.ndarray) -> np.ndarray:  # k0 m + F(m)
        need = np.maximum(R[None, :] - ms[:, None], 0)  # q's progress by r's end, were r in A
        before = np.where(need <= fewest - 1, L[None, :] + progress[np.minimum(need, fewest)], np.inf)
        return intercept * ms + (np.minimum(own_work, before) - pair[None, :]).sum(axis=1)

    grid = _counts_up_to(int(R.max()))
    at = total(grid)
    best = float(at.min())  # beyond the last grid point (max R) F is constant: no smaller value
    lower = at[1:] - intercept * (grid[1:] - grid[:-1])  # k0 g_j + F(g_{j+1}) on [g_j, g_{j+1}]
    for j in np.flatnonzero((lower < best) & (grid[1:] - grid[:-1] > 1)):
        best = min(best, float(total(np.arange(grid[j] + 1, grid[j + 1])).min()))
    return max(0.0, best)


#: `_intercept_parts` tries every batch count up to this one, then a grid (steps <= a tenth)
EXACT_UP_TO = 64


def _counts_up_to(top: int) -> np.ndarray:
    """0, 1, .., min(top, EXACT_UP_TO), then steps of at most a tenth of the count, ending at `top`."""
    if top <= EXACT_UP_TO:
        return np.arange(top + 1)
    grid = [*range(EXACT_UP_TO + 1)]
    while grid[-1] < top:
        grid.append(min(top, grid[-1] + max(1, grid[-1] // 10)))
    return np.array(grid)


def _token_steps(instance: Instance, i: int, first_prefill: float) -> tuple[np.ndarray, np.ndarray]:
    """Request i alone: (the least time from its arrival to its n-th token, n = 1..O; the least work
    of each token, `alone.token_work`); `first_prefill` is its least time to its first token.

    Token n >= 2 needs a batch of its own after token n - 1 (a decode, or the last chunk of a
    refill whose earlier chunks run in between), at least the intercept plus that work."""
    cost = instance.cost
    work = token_work(instance.requests[i], cost, largest_chunk(instance))
    times = first_prefill + np.r_[0.0, np.cumsum(cost.intercept + work[1:])]
    return times, work


def _work_left_after(times: np.ndarray, work: np.ndarray, gap: np.ndarray, reached: np.ndarray) -> np.ndarray:
    """A request's work still to come `gap` seconds after its arrival, for every gap. If it has n
    tokens by then (n <= g = `reached`, the tokens it reaches alone within the gap, `times`), the
    batches of tokens n + 2 .. O start later, and of token n + 1's work at most the time since its
    n-th token (at least times[n - 1] after its arrival; 0 for n = 0) is done. n = g leaves the least."""
    suffix = np.r_[np.cumsum(work[::-1])[::-1], 0.0, 0.0]  # suffix[k]: the work of tokens k + 1 .. O
    since = gap - np.r_[0.0, times][reached]  # time since token g
    started = np.r_[work, 0.0][reached]  # token g + 1's work (0 once all are reached)
    return suffix[np.minimum(reached + 1, len(work))] + np.maximum(started - since, 0.0)


def release_bound(instance: Instance) -> tuple[float, float]:
    """(bound, t): the batch bound of `min_batches` applied to the requests that arrive at t or later.

    None of them is processed before t, so the batches that process them all start at t or later:
    at least as many as those requests need on their own (longest output, tokens / C, prompts / P,
    KV area over the prefill ramp, the dual-feasible weights of their KV items), each paying the intercept, plus their
    minimal work. The makespan is at least t plus that, for every arrival time t; with t = 0 this is
    the offline batch bound, and it grows where a burst arrives late and the KV limit binds.
    """
    s, cost = instance.system, instance.cost
    reqs = instance.requests
    order = np.argsort(instance.arrivals, kind="stable")
    arrivals = instance.arrivals[order]

    def suffix(values) -> np.ndarray:  # sums over the requests from each position of `order` on
        return np.cumsum(np.asarray(values, dtype=float)[order][::-1], axis=0)[::-1]

    items, owner = kv_items(instance)
    by_dff = np.ceil(suffix(kv_weights(instance, items=(items, owner))).max(axis=1) - 1e-9)
    by_output = np.maximum.accumulate(np.array([r.output for r in reqs])[order][::-1])[::-1]
    by_tokens = np.ceil(suffix([r.peak_kv for r in reqs]) / s.max_batch_tokens)
    by_prefill = np.ceil(suffix([r.prompt for r in reqs]) / s.max_prefill_tokens)
    # their KV area over the prefill ramp: from t on, their items are what they have processed since
    # (the ramp of all requests holds at least as much as theirs)
    ramp, room = ramp_capacities(instance), kv_room(s)
    by_area = batches_to_hold(suffix(np.bincount(owner, items, len(reqs))), ramp, room)
    batches = np.max(np.stack([by_output, by_tokens, by_prefill, by_area, by_dff]), axis=0)
    chunk = largest_chunk(instance)
    values = arrivals + batches * cost.intercept + suffix([least_work(r, cost, chunk) for r in reqs])
    first_of_time = np.r_[True, arrivals[1:] > arrivals[:-1]]  # requests arriving at t are all counted
    best = int(np.argmax(np.where(first_of_time, values, -np.inf)))
    return float(values[best]), float(arrivals[best])


#: the arrival times the release-aware bounds start from: all distinct ones up to this many, else quantiles
RELEASE_TIMES = 64


def release_times(arrivals: np.ndarray) -> np.ndarray:
    """Distinct arrival times to start release-aware bounds from (the earliest always included)."""
    times = np.unique(arrivals)
    if len(times) > RELEASE_TIMES:
        times = np.unique(np.quantile(times, np.linspace(0.0, 1.0, RELEASE_TIMES), method="lower"))
    return times


#: `first_prefill_batches` follows a group's real batch index at most this far above the least its prefix needs
SLACK_KEPT = 16


def first_prefill_batches(instance: Instance) -> float:
    """A lower bound on the mean TTFT where every request arrives at the same time: the first prefills
    as jobs of one batching machine (s-batching), shortest first, grouped by a dynamic programme.

    In any schedule, the requests whose first token comes in the same batch form a group, and the
    k-th such batch is the r_k-th batch that processes tokens. It ends no earlier than k0 r_k plus the
    least first-prefill work (`alone.first_prefill_work`) of every request with its first token by
    then (all their prompt tokens were processed in those batches; decodes and refills only add).
    And r_k >= r_{k-1} + 1, r_k >= ceil(tokens of those prompts / min(C, P)) and r_k >= ceil(I / min(C, P))
    for each request in the group; a group holds no more requests than the smallest prompts fit in M
    (after its batch each member holds its prompt). Over groups and indices obeying only these rules, giving a shorter
    prompt's request an earlier group never breaks one (its prefix holds fewer tokens, its own I is
    smaller, group sizes stay) and never delays a first token (its least work is no larger), so some best relaxed
    schedule takes the requests shortest prompt first in consecutive groups, each at the least index
    the rules allow: a dynamic programme over (requests done, slack of r over what the prefix needs).
    Slack above SLACK_KEPT counts as SLACK_KEPT (a smaller index: still a relaxation). With k0 and
    linear work this is Coffman et al.'s optimal s-batching of identical-setup jobs; docs/formulation.md,
    "Bounds". Seconds over requests; 0 without requests."""
    total, _ = first_prefill_groups(instance)
    return total / len(instance) if len(instance) else 0.0


def first_prefill_groups(instance: Instance) -> tuple[float, list[list[int]]]:
    """`first_prefill_batches`' dynamic programme: (the least sum of first-token times, from the common
    arrival, of its relaxation; the groups of a best relaxed schedule, request ids, shortest prompt
    first). The burst search builds a schedule from the groups (`schedulers.bursts.build_prefill_groups`)."""
    n = len(instance)
    if not n:
        return 0.0, []
    cost = instance.cost
    k0 = cost.intercept
    order = np.argsort(instance.prompts, kind="stable")
    prompts = instance.prompts[order].astype(np.int64)
    chunk = largest_chunk(instance)
    done_work = np.r_[0.0, np.cumsum(first_prefill_work(prompts, cost, chunk))]
    tokens = np.r_[0, np.cumsum(prompts)]
    need = np.maximum(-(-tokens // chunk), np.r_[0, -(-prompts // chunk)])  # least index of a group ending at e
    # a group's members hold their prompts after its batch: at most as many as the smallest prompts fit in M
    system = instance.system
    held = np.cumsum(round_to_blocks(prompts, system.block_size))
    largest_group = max(1, int(np.searchsorted(held, system.kv_capacity, side="right")))
    kept = min(SLACK_KEPT, n)
    least = np.full((n + 1, kept + 1), np.inf)  # [e, s]: least sum of first-token times of the e shortest,
    least[0, 0] = 0.0                           # their last group at index need[e] + s
    came_from = np.zeros((n + 1, kept + 1, 2), dtype=np.int64)  # the (e, s) each best value came from
    for e in range(n):
        ends = np.arange(e + 1, min(n, e + largest_group) + 1)
        floor = need[ends]
        for slack in np.flatnonzero(np.isfinite(least[e])):
            index = np.maximum(need[e] + slack + 1, floor)
            slack_to = np.minimum(index - floor, kept)
            total = least[e, slack] + (ends - e) * (k0 * (floor + slack_to) + done_work[ends])
            better = total < least[ends, slack_to]
            least[ends[better], slack_to[better]] = total[better]
            came_from[ends[better], slack_to[better]] = (e, slack)
    e, slack = n, int(np.argmin(least[n]))
    value = float(least[n, slack])
    groups = []
    while e > 0:
        before, slack = came_from[e, slack]
        groups.append([int(i) for i in order[before:e]])
        e = int(before)
    return value, groups[::-1]


def completion_order_bounds(instance: Instance, objective: Objective, steps: int = 11, shares=None,
                            deadline: Deadline | None = None) -> np.ndarray:
    """Lower bounds on the k-th smallest completion (first-token) time, k = 1..N.

    The k requests done first, a set S, have together used the KV capacity for their whole area
    (the batch that generates token q of request i holds I + q - 1 KV tokens) and the token budget
    for their tokens, so at least max(area(S) / M, tokens(S) / C) batches ran, each paying the
    intercept, plus the minimal work of every request in S; the area share may be replaced by the
    dual-feasible weights of the same KV items (`dff_batches`). For every lambda in [0, 1],
    lambda area / M + (1 - lambda) tokens / C is below that maximum and linear in S, so its smallest
    value over k-sets is the sum of the k smallest per-request values. The k-th smallest of the
    per-request bounds (arrival + own minimal time) is a bound too, and so is the batch count of
    the longest of the k requests run alone, or the batches their tokens and KV items need (the k
    smallest among the requests needing no more batches alone), plus their work; the largest one counts.

    With arrivals the same holds from every arrival time t (`release_times`): of the k requests
    done first, at least k - (the number arriving before t) arrive at t or later, and they are
    served in batches that start at t or later, so the k-th completion is at least t plus the sum
    of that many smallest shares among the requests arriving from t.

    With `deadline`, the release times tried by then (the earliest first), and the "by length" part
    only where it is reached before the deadline (it is a least over B: all of it, or none).
    """
    cost = instance.cost
    n = len(instance)
    best = np.sort(instance.arrivals + time_alone(instance, objective))
    # a request's share of the KV capacity: its area (the sum of its items) / M, or the items'
    # dual-feasible weights
    kv_shares, work, tokens, capacity_tokens = shares or request_shares(instance, objective)
    arrivals = instance.arrivals
    for t in release_times(arrivals):
        if deadline is not None and deadline.expired():
            return best
        # of the k requests done first, at least k - (those arriving before t) arrive at t or later
        # and are served in batches that start at t or later
        late = arrivals >= t
        before = n - int(late.sum())
        for kv_share in kv_shares:
            for lam in np.linspace(0.0, 1.0, steps):
                share = cost.intercept * (lam * kv_share[late] + (1 - lam) * tokens[late] / capacity_tokens) + work[late]
                best[before:] = np.maximum(best[before:], t + np.cumsum(np.sort(share)))
    # the k requests done first have also run, between them, as many batches as the longest of them
    # needs alone (b_i), and as many as their tokens and KV items need: at least min over B of
    # k0 max(B, the batches of the k smallest token counts and of the k smallest areas among requests
    # with b_i <= B) + the k smallest works among them
    alone = batches_alone(instance, objective)
    room = kv_room(instance.system)
    area, ramp = kv_shares[0] * room, ramp_capacities(instance)
    by_length = np.full(n, np.inf)
    for B in np.unique(alone):
        among = alone <= B
        sums = np.cumsum(np.sort(work[among]))
        held = batches_for_smallest(tokens[among], capacity_tokens, area[among], ramp, room)
        by_length[:len(sums)] = np.minimum(by_length[:len(sums)], cost.intercept * np.maximum(B, held) + sums)
    return np.maximum(best, by_length)
