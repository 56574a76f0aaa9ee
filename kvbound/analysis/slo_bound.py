"""A certified upper bound on SLO attainment: the prefill-deadline relaxation (issue 35, item 3).

A request attains the SLO (`Slo`: TTFT <= S and its own P99 TBT <= S', `Replay.slo_attained`) only if

(a) it could attain it alone (`alone_attainable`: its fewest batches' intercepts and its first
    prefill's least work within S; when O >= 2, one batch with the least work of one of its later
    tokens within S', since a percentile of its gaps is at least the smallest gap); and
(b) its first token, so every batch that carries a chunk of its first prefill, lies in the window
    [a_i, a_i + S] (the batches start at or after its arrival and end by its first token).

**The one-machine relaxation of (b).** Give request i in every batch B that carries a chunk of its
first prefill (prefill-type, n = 0; chunks before an eviction included) the share

    x_i(B) = intercept * (lam * kv_i(B) + (1 - lam) * c_i(B) / P) + work_i(B)

with c_i(B) its tokens in B, work_i(B) what it adds to B's time beside the intercept
(`CostModel.work`) and kv_i(B) its weight of the KV items of its prefill that lie in B (the KV it
holds there over M rounded to blocks, or one of the dual-feasible weights of those items,
`kv_items` / `kv_weights` for first tokens). In one batch the prefill-type tokens add to at most P,
the items' weights to at most 1 and the works to the batch's time less the intercept and the convex
token term (>= 0), so the shares of the requests in B add to at most T(B). Over i's first prefill
they add to at least p_i = intercept * (lam * K_i + (1 - lam) * I_i / P) + W_i: the chunks after its
last eviction process its whole prompt from nothing cached (their attention telescopes to I_i^2,
`alone.prefill_work`; chunks before an eviction only add), and its KV items sum to K_i. These are
`bounds.analytic.request_shares(instance, MEAN_TTFT)`, the shares of the mean-TTFT completion bounds.

Lay each batch's shares side by side inside [start(B), end(B)]: a preemptive schedule of one
unit-speed machine on which each request that meets its TTFT receives p_i within its window
[a_i, a_i + S] (tolerances below). So the on-time requests form a set that is feasible on one
preemptive machine with release dates a_i, deadlines a_i + S and sizes p_i.

**The largest such set** is found exactly (`max_on_time`): every window has the same length S, so
release and deadline orders agree; preemptive earliest-deadline-first, optimal for feasibility
(Horn 1974), then never preempts (a job released later has a deadline no earlier), so a set is
feasible iff it meets its deadlines run first-come first-served without preemption; and the
largest first-come-first-served-feasible subset follows from the dynamic programme over the jobs
in release order that keeps, for each count k, the earliest end of k on-time jobs (Kise, Ibaraki and
Mine 1978: 1 | r_j | sum U_j with agreeable dates). Every lam in [0, 1] and every KV weighting gives
a valid relaxation; the least count over them counts.

The bound: (the largest on-time set among the requests of (a)) / N, the least over the share
variants; never above `headroom.slo_alone_bound` (the share of (a)).

**TBT** adds only condition (a): with Apt-Serve's P99 of a request's own gaps (numpy's linear
interpolation), a request with g >= 101 gaps may leave its largest gap (or more) unconstrained, so
its decodes can be postponed and need not lie in any window; the requests with fewer gaps are left
out of the machine too (a stronger bound could add their decode shares over [a_i, a_i + S + D_i]).

Tolerances (an upper bound may only err upwards): the validator lets a batch start 1e-9 relative
before an arrival and `slo_attained` allows 1e-9 relative over S; the windows here are widened by
1e-6 S and 2e-9 (1 + the latest arrival + S) at each end, and the sizes shrunk by 1e-9 relative.
docs/analysis.md, "kvbound headroom", states the same.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..alone import time_alone, token_work
from ..bounds.analytic import request_shares
from ..objective import Objective
from ..schedule import Slo
from ..workload import Instance

#: the lam values tried (as the completion bounds do)
LAM_STEPS = 11
#: relative slack on S and S' (generous: an upper bound may only err upwards)
SLACK = 1e-6


@dataclass
class SloBound:
    """The bound and where it comes from."""

    attainment: float  # the upper bound on the share of requests within the SLO
    on_time: int  # the most requests that can meet the SLO (the numerator)
    requests: int  # N
    alone: int  # the requests that could attain the SLO alone (condition (a))
    share: str  # the share variant that gave the least count ("" when the machine does not bind)

    @property
    def alone_attainment(self) -> float:
        return self.alone / self.requests if self.requests else 1.0


def alone_attainable(instance: Instance, slo: Slo) -> np.ndarray:
    """Per request, condition (a): its least TTFT alone (fewest batches' intercepts and its first
    prefill's least work) <= S and, when O >= 2, its least gap (one batch: the intercept and the
    least work of one of its later tokens) <= S'. `headroom.slo_alone_bound` is its mean."""
    ok = time_alone(instance, Objective.MEAN_TTFT) <= slo.ttft * (1 + SLACK)
    cost = instance.cost
    for i, r in enumerate(instance.requests):
        if ok[i] and r.output >= 2:
            ok[i] = cost.intercept + float(token_work(r, cost)[1:].min()) <= slo.tbt * (1 + SLACK)
    return ok


def max_on_time(releases: np.ndarray, deadlines: np.ndarray, sizes: np.ndarray) -> int:
    """The most jobs that meet their deadlines on one preemptive unit-speed machine, for release dates
    and deadlines in the same order (a_i <= a_j implies d_i <= d_j; checked).

    Then first-come first-served without preemption is as good as any schedule (module docstring),
    and the dynamic programme over the jobs in release order keeps best[k], the earliest end of the
    last of k on-time jobs chosen so far: job j ends at max(best[k], r_j) + p_j and may join if that is
    <= d_j. Jobs whose windows chain into a group are solved group by group (independent: a group
    ends before the next one's first release)."""
    releases, deadlines, sizes = (np.asarray(v, dtype=float) for v in (releases, deadlines, sizes))
    order = np.lexsort((deadlines, releases))
    r, d, p = releases[order], deadlines[order], sizes[order]
    if len(d) > 1 and np.any(np.diff(d) < 0):
        raise ValueError("max_on_time needs release dates and deadlines in the same order")
    total, start = 0, 0
    n = len(r)
    while start < n:
        end = start + 1
        while end < n and r[end] < d[end - 1]:  # d is non-decreasing: d[end - 1] is the group's latest
            end += 1
        total += _group_on_time(r[start:end], d[start:end], p[start:end])
        start = end
    return total


def _group_on_time(r: np.ndarray, d: np.ndarray, p: np.ndarray) -> int:
    t = -np.inf  # quick exit: all of them meet their deadlines first-come first-served
    for rj, dj, pj in zip(r, d, p):
        t = max(t, rj) + pj
        if t > dj:
            break
    else:
        return len(r)
    best = np.full(len(r) + 1, np.inf)
    best[0] = -np.inf
    top = 0  # best[k] is finite for k <= top
    for rj, dj, pj in zip(r, d, p):
        cand = np.maximum(best[:top + 1], rj) + pj
        ok = cand <= dj
        upd = np.where(ok, np.minimum(best[1:top + 2], cand), best[1:top + 2])
        best[1:top + 2] = upd
        if ok[top]:
            top += 1
    return top


def slo_bound(instance: Instance, slo: Slo, lam_steps: int = LAM_STEPS) -> SloBound:
    """The bound with its parts (module docstring)."""
    n = len(instance)
    if not n:
        return SloBound(1.0, 0, 0, 0, "")
    alone = alone_attainable(instance, slo)
    k_alone = int(alone.sum())
    if k_alone <= 1:
        return SloBound(k_alone / n, k_alone, n, k_alone, "")
    cand = np.flatnonzero(alone)
    a = instance.arrivals[cand].astype(float)
    tol = 2e-9 * (1.0 + float(np.abs(instance.arrivals).max()) + slo.ttft)
    releases = a - tol
    deadlines = a + slo.ttft * (1 + SLACK) + tol
    kv_shares, work, tokens, capacity_tokens = request_shares(instance, Objective.MEAN_TTFT)
    cost = instance.cost
    best, source = k_alone, ""
    for v, kv in enumerate(kv_shares):
        for lam in np.linspace(0.0, 1.0, lam_steps):
            if v and lam == 0.0:
                continue  # the same sizes as the area variant's lam = 0
            p = cost.intercept * (lam * kv[cand] + (1 - lam) * tokens[cand] / capacity_tokens) + work[cand]
            k = max_on_time(releases, deadlines, p * (1 - 1e-9))
            if k < best:
                name = "KV area / M" if v == 0 else f"dual-feasible KV weights {v}"
                best, source = k, f"lam = {lam:g}, {name}"
    return SloBound(best / n, best, n, k_alone, source)


def slo_attainment_upper_bound(instance: Instance, slo: Slo) -> float:
    """A certified upper bound on the share of requests any schedule of `instance` keeps within `slo`
    (TTFT <= slo.ttft and own P99 TBT <= slo.tbt): `slo_bound(...).attainment`."""
    return slo_bound(instance, slo).attainment
