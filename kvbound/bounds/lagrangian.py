"""A Lagrangian lower bound on mean latency and mean TTFT that is certified for every multiplier.

docs/formulation.md, "The Lagrangian bound", has the derivation; in short, for the batches
j = 1, 2, ... that process something (an eviction-only batch has no token and costs nothing):

    sum_r C_r  >=  sum_j n_j d_j,   n_j = requests unfinished at batch j,  d_j >= a0 + work in batch j,

and n_j >= nu_j = max(1, N - (most requests that can finish within j - 1 batches)), a count no
schedule beats, or the work term is bounded by the pairwise bound P; with any weight alpha in
[0, 1] between the two the bound separates per request (b_r: its completion batch, w_r(j): its
work in batch j). Dualising the KV limit M and the token limit C of the first H batches with
multipliers lam_j, mu_j >= 0 gives, for any of them,

    sum_r C_r >= sum_r min over trajectories of [a0 b_r + sum_j (alpha nu_j w_r(j) + lam_j kv_r(j) + mu_j c_r(j))]
                 + (1 - alpha) P - M sum_j lam_j - C sum_j mu_j,

each minimum a shortest path over (batch, tokens generated, KV resident or not) computed by
dynamic programming over all requests at once. Trajectories are relaxed only downwards
(partial prefill chunks hold no KV, a refill may come any batch after its eviction, prefill
chunks pay their work in the batch that completes them and their tokens at the cheapest price
so far), so every value is a lower bound; the multipliers only decide how good it is, and a
subgradient method improves them while time lasts. The requests decoding together in a batch
wait for each other's decodes (batch sharing: Cauchy-Schwarz and a tangent with weights theta_j
and points sigma_j, any of which give a bound), which the count nu_j alone under-weighs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..alone import batches_alone, first_prefill_work, largest_chunk, prefill_work, tokens_waited, work_alone
from ..deadline import Deadline
from ..objective import Objective
from ..schedule import Batch, Schedule, validate
from ..workload import Instance
from .base import Hint, Pass, Stage, register

#: bytes of DP choices kept at once: the backward pass recomputes segments from checkpoints
CHOICE_BYTES = 2 * 2 ** 30
#: the first Polyak step's fraction, and the non-improving passes before the step halves
#: (bench/results/NOTES.md, "Constants" has the runs behind these and the ones below)
FIRST_STEP = 0.1
STALL_ITERATIONS = 20
#: the work weightings tried at zero multipliers (`LagrangianBound.alpha`); from the best of them alpha
#: follows its own Polyak step (ALPHA_STEP x the step fraction), at most ALPHA_MOVE a pass and never
#: below ALPHA_LEAST: the best weighting at zero multipliers is not the best once the multipliers and
#: batch sharing act, and unbounded moves oscillate
ALPHAS = (1.0, 0.5, 0.25, 0.0)
ALPHA_STEP = 0.5
ALPHA_MOVE = 0.03
ALPHA_LEAST = 0.05
#: how far the batch-sharing tangent points move towards the trajectories' values per pass (damped:
#: undamped they oscillate)
SHARING_STEP = 0.3
#: where the first trajectories exceed M the term joins after the step has halved this many times (and
#: the step starts again): earlier, it moves the trajectories the KV multipliers follow
SHARING_AFTER_HALVINGS = 2
#: the subgradient method's horizon reaches this far past the batch the cheapest trajectories at zero
#: multipliers finish in, where the caller's horizon is shorter (trajectories past it escape the multipliers)
HORIZON_REACH = 1.1


@dataclass
class Pricing:
    """One pricing pass: the bound it certifies and what the subgradient method needs."""

    value: float  # seconds: a lower bound on the objective
    usage: np.ndarray  # KV of the cheapest trajectories per batch 1..H
    completion: np.ndarray  # per request: the batch its cheapest trajectory completes in
    start: np.ndarray  # per request: the batch its cheapest trajectory's first prefill completes in
    tokens: np.ndarray  # tokens of the cheapest trajectories per batch 1..H (a refill's in its cheapest batch)
    decode_root: np.ndarray  # per batch 1..H: the sum of sqrt(work) over the trajectories' decodes
    decode_work: np.ndarray  # per batch 1..H: the trajectories' decode work
    prefill_work: np.ndarray  # per batch 1..H: the trajectories' first-prefill and refill work (where they complete)
    cost: np.ndarray  # per request: its cheapest trajectory's priced cost (multiplier terms included)
    alpha_slope: float  # d value / d alpha along these trajectories (`LagrangianBound._alpha_slope`)


class LagrangianBound:
    """The bound for one instance and a mean objective (mean latency or mean TTFT).

    `horizon` H is how many batches carry a multiplier (beyond them lam = 0: still a bound).
    """

    def __init__(self, instance: Instance, objective: Objective, horizon: int):
        if not objective.is_mean:
            raise ValueError("the Lagrangian bound is for mean latency and mean TTFT")
        s, cost = instance.system, instance.cost
        self.instance, self.objective, self.H = instance, objective, max(1, int(horizon))
        n = len(instance)
        prompt = instance.prompts.astype(np.int64)
        out = tokens_waited(instance, objective)
        self.first_prefill = batches_alone(instance, Objective.MEAN_TTFT)  # batches the first prefill needs
        # one state per request and tokens generated k = 0..O: resident (R_k) or not (E_k)
        self.start = np.r_[0, np.cumsum(out + 1)[:-1]].astype(np.int64)
        self.last = self.start + out
        owner = np.repeat(np.arange(n), out + 1)
        k = np.arange(int((out + 1).sum())) - self.start[owner]
        held = prompt[owner] + k - 1  # cached tokens after generating token k
        self.kv = np.where(k >= 1, s.blocks(np.maximum(held, 0)), 0).astype(float)
        m = (held - 1).astype(float)  # cached before generating token k >= 2
        # (k = 0, and a decode into k = 1, are never reached: their states stay infinite)
        self.decode_work = np.where(k >= 2, cost.work(1.0, m, decode=True), 0.0)
        self.refill_work = np.where(k >= 2, prefill_work(m + 1, cost), 0.0)
        # the first prefill, in chunks of at most min(P, C)
        self.refill_work[self.start + 1] = first_prefill_work(prompt, cost, largest_chunk(instance))
        self.refill_tokens = np.where(k >= 1, held, 0).astype(float)  # a refill (or first prefill) into R_k
        self.decode_root = np.sqrt(self.decode_work)
        # `_finish_after`'s parts that no multiplier changes: per state, the least work of the tokens
        # after it (each by a decode or, after an eviction, a refill; a first token only by the prefill)
        # and the batches they take, one a token
        least = np.where(k >= 2, np.minimum(self.decode_work, self.refill_work), self.refill_work)
        least[self.start] = 0.0
        running, last_of = np.cumsum(least), self.last[owner]
        self._work_after, self._batches_after = running[last_of] - running, (last_of - np.arange(len(k))).astype(float)
        self._owner = owner
        self.alone = batches_alone(instance, objective)  # the fewest batches each request needs alone
        self._counts = _unfinished_at_least(instance, np.add.reduceat(self.kv, self.start), self.alone,
                                            (prompt + out - 1).astype(float))
        self._longest = int((self.first_prefill + out).max())
        self.intercept = cost.intercept
        self._set_horizon(self.H)
        self.arrival_sum = float(instance.arrivals.sum())
        # the work may also be bounded without trajectories: each pair of requests waits at least for
        # the smaller one's work (the k-th completion for the k smallest works), `pairwise`; the
        # bound weighs the two, `alpha` (the nu-weighted work in the DP) and 1 - alpha (pairwise)
        # each request's least work (of its first prefill for first tokens); the trajectories charge every
        # request at least this (their first prefill is `first_prefill_work` too), which the copies need
        self.own_work = work_alone(instance, objective)
        self.pairwise = float(np.cumsum(np.sort(self.own_work)).sum())
        self.alpha = 1.0
        self.capacity, self.token_capacity, self.n = s.kv_capacity, s.max_batch_tokens, n
        # `_step`'s working arrays, one set reused by every batch
        T = len(self.kv)
        self._scratch = (np.empty(T - 1), np.empty(T - 1), np.empty(T - 1, dtype=bool))

    def _set_horizon(self, horizon: int) -> None:
        """Give batches 1..`horizon` multipliers and batch-sharing terms (all zero)."""
        self.H = horizon
        nu = self._counts
        # after batch `flat` no count, multiplier or sharing term is left (nu = 1, lam = mu = 0), so a
        # trajectory done from there as early as it can is a cheapest one: it completes by flat + its
        # own batches (`steps`). The DP steps through `stepped` batches (flat, or a first prefill's
        # batches if more) and finishes every trajectory from there in closed form (`_finish_after`)
        flat = max(self.H, len(nu))
        self.stepped = max(flat, int(self.first_prefill.max()))
        self.steps = flat + self._longest + 1
        self.nu = np.r_[nu, np.ones(self.steps - len(nu))]
        # what a trajectory completing in batch j pays for being unfinished in batches 1..j: j intercepts
        # (`completion_master` prices each batch apart)
        self.finish_price = self.intercept * np.arange(self.steps + 1, dtype=float)
        # the batch-sharing term of batches 1..H (`_follow_sharing`): weights theta_j in [0, 1] and
        # tangent points sigma_j; all 0 is the plain nu-weighted bound
        self.sharing, self.sharing_point = np.zeros(self.H), np.zeros(self.H)

    def weigh(self, work_weights: np.ndarray, finish_price: np.ndarray) -> None:
        """Price work in batch j at `work_weights[j - 1]` instead of nu_j, and finishing in batch j at
        `finish_price[j]` instead of j intercepts (the completion master's rho and eta: any values
        give a valid pricing of the master's Lagrangian, `completion_master`)."""
        self.nu, self.finish_price = work_weights, finish_price

    # ------------------------------------------------------------------ one pricing pass

    def price(self, lam: np.ndarray, mu: np.ndarray | None = None, columns: list | None = None) -> Pricing:
        """The cheapest trajectory of every request under multipliers `lam` on the KV limit and `mu`
        on the token limit C of batches 1..H (each length H, >= 0; no `mu`: 0). A `columns` list
        gets the trajectories batch by batch (`_backtrack`), for a master over them."""
        mu = np.zeros(self.H) if mu is None else mu
        T = len(self.kv)
        stepped = self.stepped
        segment = max(1, min(stepped, CHOICE_BYTES // (2 * T)))
        keep = segment >= stepped  # every choice fits: the backward pass need not recompute
        checkpoints, kept = {}, []
        R = np.full(T, np.inf)
        E = np.full(T, np.inf)
        E[self.start] = 0.0
        best = np.full(self.n, np.inf)
        done_at = np.zeros(self.n, dtype=np.int64)
        cheapest = _running_argmin(mu, self.steps)
        for j in range(1, stepped + 1):
            if (j - 1) % segment == 0:
                checkpoints[j] = (R, E)
            R, E, choice, evict = self._step(j, lam, mu, cheapest, R, E, best, done_at)
            if keep:
                kept.append((choice, evict))
        ends = self._finish_after(R, E, best, done_at)
        value = (best.sum() - self.capacity * float(lam.sum()) - self.token_capacity * float(mu.sum())
                 + (1.0 - self.alpha) * self.pairwise
                 - self.alpha * float(self.sharing @ self.sharing_point ** 2)
                 - self.arrival_sum) / self.n
        usage, tokens, start, root, decoded, prefilled = self._backtrack(lam, mu, cheapest, checkpoints, segment,
                                                                         done_at, ends, kept if keep else None, columns)
        slope = self._alpha_slope(best, done_at, float(lam @ usage) + float(mu @ tokens))
        return Pricing(value, usage, done_at, start, tokens, root, decoded, prefilled, best, slope)

    def _finish_after(self, R, E, best, done_at) -> tuple[np.ndarray, np.ndarray]:
        """Finish every trajectory after batch J = `stepped` in closed form, as stepping on to `steps`
        would (tests compare the two), and update `best` and `done_at` where that is cheaper.

        After J nothing is priced but the nu = 1 weighted work (lam = mu = 0, no batch sharing, a
        refill's tokens free) and the finish price, which grows by the intercept a batch: a pause only
        finishes later, so the cheapest way on from any state generates one token a batch, each by a
        decode or, after an eviction (free), a refill, whichever works less; from an evicted state the
        first by a refill. Returns, per request, the state (index) it is in after batch J on its
        cheapest trajectory and whether it is resident there (-1 and True where it finished by J)."""
        J, a = self.stepped, self.alpha
        after = a * self._work_after
        tail = self.finish_price[J] + self.intercept * self._batches_after
        from_resident = R + after + tail
        from_evicted = np.full_like(E, np.inf)  # the next token by a refill
        refill_next = a * self.refill_work[1:] + after[1:]
        from_evicted[:-1] = E[:-1] + refill_next + tail[:-1]
        from_resident[self.last] = from_evicted[self.last] = np.inf  # done by J: already in `best`
        cost = np.minimum(from_resident, from_evicted)
        cheapest = np.minimum.reduceat(cost, self.start)
        better = cheapest < best
        state = np.full(self.n, -1, dtype=np.int64)
        resident = np.ones(self.n, dtype=bool)
        if better.any():
            owner = self._owner
            hit = np.flatnonzero((cost == cheapest[owner]) & better[owner])
            # each request's last cheapest state: of equal costs the earliest completion, which is the
            # one stepping on keeps (a later batch replaces an earlier one only if cheaper)
            chosen = hit[np.r_[owner[hit][1:] != owner[hit][:-1], True]]
            r = owner[chosen]
            state[r] = chosen
            resident[r] = from_resident[chosen] <= from_evicted[chosen]
            best[r] = cheapest[r]
            done_at[r] = J + (self.last[r] - chosen)
        return state, resident

    def _priced_at(self, alpha: float, lam, mu) -> Pricing:
        self.alpha = alpha
        return self.price(lam, mu)

    def _step(self, j, lam, mu, cheapest, R, E, best=None, done_at=None):
        """One batch of the DP: the cheapest cost of every state after batch j, how each was reached
        (0 idle, 1 decode, 2 refill or first prefill) and which were evicted before it.

        A refill's tokens pay the cheapest token price of batches 1..j (`cheapest`): its chunks run
        in some of them, at most that many tokens, so that is a lower bound."""
        lj = float(lam[j - 1]) if j <= self.H else 0.0
        mj = float(mu[j - 1]) if j <= self.H else 0.0
        low = float(mu[cheapest[j - 1]]) if cheapest[j - 1] >= 0 else 0.0
        nu = self.nu[j - 1] * self.alpha
        # the terms are summed in scratch arrays in a fixed order; a zero term (lam_j where M does
        # not bind, mu_j, sharing) is left out, which changes no value (x + 0.0 is x)
        moved, term, cheaper = self._scratch
        held = self.kv * lj if lj else None
        # an eviction needs no batch of its own: an eviction-only batch costs nothing (no tokens)
        evict = R < E
        E = np.minimum(E, R)
        Rn = R + held if lj else R.copy()  # idle
        choice = np.zeros(len(R), dtype=np.int8)
        # batch sharing (theta_j, sigma_j): a decode costs (1 - theta_j) nu_j w + 2 theta_j sigma_j sqrt(w)
        share, point = (self.sharing[j - 1], self.sharing_point[j - 1]) if j <= self.H else (0.0, 0.0)
        for code, before, work in ((1, R, self.decode_work), (2, E, self.refill_work)):
            if lj:
                np.add(before[:-1], held[1:], out=moved)
            else:
                np.copyto(moved, before[:-1])
            if code == 1:
                np.multiply(work[1:], nu * (1.0 - share), out=term)
                if mj:
                    term += mj
                moved += term
                if share:
                    moved += np.multiply(self.decode_root[1:], 2.0 * self.alpha * share * point, out=term)
            else:
                moved += np.multiply(work[1:], nu, out=term)
                if low:
                    moved += np.multiply(self.refill_tokens[1:], low, out=term)
                moved[self.start[j < self.first_prefill]] = np.inf  # a first prefill needs its batches
            np.less(moved, Rn[1:], out=cheaper)
            np.copyto(Rn[1:], moved, where=cheaper)
            np.copyto(choice[1:], code, where=cheaper)
        Rn[self.start] = np.inf
        if best is not None:
            finish = Rn[self.last] + self.finish_price[j]
            better = finish < best
            best[better] = finish[better]
            done_at[better] = j
        Rn[self.last] = np.inf
        return Rn, E, choice, evict

    def _backtrack(self, lam, mu, cheapest, checkpoints, segment, done_at, ends, kept=None, columns=None):
        """KV per batch 1..H of every request's cheapest trajectory, and its start batch (the
        choices `kept` from the forward pass, else recomputed segment by segment from checkpoints),
        walking back from each request's state after the last batch stepped (`ends`). `columns`, if
        a list, gets per batch j <= H: (j, the requests resident and their KV, the requests decoding,
        the requests refilling and their tokens, the batch those tokens are priced in, the decodes'
        work and its square root)."""
        usage = np.zeros(self.H)
        tokens = np.zeros(self.H)
        root, decoded, prefilled = np.zeros(self.H), np.zeros(self.H), np.zeros(self.H)
        state, resident = ends
        after = state >= 0  # finishing after the last batch stepped, from this state
        pos = np.where(after, state, self.last)
        resident = resident.copy()
        # a first prefill completing after it: in the batch after
        start = np.where(after & (state == self.start), self.stepped + 1, 0).astype(np.int64)
        alive = np.ones(self.n, dtype=bool)
        for first in sorted(checkpoints, reverse=True):
            R, E = checkpoints[first]
            end = min(first + segment, self.stepped + 1)
            if kept is not None:
                choices = kept
            else:
                choices = []
                for j in range(first, end):
                    R, E, choice, evict = self._step(j, lam, mu, cheapest, R, E)
                    choices.append((choice, evict))
            for j in range(end - 1, first - 1, -1):
                choice, evict = choices[j - first]
                act = alive & (j <= done_at)
                inr = act & resident
                if j <= self.H and inr.any():
                    usage[j - 1] += self.kv[pos[inr]].sum()
                ch = np.where(inr, choice[pos], 0)
                if columns is not None and j <= self.H:
                    columns.append((j, np.flatnonzero(inr), self.kv[pos[inr]], np.flatnonzero(ch == 1),
                                    np.flatnonzero(ch == 2), self.refill_tokens[pos[ch == 2]], cheapest[j - 1],
                                    self.decode_work[pos[ch == 1]], self.decode_root[pos[ch == 1]]))
                started = inr & (ch == 2) & (pos == self.start + 1)
                start[started] = j
                if j <= self.H:  # decode tokens in this batch; a refill's in the cheapest batch so far
                    into = pos[ch == 1]  # the states decodes reach in this batch
                    tokens[j - 1] += len(into)
                    root[j - 1] += self.decode_root[into].sum()
                    decoded[j - 1] += self.decode_work[into].sum()
                    refilled = ch == 2
                    prefilled[j - 1] += self.refill_work[pos[refilled]].sum()
                    if refilled.any() and cheapest[j - 1] >= 0:
                        tokens[cheapest[j - 1]] += self.refill_tokens[pos[refilled]].sum()
                pos = pos - (ch >= 1)
                # before this batch: resident after a decode or idle batch; after a refill, resident
                # if it was evicted just before the refill, as for a request that stayed evicted
                refilled_or_out = act & ~(inr & (ch <= 1))
                resident = np.where(refilled_or_out, evict[pos], resident)
                alive &= ~(~resident & (pos == self.start))
        return usage, tokens, start, root, decoded, prefilled

    # ------------------------------------------------------------------ the subgradient method

    def iterate(self, upper_bound: float):
        """Subgradient ascent with Polyak steps towards `upper_bound` (seconds; the caller may lower
        `self.target` as better schedules appear): yields (best bound so far, its pricing, this
        pricing) after every pass, and stops when the bound cannot improve."""
        self.target = upper_bound
        lam, mu = np.zeros(self.H), np.zeros(self.H)
        # the work weighting that is best at zero multipliers (any alpha in [0, 1] gives a bound)
        trials = {alpha: self._priced_at(alpha, lam, mu) for alpha in ALPHAS}
        self.alpha = max(trials, key=lambda a: trials[a].value)
        pricing = trials[self.alpha]  # the first pass: its multipliers are these zeros
        # multipliers and sharing act only up to H, and cheapest trajectories that finish after it
        # escape them: H reaches past them (zero multipliers price alike at every H)
        reach = int(HORIZON_REACH * pricing.completion.max())
        if reach > self.H:
            self._set_horizon(reach)
            lam, mu = np.zeros(self.H), np.zeros(self.H)
            pricing = self.price(lam, mu)
        steps = StepControl(FIRST_STEP)
        # the batch-sharing term: from the start where the trajectories already fit M (no KV
        # multiplier has anything to do), else once the multipliers alone stall
        sharing = bool((pricing.usage <= self.capacity).all())
        while True:
            if steps.record(pricing) and not sharing and steps.theta < FIRST_STEP / 2 ** (SHARING_AFTER_HALVINGS - 1):
                sharing, steps.theta = True, FIRST_STEP
            yield steps.best, steps.pricing, pricing
            if steps.best >= self.target * (1 - 1e-9):
                return
            g = projected_subgradient(pricing.usage - self.capacity, lam)
            h = projected_subgradient(pricing.tokens - self.token_capacity, mu)
            norm = float(g @ g + h @ h)
            alpha = self._next_alpha(pricing, steps.theta)
            moved = sharing and self._follow_sharing(pricing)
            if (norm == 0.0 and not moved and alpha == self.alpha) or steps.theta < 1e-9:
                return  # the cheapest trajectories fit M and C, nothing else moves (or the steps vanished)
            if norm:
                step = steps.theta * (self.target - pricing.value) * self.n / norm
                lam = np.maximum(0.0, lam + step * g)
                mu = np.maximum(0.0, mu + step * h)
            self.alpha = alpha
            pricing = self.price(lam, mu)

    def _next_alpha(self, pricing: Pricing, theta: float) -> float:
        """Alpha after its own Polyak step along `pricing.alpha_slope` (step fraction ALPHA_STEP x `theta`), at
        most ALPHA_MOVE and within [ALPHA_LEAST, 1] (alpha 0 stays 0)."""
        slope = pricing.alpha_slope
        if not slope:
            return self.alpha
        move = np.clip(ALPHA_STEP * theta * (self.target - pricing.value) / slope, -ALPHA_MOVE, ALPHA_MOVE)
        return float(np.clip(self.alpha + move, ALPHA_LEAST, 1.0))

    def _alpha_slope(self, cost: np.ndarray, done_at: np.ndarray, priced_limits: float) -> float:
        """d value / d alpha along the trajectories just priced (their costs, completion batches and
        multiplier terms), at the alpha and sharing they were priced with: a supergradient, since the
        value is the least of functions affine in (alpha, lam, mu). 0 where alpha is 0 (the
        trajectories' work is then unpriced; it stays there)."""
        if self.alpha <= 0.0:
            return 0.0
        weighted = (cost.sum() - self.finish_price[done_at].sum() - priced_limits) / self.alpha
        return (weighted - self.pairwise - float(self.sharing @ self.sharing_point ** 2)) / self.n

    def _follow_sharing(self, pricing: Pricing) -> bool:
        """Move the batch-sharing tangent points towards the trajectories' own sqrt-work sums and use
        the term where it is the larger of the two at them (any values give a bound; these are a
        damped fixed point, kept because they gained most on the real traces). True if anything moved."""
        target = pricing.decode_root
        if not target.any() and not self.sharing_point.any():
            return False
        point = self.sharing_point + SHARING_STEP * (target - self.sharing_point)
        sharing = (point ** 2 > self.nu[:self.H] * pricing.decode_work).astype(float)
        moved = not (np.allclose(point, self.sharing_point, rtol=1e-6, atol=0.0) and np.array_equal(sharing, self.sharing))
        self.sharing_point, self.sharing = point, sharing
        return moved

    def improve(self, deadline: Deadline, upper_bound: float,
                max_passes: int | None = None) -> tuple[float, Pricing | None, int]:
        """`iterate` until the deadline (or `max_passes`): (best bound, its pricing, passes)."""
        value, pricing, passes = -math.inf, None, 0
        for value, pricing, _ in self.iterate(upper_bound):
            passes += 1
            if deadline.expired() or (max_passes is not None and passes >= max_passes):
                break
        return value, pricing, passes


class StepControl:
    """The best value along a subgradient path and the Polyak step fraction `theta`, halved after
    `STALL_ITERATIONS` passes without a better value."""

    def __init__(self, first: float):
        self.theta, self.best, self.pricing, self.stall = first, -math.inf, None, 0

    def record(self, pricing: Pricing) -> bool:
        """Count one pass; True if the step has just halved."""
        if self.pricing is None or pricing.value > self.best + 1e-12 * abs(self.best):
            self.best, self.pricing, self.stall = pricing.value, pricing, 0
            return False
        self.stall += 1
        if self.stall < STALL_ITERATIONS:
            return False
        self.theta, self.stall = self.theta / 2, 0
        return True


def projected_subgradient(excess: np.ndarray, multipliers: np.ndarray) -> np.ndarray:
    """The subgradient of a limit's multipliers (>= 0), where a zero multiplier cannot go lower."""
    excess = excess.copy()
    excess[(multipliers <= 0) & (excess < 0)] = 0.0
    return excess


def _running_argmin(mu: np.ndarray, steps: int) -> np.ndarray:
    """Per batch j = 1..steps, the index (0-based) of the cheapest token price among batches 1..j
    (batches after H have price 0: -1 there, meaning "free")."""
    out = np.full(steps, -1, dtype=np.int64)
    if len(mu):
        running = np.minimum.accumulate(mu)
        first = np.flatnonzero(np.r_[True, running[1:] < running[:-1]])  # where a new minimum starts
        out[:len(mu)] = first[np.searchsorted(first, np.arange(len(mu)), side="right") - 1]
    return out


def _unfinished_at_least(instance: Instance, area: np.ndarray, alone: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """nu_j, j = 1, 2, ... up to the first j where it is 1: at least this many requests are
    unfinished in batch j of any schedule (never fewer than 1; it only decreases, so every later
    batch has 1 too).

    Requests finished within j - 1 batches each fit alone there (first prefill batches + O - 1
    decodes), together their KV area (KV during each generating batch) fits (j - 1) M and their
    tokens fit (j - 1) C; each limit alone caps their number, counted smallest first. (The
    dual-feasible weights of `kv_weights` as a third limit changed nothing on the real traces.)"""
    s = instance.system
    n = len(area)
    nu = []
    caps = []
    for need, capacity in ((area, s.kv_capacity), (tokens, s.max_batch_tokens)):
        order = np.argsort(need, kind="stable")
        caps.append((need[order], alone[order], capacity))
    while not nu or nu[-1] > 1:  # ends: from j - 1 >= max(alone) and (j - 1) x capacity >= each need's sum, all fit
        j = len(nu) + 1
        done = n
        for need, length, capacity in caps:
            fits = length <= j - 1
            cum = np.cumsum(np.where(fits, need, 0.0))
            done = min(done, int(np.count_nonzero(fits & (cum <= (j - 1) * capacity))))
        nu.append(max(1, n - done))
    return np.array(nu, dtype=float)


# ---------------------------------------------------------------------- in the solve's race

#: the multipliers act on this many times the start schedule's batches (`start_horizon`)
HORIZON_FACTOR = 1.1


def start_horizon(schedule: Schedule) -> int:
    """The batches that carry multipliers, from the schedule the bound starts from."""
    return max(1, int(HORIZON_FACTOR * len(schedule.batches)))


def lagrangian_ceiling(instance: Instance, objective: Objective, schedule: Schedule) -> float:
    """The most the Lagrangian bounds can certify on `instance` (seconds; mean objectives).

    Both see every request from time 0, so each is at most the optimum of the instance with every
    arrival at 0 less the mean arrival time, and that optimum is at most `schedule`'s there (its
    batches back to back). With arrivals spread over minutes this is far below zero, and a first
    pass there can take the whole time limit."""
    if instance.offline:
        return math.inf  # all at once: nothing to relax
    at_zero = Instance(tuple(replace(r, arrival=0.0) for r in instance.requests), instance.system, instance.cost)
    batches = [Batch(dict(b.tokens), b.evict) for b in schedule.batches]
    return objective.of(validate(at_zero, Schedule(at_zero.requests, batches)).metrics) - float(instance.arrivals.mean())


def ceiling_reason(known) -> str | None:
    """Why neither Lagrangian variant can pass what is known: total latency, or a ceiling
    (`lagrangian_ceiling`) at or below the best bound so far."""
    if not known.objective.is_mean:
        return "none for total latency"
    ceiling = lagrangian_ceiling(known.instance, known.objective, known.best_schedule)
    if ceiling > known.lower:
        return None
    return (f"none: it sees every request from time 0, so it stays below {ceiling:.6g} s (the best "
            "schedule with every arrival at 0, less the mean arrival), under the analytic bound")


def passes_of(bound, known):
    """Pass after pass of `bound` (a `LagrangianBound` or a `MasterBound`), its Polyak steps aiming at
    the best schedule known; each pass hints the admission pattern of its best trajectories."""
    for value, pricing, _ in bound.iterate(known.best_value):
        keys = pricing.start.astype(float)
        yield Pass(value, Hint(keys, np.maximum(0.0, keys - bound.first_prefill)))
        bound.target = known.best_value


@register
class BatchSharing:
    """The Lagrangian bound with batch sharing, from the start schedule's horizon."""

    name, stage, share = "batch sharing", Stage.ANYTIME, 1.0

    def skip_reason(self, known) -> str | None:
        return ceiling_reason(known)

    def passes(self, known):
        return passes_of(LagrangianBound(known.instance, known.objective, start_horizon(known.best_schedule)), known)
