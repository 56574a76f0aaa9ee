"""A certified capacity bound: the rate factor above which no schedule keeps a mean objective within a limit.

`kvbound headroom` calls a scheduler's capacity the largest rate factor f (every arrival time divided
by f) at which its mean latency (or mean TTFT) stays within `limit` seconds. This module bounds the
same quantity for every schedule at once (docs/analysis.md, "The certified capacity bound").

**Windows of arrivals.** Sort the requests by arrival a_1 <= ... <= a_N and take a window W of
consecutive ones, j..k. At factor f none of them arrives before a_j / f, so restricting any schedule
to W (every rule still holds: fewer requests, less KV, fewer tokens per batch, no batch longer) and
starting its clock at a_j / f gives a schedule of W with every request at 0 and idle gaps; closing
the gaps only ends its requests earlier. Hence

    sum_{i in W} (C_i - a_i / f) >= LB0(W) - sum_{i in W} (a_i - a_j) / f,

with LB0(W) any lower bound on the sum of completion (first-token) times of W alone, all at 0. Here
LB0(W) is the k-th completion bound of `completion_order_bounds` summed over k, for each capacity
share vector s (the intercept times lambda KV share + (1 - lambda) tokens / C, plus the least work:
the shares of one batch add up to at most its time): sum_k (sum of the k smallest s_i in W) =
(sum_{i, m in W} min(s_i, s_m) + sum_{i in W} s_i) / 2, the largest over the vectors; and the sum of
each request's time alone. Windows that do not overlap add up, so

    L(f) = max over partitions of the sorted requests into windows of sum_W [LB0(W) - sum_{i in W} (a_i - a_j) / f]

is a lower bound on N x the mean objective of every schedule at factor f (a dynamic program over the
window ends). Each term grows with f (a_i >= a_j), so L grows with f: once L(F) / N > limit, every
factor f >= F has every schedule's mean above the limit. The bisection below finds the least such F
on log f; the scheduler capacities of `headroom` (measured against the same limit) are all below it.

Beyond `MAX_GROUPS` requests, windows start and end at groups of consecutive requests (every window
of groups is a window of requests, so the bound stays valid, only coarser).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..alone import time_alone
from ..bounds.analytic import request_shares, srpt_completions
from ..objective import Objective
from ..workload import Instance

#: windows start and end at most this many groups of consecutive requests (memory and time ~ groups^2)
MAX_GROUPS = 1500
#: lambda steps of the share vectors
LAMBDA_STEPS = 11
#: share vectors kept (the strongest with every request at once): each costs N^2 in the windows and a
#: shortest-remaining-time run per factor (there are (1 + dual-feasible functions) x LAMBDA_STEPS)
KEEP_VECTORS = 8
#: the bisection's relative bracket width on f
REL_TOL = 1e-3
#: the factors searched: [2^-20, 2^20], as `kvbound capacity`
LOWEST, HIGHEST = 2.0 ** -20, 2.0 ** 20


@dataclass
class WindowBounds:
    """Per window of groups g..h (g <= h): `at_zero[g, h]` = LB0 of the window's requests all at 0 and
    `spread[g, h]` = sum over them of (a_i - a_start), a_start the window's first arrival."""
    at_zero: np.ndarray
    spread: np.ndarray
    requests: int

    def total(self, factor: float) -> float:
        """L(factor): the largest sum over a partition into windows (module docstring)."""
        value = self.at_zero - self.spread / factor
        groups = len(value)
        best = np.zeros(groups + 1)  # best[h]: the first h groups partitioned
        for h in range(groups):
            best[h + 1] = float(np.max(best[:h + 1] + value[:h + 1, h]))
        return float(best[-1])

    def mean(self, factor: float) -> float:
        """A certified lower bound on the mean objective of every schedule at `factor`."""
        return self.total(factor) / self.requests if self.requests else 0.0


def window_bounds(instance: Instance, objective) -> WindowBounds:
    """The windows' LB0 and arrival spreads (see the module docstring) of `instance`'s requests."""
    objective = Objective.parse(objective)
    n = len(instance)
    order = np.argsort(instance.arrivals, kind="stable")
    arrivals = instance.arrivals[order]
    starts = np.unique(np.linspace(0, n, min(n, MAX_GROUPS) + 1).astype(int))[:-1] if n else np.zeros(0, int)
    groups = len(starts)

    def window_sums(per_request: np.ndarray) -> np.ndarray:  # [g, h]: sum over groups g..h
        c = np.concatenate([[0.0], np.cumsum(np.add.reduceat(per_request, starts))]) if groups else np.zeros(1)
        return c[None, 1:] - c[:-1, None]

    at_zero = window_sums(time_alone(instance, objective)[order])  # each request alone
    for share in share_vectors(instance, objective)[:, order]:
        pairs = _group_min_sums(share, starts)  # [g, h]: sum over i in g, m in h of min(s_i, s_m)
        cum = np.zeros((groups + 1, groups + 1))
        cum[1:, 1:] = pairs.cumsum(0).cumsum(1)
        diag = np.diag(cum)
        # sum over i, m in groups g..h of min(s_i, s_m)
        both = diag[None, 1:] - cum[:-1, 1:] - cum[1:, :-1].T + diag[:-1, None]
        at_zero = np.maximum(at_zero, (both + window_sums(share)) / 2)
    first = arrivals[starts] if groups else np.zeros(0)
    spread = window_sums(arrivals) - window_sums(np.ones(n)) * first[:, None]
    upper = np.triu(np.ones((groups, groups), dtype=bool))
    # windows run forwards only: g > h is no window
    return WindowBounds(np.where(upper, at_zero, -np.inf), np.where(upper, spread, 0.0), n)


def _group_min_sums(share: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """[g, h] = sum over requests i of group g and m of group h of min(share_i, share_m)."""
    groups = len(starts)
    if groups == len(share):  # one request a group
        return np.minimum(share[:, None], share[None, :])
    out = np.empty((groups, groups))
    ends = np.append(starts[1:], len(share))
    rows = max(1, 2_000_000 // max(1, len(share)))  # requests per chunk: ~16 MB of temporaries
    g = 0
    while g < groups:  # whole groups per chunk, at least one
        h = g + 1
        while h < groups and ends[h] - starts[g] <= rows:
            h += 1
        block = np.minimum(share[starts[g]:ends[h - 1], None], share[None, :])
        by_column = np.add.reduceat(block, starts, axis=1)
        out[g:h] = np.add.reduceat(by_column, starts[g:h] - starts[g], axis=0)
        g = h
    return out


def share_vectors(instance: Instance, objective: Objective, keep: int = KEEP_VECTORS) -> np.ndarray:
    """The capacity share vectors (rows; `completion_order_bounds`' shares: intercept x (lambda KV share +
    (1 - lambda) tokens / C) + least work, for every KV share and lambda), the `keep` strongest with every
    request at once (the largest sum over k of the k smallest shares). Any of them gives a bound, so
    keeping some is only a choice of strength against time."""
    kv_shares, work, tokens, capacity_tokens = request_shares(instance, objective)
    lams = np.linspace(0.0, 1.0, LAMBDA_STEPS)[:, None]
    rows = np.concatenate([instance.cost.intercept * (lams * kv + (1 - lams) * tokens / capacity_tokens) + work
                           for kv in kv_shares]) if len(instance) else np.zeros((0, 0))
    at_once = np.sort(rows, axis=1).cumsum(axis=1).sum(axis=1) if len(instance) else np.zeros(0)
    return rows[np.argsort(-at_once, kind="stable")[:keep]]


class OneMachine:
    """The one-machine relaxation of `one_machine_completions` for every rate factor: request i, released
    at a_i / f, needs `share` units of one preemptive unit-speed machine (one vector per lambda and KV
    share); shortest remaining processing time first minimises the total flow time sum (M_i - a_i / f),
    and every schedule's sum of C_i - a_i / f is at least it."""

    def __init__(self, instance: Instance, objective: Objective, keep: int = KEEP_VECTORS):
        order = np.argsort(instance.arrivals, kind="stable")
        self.arrivals = instance.arrivals[order]
        self.shares = list(share_vectors(instance, objective, keep)[:, order])

    def flow(self, factor: float, which: int) -> float:
        released = self.arrivals / factor
        return float(srpt_completions(released, self.shares[which]).sum() - released.sum())

    def best_flow(self, factor: float) -> tuple[float, int]:
        return max((self.flow(factor, k), k) for k in range(len(self.shares)))


@dataclass
class CapacityBound:
    """`factor`: every schedule's mean objective exceeds `limit` at this rate factor and every larger
    one (None: not shown for any factor up to 2^20); `covered_by` says which argument covers which
    factors."""
    factor: float | None
    limit: float
    objective: str
    covered_by: str
    seconds: float

    def to_json(self) -> dict:
        return {"factor": self.factor, "limit": self.limit, "objective": self.objective,
                "covered_by": self.covered_by, "seconds": self.seconds}


def capacity_upper_bound(instance: Instance, objective, limit: float, *, rel_tol: float = REL_TOL,
                         windows: WindowBounds | None = None) -> CapacityBound:
    """A rate factor F at and above which no schedule of `instance` has its mean `objective` within
    `limit` seconds (module docstring): the windows cover [F_w, inf) by monotonicity; below F_w the
    one-machine relaxation covers [g, g c) from each factor g it is evaluated at, c = its flow at g /
    (N limit) (stretching the relaxation's schedule at f by f / g gives one at g, so its flow at f is
    at least g / f times its flow at g); F is where that chain of intervals, walked up from the least
    factor the relaxation exceeds the limit at, reaches F_w unbroken."""
    t0 = time.perf_counter()
    objective = Objective.parse(objective)
    if not objective.is_mean:
        raise ValueError(f"the capacity bound is for the mean objectives, not {objective.name}")
    n = len(instance)
    windows = windows if windows is not None else window_bounds(instance, objective)
    name = objective.name.lower()

    def done(factor, how):
        return CapacityBound(factor, limit, name, how, round(time.perf_counter() - t0, 3))

    windows_from = _least_factor(lambda f: windows.mean(f) > limit, LOWEST, HIGHEST, rel_tol)
    if windows_from is None:
        return done(None, "no factor up to 2^20: the windows bound stays within the limit with every request at once")
    machine = OneMachine(instance, objective)
    target = limit * n
    start = _least_factor(lambda f: machine.best_flow(f)[0] > target, LOWEST, windows_from, rel_tol)
    if start is None:
        return done(windows_from, f"windows of arrivals from {windows_from:.6g}")
    g, which = start, machine.best_flow(start)[1]
    while g < windows_from and not windows.mean(g) > limit:
        stretch = machine.flow(g, which) / target
        if stretch < 1 + rel_tol:  # this vector is nearly spent here: the best one, or the chain breaks
            flow, which = machine.best_flow(g)
            stretch = flow / target
        if stretch < 1 + rel_tol:
            start = g = g * (1 + rel_tol)  # not covered near g: the certified factor starts above it
            continue
        g *= stretch * (1 - 1e-9)  # [g, g stretch) is covered; the next interval starts inside it
    if start >= windows_from:
        return done(windows_from, f"windows of arrivals from {windows_from:.6g}")
    return done(start, f"the one-machine relaxation on [{start:.6g}, {min(g, windows_from):.6g}), "
                       f"windows of arrivals from {min(g, windows_from):.6g}")


def _least_factor(exceeds, low: float, high: float, rel_tol: float) -> float | None:
    """The least factor in [low, high] (to `rel_tol`, from above) where `exceeds`, assuming it stays true
    above: None where it does not hold at `high`."""
    if not exceeds(high):
        return None
    if exceeds(low):
        return low
    lo, hi = math.log(low), math.log(high)
    while hi - lo > math.log1p(rel_tol):
        mid = (lo + hi) / 2
        if exceeds(math.exp(mid)):
            hi = mid
        else:
            lo = mid
    return math.exp(hi)
