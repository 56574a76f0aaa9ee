"""Block bounds for mean latency and mean TTFT: requests that share batches, priced together (issue 33).

Every other mean bound prices requests one at a time (each alone, the Lagrangian's trajectories)
or in pairs (the pairwise work waits). Here a block S of requests is priced as an instance of its
own (its requests alone, every arrival at 0), so its value sees the batches they share; requests
in different blocks are priced by the pairwise work waits. docs/formulation.md, "The block bound",
has the statement and the proof; in short, for weights y_S >= 0 over blocks with
sum_{S containing i} y_S <= 1 for every request i,

    sum_i (C_i - a_i) >= sum_i (T_i + E_i) + sum_{i < j} P_ij + sum_S y_S g_S,
    g_S = max(0, V_S - sum_{i in S} (T_i + E_i) - sum_{i < j in S} P_ij),
    V_S = max(L_S - sum_{i in S} d_i, D_S), d_i = a_i - min_{j in S} a_j,

with T_i each request's least time alone (`alone.time_alone`), P_ij the pairwise work waits of i
and j (`pair_waits`: work only, so that they add up over pairs; the pairwise bound's intercept
part E_q counts where q is in no block), L_S any certified lower bound on the least sum of
latencies (first-token times) of S alone with every arrival at 0, and D_S the due-date value
(`due_date_value`: each request pays only the part of its offset d_i it cannot absorb). A family
with any weights is a bound, so blocks are priced one after the other and the bound is offered
after each (`BlockFamily`); the weights are an LP over the blocks priced so far (a fractional
packing: each request's weights add up to at most 1).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from .. import interrupt
from ..alone import time_alone
from ..deadline import Deadline
from ..interrupt import Stopped
from ..objective import Objective
from ..schedule import Batch, Schedule, validate
from ..units import UnitRunner
from ..workload import Instance
from .analytic import analytic_bounds, completion_order_bounds, pair_terms
from .base import Bound, Stage, register, rises

#: the block sizes tried, smallest first (blocks of one are the singletons: their gain is 0)
BLOCK_SIZES = (2, 3, 4, 6, 8)
#: instances of at most this many requests get no blocks (one block of all is the instance itself)
MIN_REQUESTS = 10
#: the most seconds one block's pricing may take (else an equal share of the time left)
BLOCK_SECONDS = (None, 8.0)
#: the bound's row
NAME = "blocks: each block alone + pairwise work waits across blocks"


def pair_waits(instance: Instance, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
    """(P, E). P[i, j] = P[j, i]: a lower bound on the work of j that i waits for plus the work of i
    that j waits for: with a_r <= a_q, min(r's work left at a_q, W_q) (`analytic.pairwise_work_waits`,
    whose sum over pairs is P's). E[q] (mean latency only): what q adds with its earlier partners'
    later batches over their pairs' P (`analytic._intercept_parts`); it spends q's own batches and
    those pairs (docs/formulation.md: it is counted with q's own weight left outside blocks). For
    first tokens, prefill work and no E. sum P / 2 + sum E is the pairwise bound's sum."""
    n = len(instance)
    out = np.zeros((n, n))
    order, rows, extra = pair_terms(instance, objective)
    for k, (later, pair) in enumerate(rows):
        out[order[k], order[later]] = pair
    by_request = np.zeros(n)
    by_request[order] = extra
    return out + out.T, by_request


def at_zero(instance: Instance, members) -> Instance:
    """The requests `members` alone, every arrival at 0, on the same system and cost."""
    return Instance(tuple(replace(instance.requests[i], arrival=0.0) for i in members), instance.system,
                    instance.cost, name=f"{instance.name}[block]")


def restricted(schedule: Schedule, members, block: Instance) -> Schedule:
    """`schedule`'s batches kept for `members` only (renumbered 0..|S|-1), back to back: a valid
    schedule of `block` (fewer requests hold less KV and fewer tokens; every arrival is 0)."""
    index = {int(i): k for k, i in enumerate(members)}
    batches = []
    for b in schedule.batches:
        tokens = {index[i]: c for i, c in b.tokens.items() if i in index}
        evict = tuple(index[i] for i in b.evict if i in index)
        if tokens or evict:
            batches.append(Batch(tokens, evict))
    return Schedule(block.requests, batches)


def price_block(block: Instance, objective: Objective, deadline: Deadline, schedule: Schedule | None = None,
                passes: int | None = None) -> float:
    """A certified lower bound on the least sum of latencies (first-token times) of `block` (every
    arrival at 0): the analytic bounds, then the Lagrangian bound and its completion-master variant
    until `deadline` (or until one meets `schedule`, a valid schedule of the block, when given), each
    for at most `passes` passes where given (then the value does not depend on the machine's speed)."""
    from .completion_master import MasterBound
    from .lagrangian import LagrangianBound, start_horizon

    n = len(block)
    best = max((b.value for b in analytic_bounds(block, objective) if b.certified and b.found), default=0.0)
    if schedule is None or deadline.expired():
        return n * best
    upper = objective.of(validate(block, schedule).metrics)
    H = start_horizon(schedule)
    for make in (LagrangianBound, MasterBound.where_it_fits):
        if best >= upper * (1 - 1e-9) or deadline.expired():
            break
        bound = make(block, objective, H)
        if bound is None:
            continue
        for done, (value, _, _) in enumerate(bound.iterate(upper), 1):
            best = max(best, value)
            if deadline.expired() or best >= upper * (1 - 1e-9) or done == passes:
                break
    return n * min(best, upper)  # a bound above a valid schedule would be a bug: never more than it


@dataclass
class BlockFamily:
    """Blocks priced so far for one instance and objective, and the bound they give (the module's
    docstring). `add` prices a block with `pricer(block_instance) -> certified lower bound on its
    sum`; `value` is the bound (mean seconds) with the LP's weights over the blocks added."""

    instance: Instance
    objective: Objective
    alone: np.ndarray = field(init=False)
    pairs: np.ndarray = field(init=False)
    blocks: list = field(default_factory=list)  # (members, V_S, gain)
    weights: np.ndarray = field(init=False)

    def __post_init__(self):
        self.alone = time_alone(self.instance, self.objective)
        self.pairs, self.extra = pair_waits(self.instance, self.objective)
        self.base = float(self.alone.sum() + self.pairs.sum() / 2 + self.extra.sum())
        self.weights = np.zeros(0)

    def own(self, members) -> float:
        """What the base counts that a block spends: its requests alone, its pairs and its requests'
        intercept parts (E, each spending its request's own batches)."""
        members = np.asarray(members)
        return float(self.alone[members].sum() + self.pairs[np.ix_(members, members)].sum() / 2
                     + self.extra[members].sum())

    def spread(self, members) -> float:
        """sum over the block of (arrival - the block's first arrival)."""
        a = self.instance.arrivals[np.asarray(members)]
        return float((a - a.min()).sum())

    def add(self, members, priced_sum: float, weigh: bool = True, completions: np.ndarray | None = None) -> float:
        """Record a block priced at `priced_sum` (a certified bound on its sum at arrival 0); its gain.
        `completions`: certified lower bounds on the block's k-th completion (first-token) time at
        arrival 0, k = 1..|S|, ascending (`analytic.completion_order_bounds`), for `due_date_value`.
        `weigh=False` leaves the weights as they were (the new block at 0) until `weigh`."""
        members = tuple(sorted(int(i) for i in members))
        value = priced_sum - self.spread(members)
        if completions is not None:
            a = self.instance.arrivals[np.asarray(members)]
            value = max(value, due_date_value(completions, self.alone[np.asarray(members)], a - a.min()))
        gain = max(0.0, value - self.own(members))
        self.blocks.append((members, value, gain))
        if weigh:
            self.weigh()
        else:
            self.weights = np.r_[self.weights, 0.0]
        return gain

    def weigh(self) -> None:
        """The LP's weights over every block recorded."""
        self.weights = self._weigh()

    def reprice(self, k: int, priced_sum: float) -> float:
        """Block k priced again at `priced_sum`; it keeps the larger of its two values. Its gain."""
        members, value, old = self.blocks[k]
        value = max(value, priced_sum - self.spread(members))
        gain = max(0.0, value - self.own(members))
        self.blocks[k] = (members, value, gain)
        if gain > old:
            self.weigh()
        return gain

    def _weigh(self) -> np.ndarray:
        """The weights: max sum y_S g_S over y >= 0, sum over blocks holding i of y_S <= 1 (an LP)."""
        gains = np.array([g for _, _, g in self.blocks])
        useful = gains > 0
        y = np.zeros(len(gains))
        if not useful.any():
            return y
        members = [m for (m, _, _), u in zip(self.blocks, useful) if u]
        if _disjoint(members):
            y[useful] = 1.0
            return y
        from scipy.optimize import linprog
        from scipy.sparse import lil_matrix

        A = lil_matrix((len(self.instance), len(members)))
        for k, m in enumerate(members):
            A[list(m), k] = 1.0
        res = linprog(-gains[useful], A_ub=A.tocsr(), b_ub=np.ones(len(self.instance)), bounds=(0.0, 1.0),
                      method="highs")
        if res.status != 0:  # fall back to a greedy packing, a bound all the same
            return self._greedy(gains)
        # projected onto the constraints, so that a solver tolerance cannot overcount
        load = A.tocsr() @ np.asarray(res.x)
        scale = 1.0 / max(1.0, float(load.max()))
        y[useful] = np.clip(res.x, 0.0, 1.0) * scale
        return y

    def _greedy(self, gains: np.ndarray) -> np.ndarray:
        y, used = np.zeros(len(gains)), set()
        for k in np.argsort(-gains):
            m = self.blocks[k][0]
            if gains[k] > 0 and not used.intersection(m):
                y[k], used = 1.0, used | set(m)
        return y

    @property
    def value(self) -> float:
        gains = np.array([g for _, _, g in self.blocks])
        return (self.base + float(self.weights @ gains if len(gains) else 0.0)) / len(self.instance)

    def used(self) -> int:
        return int((self.weights > 1e-9).sum())


def due_date_value(completions: np.ndarray, alone: np.ndarray, offsets: np.ndarray) -> float:
    """A lower bound on a block's own sum of latencies under any arrivals no further apart than its
    own (what `V_S` bounds): min over assignments of its requests to completion ranks of
    sum_i max(c_rank(i) - d_i, T_i). With the block's first arrival at 0, request i arrives at most
    d_i = a_i - min a later, so its latency is at least C_i - d_i, and at least T_i; the schedule
    is one of the block at arrival 0 too, whose k-th completion is at least c_k."""
    from scipy.optimize import linear_sum_assignment

    cost = np.maximum(np.asarray(completions, dtype=float)[None, :] - offsets[:, None], alone[:, None])
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].sum())


def _disjoint(members) -> bool:
    seen: set = set()
    for m in members:
        if seen.intersection(m):
            return False
        seen.update(m)
    return True


def candidate_blocks(instance: Instance, objective: Objective, sizes=BLOCK_SIZES) -> list[tuple[int, ...]]:
    """Blocks worth pricing, in the order to price them: requests in order of arrival (then of their
    time alone), every window of each size (the LP chooses among overlapping ones).
    With arrivals only requests close in time can share batches; a block's arrival spread is paid in
    full (`BlockFamily.spread`), so windows whose spread exceeds the block's time alone are left out."""
    n = len(instance)
    own = time_alone(instance, objective)
    order = np.lexsort((own, instance.arrivals))
    a = instance.arrivals[order]
    out = []
    for m in sizes:
        if m >= n:
            continue
        for s in range(n - m + 1):
            window = order[s:s + m]
            if float((a[s:s + m] - a[s]).sum()) <= float(own[window].sum()):
                out.append(tuple(int(i) for i in window))
    return out


def block_bound(instance: Instance, objective: Objective, deadline: Deadline, schedule: Schedule | None = None,
                sizes=BLOCK_SIZES, pricer=None, on_value=None, runner: UnitRunner = UnitRunner(),
                passes: int | None = None) -> tuple[float, BlockFamily]:
    """The block bound (mean seconds) of the blocks `candidate_blocks` gives, and the family.

    Every block is first priced by the analytic bounds of the block alone (milliseconds each), then
    again, in order of the gain that left the least to find (V_S - what the base counts, largest
    first), by `price_block` from `schedule` restricted to the block, each with an equal share of
    the time left over the blocks and `runner`'s workers (at most BLOCK_SECONDS[1]), until
    `deadline`; or by `pricer(block_instance, members, deadline) -> a certified bound on the block's
    sum` where given (in this process). The blocks are independent units: `runner` prices them on
    every core (default) or on Ray; with a `passes` budget (`price_block`) the bound is the same
    from each. A block priced twice keeps the larger value. `on_value(value)`: called with the bound
    after each step that raised it (anytime: every partial family is a bound)."""
    family = BlockFamily(instance, objective)
    best = family.value

    def offer():
        nonlocal best
        if family.value > best:
            best = family.value
            if on_value is not None:
                on_value(best)

    blocks = candidate_blocks(instance, objective, sizes)
    subs = [at_zero(instance, members) for members in blocks]
    cheap = []
    for at, (priced, completions) in _cheap_prices(subs, objective, instance.offline, runner, deadline):
        family.add(blocks[at], priced, weigh=False, completions=completions)
        cheap.append((family.blocks[-1][1] - family.own(blocks[at]), len(family.blocks) - 1, blocks[at], subs[at]))
    family.weigh()
    offer()
    cheap.sort(key=lambda c: -c[0])
    if pricer is not None:
        for k, (_, at, members, sub) in enumerate(cheap):
            if deadline.expired():
                break
            family.reprice(at, pricer(sub, members, Deadline(_block_seconds(deadline, len(cheap) - k, 1))))
            offer()
        return family.value, family
    if not cheap or deadline.expired():
        return family.value, family
    seconds = _block_seconds(deadline, len(cheap), runner.count(len(cheap)))
    units = [(sub, objective, seconds, restricted(schedule, members, sub) if schedule is not None else None, passes)
             for _, _, members, sub in cheap]
    results = runner.run(_price_unit, units)
    try:
        for k, priced in results:
            family.reprice(cheap[k][1], priced)
            offer()
            if deadline.expired():
                break
    except Stopped:  # an interrupt: the blocks priced so far are the bound
        if interrupt.requested() is None:
            raise
    finally:
        results.close()  # the blocks not priced in time are dropped, their workers stopped
    return family.value, family


def _price_unit(unit) -> float:
    """One block priced in a worker: (block instance, objective, seconds, its schedule, passes)."""
    sub, objective, seconds, schedule, passes = unit
    return price_block(sub, objective, Deadline(seconds), schedule, passes)


def _cheap_unit(unit) -> list:
    """The analytic prices of a chunk of blocks in a worker: [(priced sum, completions or None)]."""
    subs, objective, offline = unit
    return [(price_block(sub, objective, Deadline(None), None),
             None if offline else completion_order_bounds(sub, objective)) for sub in subs]


#: fewer blocks than this a worker are priced analytically in this process (a pool costs more than they do)
POOL_FROM = 256
#: blocks a unit of the analytic pricing: small enough that the deadline leaves few unreturned
CHUNK = 128


def _cheap_prices(subs: list[Instance], objective: Objective, offline: bool, runner: UnitRunner, deadline: Deadline):
    """(block index, (analytic price, completion bounds)) of every block, in order, until `deadline`:
    in chunks on `runner`'s workers where there are many (then the chunks returned by the deadline)."""
    workers = runner.count(len(subs) // POOL_FROM)
    if workers == 1:
        for k, sub in enumerate(subs):
            if deadline.expired():
                return
            yield k, _cheap_unit(([sub], objective, offline))[0]
        return
    count = max(workers, -(-len(subs) // CHUNK))
    results = runner.run(_cheap_unit, [(subs[c::count], objective, offline) for c in range(count)])
    done = {}
    try:
        for c, priced in results:
            done[c] = priced
            if deadline.expired():
                break
    except Stopped:
        if interrupt.requested() is None:
            raise
    finally:
        results.close()
    # the chunks stride the blocks: block k is in chunk k % count, at position k // count
    for k in range(len(subs)):
        if k % count in done:
            yield k, done[k % count][k // count]


def _block_seconds(deadline: Deadline, blocks: int, workers: int) -> float:
    """One block's seconds: an equal share of the time left over `blocks` blocks still to price on
    `workers` workers, at most BLOCK_SECONDS[1]."""
    return min(BLOCK_SECONDS[1], deadline.remaining() * workers / blocks)  # remaining() is inf without a limit


class _BlockMethod:
    """The block bound as a one-shot step of its stage, with `share` of the time left: the bound of
    the blocks priced when its time ends (every partial family is a bound), and before that each
    rise, certified on the ledger as it comes."""

    name = "blocks"

    def skip_reason(self, known) -> str | None:
        if not known.objective.is_mean:
            return "none for total latency"
        if len(known.instance) <= MIN_REQUESTS:
            return f"none: at most {MIN_REQUESTS} requests (one block of all is the instance)"
        options = getattr(known, "options", None)
        if known.instance.offline and not (options is not None and options.every_bound):
            # measured (bench/results/blocks.md): all at 0 the Lagrangian of the whole instance is
            # above the blocks of it, and their time would be taken from its race
            return "none in a solve with every request at 0 (`kvbound bound` runs it)"
        return None

    def compute(self, known, deadline) -> list[Bound]:
        began = time.perf_counter()
        offer = rises(known, NAME, "so far: blocks still being priced")

        options = getattr(known, "options", None)
        runner = options.units if options is not None else UnitRunner()
        value, family = block_bound(known.instance, known.objective, deadline, known.best_schedule, on_value=offer,
                                    runner=runner)
        sizes = sorted({len(m) for m, _, _ in family.blocks})
        note = (f"{len(family.blocks)} blocks priced (sizes {', '.join(map(str, sizes)) or '-'}), "
                f"{family.used()} weighted by the LP")
        details = {"blocks_priced": len(family.blocks), "blocks_weighted": family.used(),
                   "base": family.base / len(known.instance)}
        return [Bound(NAME, value, time.perf_counter() - began, note=note, details=details)]


@register
class SearchBlocks(_BlockMethod):
    """In the search, before the anytime race."""

    stage, share = Stage.SEARCH, 0.15


@register
class ModelBlocks(_BlockMethod):
    """Before a model, where every bound is asked for (`kvbound bound`)."""

    stage, share = Stage.MODEL, 0.25
