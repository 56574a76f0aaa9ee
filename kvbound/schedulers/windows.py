"""Window schedules for mean latency with every request arriving together: each request starts at a
planned batch and then runs every batch until it finishes (its *window*), and the plan comes from a
relaxation that sees who waits for whose work (docs/formulation.md, "Window schedules").

With every request at 0, request i's latency is k0 b_i plus all the work done in batches 1..b_i (b_i:
its completion batch). Moving each request's tokens to the last O_i batches before b_i only lowers the
count of unfinished requests that waits for them, so for completion batches b the least total latency
is at least

    F(b) = k0 sum_i b_i + sum_j n_j W_j,   n_j = #{r : b_r >= j},   W_j = sum_i w_i(j - b_i + O_i),

with w_i(k) the least work of request i's k-th token (`alone.token_work`; its prefill in the first).
`plan_windows` searches b for a low F (a local search: one request's b moved at a time, each move
priced on the batches it touches); its minimum is not a bound (a local search does not prove one),
only a plan: on the real traces' all-at-0 cases F's local minima are 1-4% below the best schedules
found before (bench/results/NOTES.md, "window schedules"), and the best plans leave most requests
together from the first batch and defer the ones whose prefills would hold up many others.

`build_windows(instance, starts, constraints)` turns planned start batches into a schedule: every
batch decodes the running requests, then gives its token budget to the released prefills in the
plan's order (chunked where allowed), admitting a request only while the peaks (I + O - 1) of the
admitted ones fit M (no evictions). Every batch goes through `ReplayState.apply`, so the schedule is
valid by construction; the search (`kvbound.solvers.phases.windows`) moves the starts.
"""
from __future__ import annotations

import numpy as np

from ..alone import TokenWindows
from ..constraints import Constraints
from ..deadline import Deadline
from ..schedule import Batch, ReplayState, Schedule, ScheduleError
from ..workload import Instance

#: the shifts of one request's completion batch the plan's local search tries
SHIFTS = (1, 2, 5, 10, 20, 50, 100, 200)


class WindowPlan:
    """F of the relaxation above, kept per batch so that one request's move is priced on the batches
    it touches (O(O_i + shift) instead of the whole plan)."""

    def __init__(self, instance: Instance, completion=None):
        s = instance.system
        windows = TokenWindows(instance)
        self.k0, self.work, self.output, self.fewest = windows.k0, windows.work, windows.output, windows.fewest
        # the builder admits a request only while the peaks of the admitted ones fit M: the plan keeps
        # the peaks of the windows (prefill chunks included) that cover a batch within M too
        self.peak = np.array([s.blocks(r.peak_kv) for r in instance.requests], dtype=float)
        self.M = s.kv_capacity
        self.tight = self.peak.sum() > self.M
        want = self.fewest if completion is None else np.maximum(np.asarray(completion, dtype=np.int64), self.fewest)
        # room for every request one after the other after the latest wanted batch: each placement fits
        size = int(want.max(initial=0) + self.fewest.sum()) + 2
        self.n = np.zeros(size)  # n[j]: requests with b >= j (batches 1..)
        self.W = np.zeros(size)  # W[j]: the least work the windows put in batch j
        self.R = np.zeros(size)  # R[j]: the peaks of the windows that cover batch j
        self.b = np.zeros(len(instance), dtype=np.int64)
        for i in np.lexsort((np.arange(len(instance)), want)):  # earliest first, each where its peak fits
            b = self._earliest(i, int(want[i]))
            self.b[i] = b
            self.n[1:b + 1] += 1
            self.W[b - self.output[i] + 1:b + 1] += self.work[i]
            self.R[b - self.fewest[i] + 1:b + 1] += self.peak[i]
        self.value = self.k0 * float(self.b.sum()) + float(self.n @ self.W)

    def _earliest(self, i: int, at: int) -> int:
        """The first completion batch >= `at` whose window keeps the peaks within M (placed requests only)."""
        if not self.tight:
            return at
        span = int(self.fewest[i])
        ok = (self.R[1:] + self.peak[i] <= self.M).astype(np.int64)  # batch j at ok[j - 1]
        runs = np.convolve(ok, np.ones(span, dtype=np.int64), mode="valid")  # runs[k]: batches k+1..k+span
        ends = np.flatnonzero(runs[max(0, at - span):] == span)
        return int(ends[0] + max(0, at - span) + span)  # the array leaves room for one

    def starts(self) -> np.ndarray:
        """The batch each request's window starts: its first token's batch (b - O + 1) less the
        prefill's further chunks."""
        return self.b - self.fewest + 1

    def delta(self, i: int, y: int) -> float:
        """F after moving request i's completion batch to y, less F now (inf where the peaks would not fit M)."""
        x, o, span = int(self.b[i]), int(self.output[i]), int(self.fewest[i])
        if self.tight:
            lo = min(x, y) - span + 1
            R2 = self.R[lo:max(x, y) + 1].copy()
            R2[x - span + 1 - lo:x + 1 - lo] -= self.peak[i]
            if R2[y - span + 1 - lo:y + 1 - lo].max() + self.peak[i] > self.M:
                return np.inf
        lo, hi = min(x, y) - o + 1, max(x, y) + 1
        n, W = self.n[lo:hi], self.W[lo:hi]
        n2, W2 = n.copy(), W.copy()
        if y > x:
            n2[x + 1 - lo:y + 1 - lo] += 1
        else:
            n2[y + 1 - lo:x + 1 - lo] -= 1
        W2[x - o + 1 - lo:x + 1 - lo] -= self.work[i]
        W2[y - o + 1 - lo:y + 1 - lo] += self.work[i]
        return self.k0 * (y - x) + float(n2 @ W2 - n @ W)

    def move(self, i: int, y: int, gain: float | None = None) -> None:
        """Move request i's completion batch to y; `gain`: `delta(i, y)` where the caller has it."""
        x, o = int(self.b[i]), int(self.output[i])
        self.value += self.delta(i, y) if gain is None else gain
        if y > x:
            self.n[x + 1:y + 1] += 1
        else:
            self.n[y + 1:x + 1] -= 1
        self.W[x - o + 1:x + 1] -= self.work[i]
        self.W[y - o + 1:y + 1] += self.work[i]
        span = int(self.fewest[i])
        self.R[x - span + 1:x + 1] -= self.peak[i]
        self.R[y - span + 1:y + 1] += self.peak[i]
        self.b[i] = y

    def improve(self, deadline: Deadline | None = None, seed: int = 0) -> float:
        """Local search: each request in turn takes the best of its shifts (`SHIFTS`, either way, never
        below its fewest batches) where F drops; until no request moves or the deadline. Returns F."""
        rng = np.random.default_rng(seed)
        top = len(self.n) - 1
        moved = True
        while moved:
            moved = False
            for i in rng.permutation(len(self.b)):
                if deadline is not None and deadline.expired():
                    return self.value
                x = int(self.b[i])
                best, to = -1e-12 * max(1.0, abs(self.value)), x
                for d in SHIFTS:
                    for y in (x - d, x + d):
                        if self.fewest[i] <= y <= top:
                            gain = self.delta(i, y)
                            if gain < best:
                                best, to = gain, y
                if to != x:
                    self.move(i, to, best)
                    moved = True
        return self.value


def completion_batches(schedule: Schedule) -> np.ndarray:
    """Each request's completion batch in `schedule`, counting the batches that process a token (F's
    batch index): a schedule's own plan, from which the local search can start."""
    done = np.zeros(len(schedule.requests), dtype=np.int64)
    j = 0
    for batch in schedule.batches:
        if not batch.tokens:
            continue
        j += 1
        for i in batch.tokens:
            done[i] = j  # the last batch that processes i is its completion batch
    return done


def plan_windows(instance: Instance, completion=None, deadline: Deadline | None = None, seed: int = 0) -> WindowPlan:
    """A low-F plan from `completion` (each request's completion batch; default: its fewest batches,
    every request starting at once)."""
    plan = WindowPlan(instance, completion)
    plan.improve(deadline, seed)
    return plan


def build_windows(instance: Instance, starts, constraints: Constraints = Constraints()) -> Schedule | None:
    """The schedule of planned start batches (`starts[i]`, counting batches that process tokens from 1),
    or None where it cannot finish under `constraints` or the instance (a request whose peak alone does
    not fit M). Each batch: the running requests decode; then the requests whose start has come, in
    order of start (ties: id), take prefill tokens within C and P (whole prompts only under
    no_chunk), a new one only while its peak fits beside the admitted ones' peaks; where nothing runs
    and no start has come, the next start is brought forward."""
    if constraints.no_hybrid or constraints.admission_order is not None:
        return None
    s = instance.system
    C, P, M = s.max_batch_tokens, s.max_prefill_tokens, s.kv_capacity
    cap = constraints.max_batch_size or len(instance)
    peak = [s.blocks(r.peak_kv) for r in instance.requests]
    if any(p > M for p in peak):
        return None
    starts = [int(x) for x in starts]
    queue = sorted(range(len(instance)), key=lambda i: (starts[i], i))  # not yet admitted
    admitted: list[int] = []  # admitted, prefill not done (in order)
    st = ReplayState(instance)
    batches: list[Batch] = []
    reserved, j = 0, 0
    together = max(st.arrival, default=0.0)  # every request arrives then (the plan's premise)
    if min(st.arrival, default=0.0) != together:
        return None
    while st.unfinished:
        j += 1
        if not st.decoding and not admitted and queue and starts[queue[0]] > j:
            j = starts[queue[0]]
        tokens: dict[int, int] = {}
        for i in st.decoding:
            if len(tokens) >= cap:
                break
            tokens[i] = 1
        used, pused = len(tokens), 0
        while queue and starts[queue[0]] <= j and reserved + peak[queue[0]] <= M:
            i = queue.pop(0)
            admitted.append(i)
            reserved += peak[i]
        for i in admitted:
            room = min(C - used, P - pused)
            if room <= 0 or len(tokens) >= cap:
                break
            need = st.prompt[i] + st.n[i] - st.m[i]
            c = min(need, room)
            if c < need and constraints.no_chunk:
                continue
            tokens[i] = c
            used += c
            pused += c
        if not tokens:
            return None  # nothing can run (the constraints leave no room): not a window schedule
        batch = Batch(tokens, start=together if not batches and together > 0 else None)
        try:
            st.apply(batch)
        except ScheduleError:
            return None
        batches.append(batch)
        admitted = [i for i in admitted if st.n[i] == 0]
        for i in st.done:
            reserved -= peak[i]
    return Schedule(instance.requests, batches)
