"""The window-rank bound: mean latency with every request arriving together (issue 33).

F (docs/formulation.md, "Window schedules") prices a schedule by its completion batches b: each
request's least token work in its last O_i batches, each token waited for by every request not yet
finished in its batch, plus k0 per batch for each. Its minimum over b is a bound but a quadratic
problem; this bound relaxes it to an assignment. The request completing k-th waits, in each batch j of
its window, for at most k - 1 requests finished before j, and for at most K_j = #{r : fewest_r < j}
(no request finishes before its fewest batches); its completion batch is at least the k-th smallest
fewest batches, and at least the batches any k requests need for their tokens and KV
(`kv_items.CompletionFloor`: how M and C enter, which F itself leaves out; K_j then counts only the
ranks whose larger earliest batch of the two is below j). So pricing request i at rank k by its best
completion batch under those counts, and assigning ranks to requests (scipy's
`linear_sum_assignment`), gives a bound on F's minimum and hence on the optimal total latency ("The
window-rank bound" in docs/formulation.md derives it).

K counts a request as finished from its fewest batches on even where the assignment completes it
much later (the longest prompts, deferred): that is most of what the first assignment loses. So the
bound then splits the space of completion batches (a branch and bound over F's minimum): the region
with the lowest assignment is split on the request K misreads most, at the batch halfway between its
earliest and the assignment's, into "completes at that batch or later" (K counts it from there) and
"completes before it"; the least assignment over the open regions is the bound, rising as they split.
On 30 conversation requests: 0.843 s for the first assignment, 0.918 s after 30 s of splits (best
schedule 0.934 s).

Ranks are priced in at most `RANK_CLASSES` classes of consecutive ranks, a class at its last rank's
count and its first rank's batch (weaker, still a bound), so that 1,000 requests take seconds. Where the
deadline comes first, the requests not yet priced keep a cheap row (their fewest batches' intercepts and
their work waited for by the requests of higher rank): still a bound.
"""
from __future__ import annotations

import heapq
import math
import time

import numpy as np

from ..alone import TokenWindows
from ..deadline import Deadline
from ..workload import Instance
from .base import Bound, Stage, register, rises
from .kv_items import CompletionFloor

NAME = "windows by completion rank: each token waited for by every request that cannot have finished"
#: the most rank classes the costs are computed for (1,000 requests: classes of 3-4 ranks)
RANK_CLASSES = 300
#: above this many requests the assignment (requests x ranks, dense) is not built
MOST_REQUESTS = 2000
#: the value is lowered by this share for the floating point (FFT convolutions, sums of the counts)
SAFETY = 1e-9
#: without a time limit the branching stops after this many seconds
UNLIMITED_SECONDS = 30.0
#: the branching stops where the open regions hold more than this many completion-batch limits
MOST_OPEN_ENTRIES = 20_000_000
#: the open regions keep their cost tables (for their early children) up to this many entries in all
#: (16 bytes each with the completion batches)
STORED_ENTRIES = 10_000_000


def rank_classes(n: int, most: int = RANK_CLASSES) -> list[tuple[int, int]]:
    """Consecutive rank ranges (first, last), 1-based, at most `most` of them, covering 1..n."""
    edges = np.linspace(0, n, min(n, most) + 1).round().astype(int)
    return [(int(a) + 1, int(z)) for a, z in zip(edges[:-1], edges[1:]) if z > a]


def rank_costs(instance: Instance, classes: list[tuple[int, int]], deadline=None, earliest=None,
               latest=None, windows: TokenWindows | None = None, reuse=None, floor=None
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """cost[i, c]: a lower bound on request i's k0 b_i plus its window's work times the counts waiting
    for it, over every rank k in class c, for the completion batches earliest_i <= b_i <= latest_i
    (default: its fewest batches, no latest; inf where none fits the class); when[i, c], the completion
    batch that attains it; and how many rows were priced before the deadline (the rest keep the cheap
    row). `reuse` = (cost, when, i): the same for the same earliest batches, where only request i's
    latest batch differs: only its row is priced again. `floor[k - 1]`: batches by which no k requests
    can all have completed (`kv_items.CompletionFloor`); the k-th completion is at least it."""
    win = windows or TokenWindows(instance)
    n, k0, work, output = win.n, win.k0, win.work, win.output
    fewest = win.fewest if earliest is None else np.maximum(win.fewest, earliest)
    latest = np.full(n, np.iinfo(np.int64).max // 4) if latest is None else np.asarray(latest, dtype=np.int64)
    ordered = np.sort(fewest) if floor is None else np.maximum(np.sort(fewest), floor)
    top_output, top_fewest = int(output.max()), int(ordered[-1])
    first = np.array([a for a, _ in classes])
    cap = np.array([z for _, z in classes]) - 1  # at most this many finished before any batch of the window
    lo = ordered[first - 1]  # the class's first rank completes no earlier than the k-th smallest fewest
    split = ordered[cap] + 1  # from this batch on, K_j > cap: the count is N - cap
    mult = (n - cap).astype(float)
    # G[j + off] = N - K_j, K_j = #{fewest <= j - 1}; N for j <= 0 (the padding only reached by unused lanes)
    off = top_output
    j = np.arange(-off, top_fewest + top_output + 2)
    counts = n - np.searchsorted(ordered, j - 1, side="right")
    G = counts.astype(float)
    sums = _Sums(counts, j, off)
    # the cheap rows: the earliest batch that fits, every count at least N - cap
    when = np.maximum(fewest[:, None], lo[None, :])
    total = np.array([float(w.sum()) for w in work])
    table = np.where(when <= latest[:, None], k0 * when + mult[None, :] * total[:, None], np.inf)
    rows = range(n)
    if reuse is not None:
        r = reuse[2]
        cheap, cheap_when = table[r], when[r]
        table, when, rows = reuse[0].copy(), reuse[1].copy(), [r]
        table[r], when[r] = cheap, cheap_when
    priced = 0
    for i in rows:
        if deadline is not None and deadline.expired():
            break
        table[i], when[i] = _row(work[i], int(output[i]), int(fewest[i]), int(latest[i]), k0, G, sums, top_fewest,
                                 lo, split, mult)
        priced += 1
    return table, when, priced


class _Sums:
    """Prefix sums of the counts G_u and of u G_u (exact integers), so that a window whose later tokens'
    work is affine in their position is weighted in O(1)."""

    def __init__(self, counts: np.ndarray, batches: np.ndarray, off: int):
        self.off = off
        self.G = np.r_[0, np.cumsum(counts)]
        self.U = np.r_[0, np.cumsum(batches * counts)]

    def window(self, prefill: float, a: float, b: float, s, p):
        """sum_{q < p} w_q G_{s+q} for w_0 = prefill and w_q = a + b q (q >= 1); s, p arrays, p >= 1."""
        lo, hi = s + 1 + self.off, s + p + self.off
        g = (self.G[hi] - self.G[lo]).astype(float)
        u = (self.U[hi] - self.U[lo]).astype(float)
        return prefill * (self.G[lo] - self.G[lo - 1]) + a * g + b * (u - s * g)


def _affine(w: np.ndarray):
    """(a, b) with a + b q <= w_q for every later token q >= 1, where that line is w itself to rounding
    (decodes: per_token + decode_kv x cached); None where it is not (a refill cheaper than a decode)."""
    q = np.arange(1, len(w))
    if len(q) == 0:
        return 0.0, 0.0
    b = (w[-1] - w[1]) / (len(w) - 2) if len(w) > 2 else 0.0
    rest = w[1:] - b * q
    a = float(rest.min())
    if float((rest - a).max()) > 1e-12 * float(np.abs(w).max()):
        return None
    return a, b


def _row(w, o, few, last, k0, G, sums, top_fewest, lo, split, mult) -> np.ndarray:
    """One request's costs over the classes: the least over completion batches max(few, lo_c) <= t <= last
    of k0 t plus its window's work, batch j of the window weighted max(N - cap_c, G_j)."""
    cw = np.r_[0.0, np.cumsum(w)]
    W = cw[-1]
    t = np.arange(few, min(top_fewest + o, last) + 1)  # beyond top_fewest + o every count is N - cap: t rises
    if len(t) == 0:
        return np.full(len(lo), np.inf), np.full(len(lo), few)
    s0 = few - o + 1
    line = _affine(w)
    if line is not None:  # the window's later tokens as a line: prefix sums, no convolution
        A = sums.window(float(w[0]), *line, t - o + 1, np.full(len(t), o))
    else:
        A = _correlate(G[s0 + sums.off: t[-1] + 1 + sums.off], w)  # A[t - few]: the window ending at t
    base = k0 * t + A
    lo_i = np.maximum(lo, few)
    when = np.maximum(lo_i, split + o - 1)  # the window wholly where the count is N - cap
    best = np.where(when <= last, k0 * when + mult * W, np.inf)
    at = _range_argmin(base, lo_i - few, np.minimum(split - 1, last) - few)  # wholly before the split batch
    has = at >= 0
    better = has & (base[np.maximum(at, 0)] < best)
    best = np.where(better, base[np.maximum(at, 0)], best)
    when = np.where(better, at + few, when)
    if o > 1:
        # windows across the split batch J: p of its tokens before J (1..o-1), the completion t = J + o - 1 - p
        Js = np.unique(split)
        p = np.arange(1, o)
        if line is not None:
            R = sums.window(float(w[0]), *line, Js[:, None] - p[None, :], np.broadcast_to(p, (len(Js), o - 1)))
        else:
            from scipy.signal import fftconvolve  # here: the import costs 0.35 s, and decodes never need it

            back = (Js[:, None] - 1 - np.arange(o - 1)[None, :]) + sums.off  # G[J - 1 - u], u = 0..o-2
            R = fftconvolve(np.broadcast_to(w[:o - 1], back.shape), G[back], axes=1)[:, :o - 1]  # R[J, p - 1]
        tt = split[:, None] + o - 1 - p[None, :]  # per class and p
        vals = k0 * tt + R[np.searchsorted(Js, split)] + mult[:, None] * (W - cw[1:o])[None, :]
        vals[(tt < lo_i[:, None]) | (tt > last)] = np.inf
        m = vals.argmin(axis=1)
        across = vals[np.arange(len(split)), m]
        better = across < best
        best = np.where(better, across, best)
        when = np.where(better, tt[np.arange(len(split)), m], when)
    return best, when


def _correlate(segment: np.ndarray, w: np.ndarray) -> np.ndarray:
    """out[m] = sum_q w[q] segment[m + q] (each full window)."""
    if len(w) <= 64:
        return np.convolve(segment, w[::-1], mode="valid")
    from scipy.signal import fftconvolve

    return fftconvolve(segment, w[::-1], mode="valid")


def _range_argmin(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The index of min(values[lo[c]..hi[c]]) per c (-1 where the range is empty), by a sparse table."""
    lo = np.maximum(lo, 0)
    hi = np.minimum(hi, len(values) - 1)
    out = np.full(len(lo), -1, dtype=np.int64)
    ok = hi >= lo
    if not ok.any():
        return out
    levels = [np.arange(len(values))]  # levels[k][a]: the argmin of values[a .. a + 2^k - 1]
    while (1 << len(levels)) <= len(values):
        prev, step = levels[-1], 1 << (len(levels) - 1)
        left, right = prev[:-step], prev[step:]
        levels.append(np.where(values[right] < values[left], right, left))
    length = hi[ok] - lo[ok] + 1
    k = np.floor(np.log2(length)).astype(int)
    a, b = lo[ok], hi[ok] - (1 << k) + 1
    ia = np.array([levels[kk][aa] for kk, aa in zip(k, a)])
    ib = np.array([levels[kk][bb] for kk, bb in zip(k, b)])
    out[ok] = np.where(values[ib] < values[ia], ib, ia)
    return out


def window_rank_bound(instance: Instance, deadline: Deadline | None = None, most_classes: int = RANK_CLASSES,
                      on_value=None, most_regions: int | None = None, split_above: float = -math.inf
                      ) -> tuple[float, dict]:
    """The bound on mean latency (seconds) and its details; every request must arrive together.

    The assignment over every completion batch first; then, until the deadline, the region of
    completion batches whose assignment is lowest is split in two on one request's completion batch
    (a branch and bound over F's minimum: the bound is the least over the regions still open, each
    region's assignment counting only requests that can finish before a batch). `on_value(bound)` is
    called with the first assignment and at each rise; `most_regions` caps the regions made (1: the
    first assignment only); where the first assignment is below `split_above` (mean latency, seconds)
    no region is split."""
    # imported here: scipy.optimize takes 0.3 s, which every `kvbound` command would pay at start (and a
    # Ctrl-C in its first half second would wait for the first stage instead of stopping it)
    from scipy.optimize import linear_sum_assignment

    n = len(instance)
    win = TokenWindows(instance)
    floor = CompletionFloor(instance)
    classes = rank_classes(n, most_classes)
    column_class = np.repeat(np.arange(len(classes)), [z - a + 1 for a, z in classes])  # rank -> class
    if deadline is None or not math.isfinite(deadline.remaining()):
        deadline = Deadline(UNLIMITED_SECONDS)

    stored = 0  # table entries kept with the open regions

    def assign(earliest, latest, parent: float, reuse=None):
        """A region's assignment value (at least `parent`, its parent's), each request's completion batch
        in it, how many rows were priced (the rest: cheap rows) and its table, completion batches and
        floor where there is room to keep them. `reuse` = (the parent's kept three, the split request):
        an early child keeps its parent's earliest batches, so its floor, and prices one row again."""
        nonlocal stored
        if reuse is None:
            ranks_floor, repriced = floor(np.maximum(win.fewest, earliest)), None
        else:
            ranks_floor, repriced = reuse[2], (reuse[0], reuse[1], reuse[3])
        table, when, priced = rank_costs(instance, classes, deadline, earliest, latest, win, repriced, ranks_floor)
        if deadline.expired():  # no time for the assignment (1,000 requests: 0.3 s): each row's least, a bound too
            least = table.min(axis=1)
            if not np.isfinite(least).all():
                return math.inf, None, priced, None
            return max(float(least.sum()), parent), when[np.arange(n), table.argmin(axis=1)], priced, None
        full = table[:, column_class]
        try:
            rows, cols = linear_sum_assignment(full)
        except ValueError:  # no assignment of finite costs: no completion batches in the region
            return math.inf, None, priced, None
        value = float(full[rows, cols].sum())
        if not math.isfinite(value):
            return math.inf, None, priced, None
        keep = None
        if stored + table.size <= STORED_ENTRIES:
            keep, stored = (table, when, ranks_floor), stored + table.size
        return max(value, parent), when[rows, column_class[cols]], priced, keep

    earliest = win.fewest.copy()
    latest = np.full(n, np.iinfo(np.int64).max // 4)
    value, when, priced, tables = assign(earliest, latest, -math.inf)
    root = best = value
    if on_value is not None and math.isfinite(root):  # at once: an interrupt from here on keeps it
        on_value(root / n * (1.0 - SAFETY))
    open_regions = [(value, 0, earliest, latest, when, tables)] if math.isfinite(value) else []
    if root / n < split_above:
        most_regions = 1
    made, final = 1, False
    while (open_regions and not deadline.expired() and len(open_regions) * n <= MOST_OPEN_ENTRIES
           and (most_regions is None or made < most_regions)):
        value, _, earliest, latest, when, tables = open_regions[0]
        split = _split(win, earliest, when)
        if split is None:  # every request completes at its earliest batch: K counts the finished ones exactly
            final = True
            break
        heapq.heappop(open_regions)
        if tables is not None:
            stored -= tables[0].size
        r, at = split
        late_lo, early_hi = earliest.copy(), latest.copy()
        late_lo[r] = at  # request r completes at batch `at` or later
        early_hi[r] = at - 1  # or before it
        for lo, hi, reuse in ((late_lo, latest, None),
                              (earliest, early_hi, None if tables is None else (*tables, r))):
            child, child_when, _, child_tables = assign(lo, hi, value, reuse)
            made += 1
            if math.isfinite(child):
                heapq.heappush(open_regions, (child, made, lo, hi, child_when, child_tables))
            elif child_tables is not None:
                stored -= child_tables[0].size
        now = open_regions[0][0] if open_regions else math.inf
        if now > best and math.isfinite(now):
            best = now
            if on_value is not None:
                on_value(best / n * (1.0 - SAFETY))
    details = {"rank_classes": len(classes), "rows_priced": priced, "regions": made, "open": len(open_regions),
               "root": root / n, "converged": final}
    return best / n * (1.0 - SAFETY), details


def _split(win: TokenWindows, earliest: np.ndarray, when: np.ndarray):
    """The request whose count K misreads most in a region's assignment (it is counted as finished from
    its earliest batch on, yet completes at `when`), weighted by the work its windows put in between,
    and the batch halfway that splits its completion batches; None where no request completes after its
    earliest batch (then K is the count of finished requests itself)."""
    late = when > earliest
    if not late.any():
        return None
    profile = np.zeros(int(when.max()) + 2)
    for i in range(win.n):
        o = int(win.output[i])
        profile[when[i] - o + 1:when[i] + 1] += win.work[i]
    total = np.r_[0.0, np.cumsum(profile)]
    misread = np.where(late, total[when + 1] - total[np.minimum(earliest, when) + 1], -1.0)
    r = int(misread.argmax())
    return r, int((int(earliest[r]) + int(when[r]) + 1) // 2)


@register
class WindowRanks:
    """From the instance alone, where every request arrives together and the objective is mean latency."""

    name, stage, share = "window_ranks", Stage.FIRST, 0.2

    def skip_reason(self, known) -> str | None:
        inst = known.instance
        if known.objective.first_token or not known.objective.is_mean:
            return "mean latency only"
        if len(inst) < 2:
            return "none: one request"
        if float(np.ptp(inst.arrivals)) != 0.0:
            return "every request must arrive together"
        if len(inst) > MOST_REQUESTS:
            return f"none above {MOST_REQUESTS} requests (the assignment is dense)"
        return None

    def compute(self, known, deadline) -> list[Bound]:
        began = time.perf_counter()
        offer = rises(known, NAME, "so far: regions still being split")
        # where M binds, F (which leaves M out) starts below the bounds that count KV, and the splits rarely
        # catch up in their share of the time: then the first assignment only
        value, details = window_rank_bound(known.instance, deadline, on_value=offer, split_above=known.lower)
        n = len(known.instance)
        regions = details["regions"]
        note = (f"ranks in {details['rank_classes']} classes; {regions} region{'s' if regions != 1 else ''} of "
                f"completion batches{', converged' if details['converged'] else ''}")
        if regions == 1 and details["root"] < known.lower:
            note += "; not split: below a bound that counts KV"
        if details["rows_priced"] < n:
            note += f"; {details['rows_priced']} of {n} requests priced before the time ran out (the rest by a cheap row)"
        return [Bound(NAME, value, time.perf_counter() - began, note=note, details=details)]
