"""A second Lagrangian bound for mean latency and mean TTFT: the trajectories' DP and a completion master.

docs/formulation.md, "The completion master", has the derivation. In short: every schedule has
sum_r (C_r - a_r) >= sum_j n_j (a0 + W_j) - sum_r a_r, n_j the requests unfinished in batch j and
W_j its work. The Lagrangian bound (`lagrangian`) weighs W_j by nu_j, the fewest requests that can
be unfinished there, and its trajectories put their work where nu_j is small although they are
then the unfinished ones. Here n_j = sum_r u_r(j) (u_r(j) = 1 while r is unfinished) and
W_j = sum_r w_r(j) are copied with multipliers eta_j and rho_j <= nu_j: the trajectories pay eta_j
per unfinished batch and rho_j per unit of work (the same DP), and a master takes
sum_j n_j (a0 + W_j) - eta_j n_j - rho_j W_j over every (n, W) a schedule can have: n
non-increasing, at least nu_j while batches remain, and if m requests are unfinished after batch j,
the N - m done ones fit alone in j batches and their least work is done. For a fixed count
sequence the cheapest work puts each needed unit in the cheapest batch before it is needed, so
the master is a dynamic program over batches with state (unfinished m, work level reached).

At eta = a0, rho = nu the master is 0 and the bound is the Lagrangian one without batch sharing;
the two do not combine (with sharing's theta = 1 the decode work leaves the master's objective),
so the search runs batch sharing first and this one once that stalls, and reports the better
(bench/results/NOTES.md: this one wins on the prefill-heavy code trace, batch sharing on
conversation and arXiv).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..objective import Objective
from ..workload import Instance
from .base import Stage, register
from .lagrangian import LagrangianBound, Pricing, StepControl, ceiling_reason, passes_of, projected_subgradient, start_horizon

#: the master's work levels at most (each needed total is rounded down to one: a relaxation)
MAX_LEVELS = 512
#: where the master's DP has more cells than this (requests x levels x batches) it is not built (about
#: 30 requests): larger, its slow passes take time from the other variant and the pattern search
#: without passing them (bench/results/NOTES.md, "Constants")
MASTER_CELLS = 2 * 10 ** 7
#: bytes of master states kept at once: the backward pass recomputes segments from checkpoints
STATE_BYTES = 2 ** 28
#: the first Polyak step's fraction
FIRST_STEP = 0.5


class CompletionMaster:
    """min over (n, W) of sum_j n_j (a0 + W_j) - eta_j n_j - rho_j W_j for one instance.

    `own_work[r]`: the least work of request r (of its first prefill for first tokens); `alone[r]`:
    the fewest batches it needs alone; `unfinished`: nu_j, j = 1, 2, ...; `horizon` H: the batches
    with multipliers of their own (beyond them eta = a0 and rho = nu_j); `steps`: the DP's batches.
    """

    def __init__(self, own_work: np.ndarray, alone: np.ndarray, unfinished: np.ndarray, intercept: float,
                 horizon: int, steps: int):
        n = len(own_work)
        self.n, self.H, self.intercept = n, horizon, intercept
        # N batches after the DP's last suffice: beyond them eta = a0 and rho = nu_j, every cost is
        # >= 0, and a schedule's remaining batches can be merged into one per drop of the count
        self.T = steps + n
        self.nu = np.r_[unfinished, np.ones(max(0, self.T + 1 - len(unfinished)))][:self.T + 1]
        # after batch j at least least[j] requests are unfinished (nu of batch j + 1), except that
        # from nu's floor of 1 on all may be done: a relaxation, so that the master can end
        least = np.r_[n, self.nu[1:self.T + 1]]
        least[least <= 1] = 0
        self.least = least
        # need[j, k]: the least work of k requests that all fit alone in j batches
        need = np.full((self.T + 1, n + 1), np.inf)
        need[:, 0] = 0.0
        for j in np.unique(np.minimum(alone, self.T)):
            fits = np.sort(own_work[alone <= j])
            need[j:, 1:len(fits) + 1] = np.cumsum(fits)
        finite = np.isfinite(need)
        levels = np.unique(need[finite])
        if len(levels) > MAX_LEVELS:
            levels = np.unique(np.quantile(levels, np.linspace(0.0, 1.0, MAX_LEVELS), method="lower"))
        self.levels = levels
        # the index of the level each need rounds down to; len(levels): more requests than fit
        index = np.searchsorted(levels, np.where(finite, need, 0.0), side="right") - 1
        self.need = np.where(finite, index, len(levels))

    @staticmethod
    def cells(n: int, steps: int) -> int:
        """An upper bound on the master DP's cells, to decide whether to build it."""
        return (n + 1) * MAX_LEVELS * (steps + n)

    def solve(self, eta: np.ndarray, rho: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """(value, count, work): the least cost for multipliers of batches 1..H (rho <= nu) and the
        minimiser's unfinished count and work per batch 1..H."""
        n, H, T, G = self.n, self.H, self.T, self.levels
        eta = np.r_[eta, np.full(T - H, self.intercept)]
        rho = np.r_[rho, self.nu[H:T]]  # nu_j of batches H + 1..T
        segment = max(1, min(T, STATE_BYTES // (8 * (n + 1) * len(G))))
        keep = segment >= T  # every move fits: the backward pass need not recompute
        V = np.full((n + 1, len(G)), np.inf)
        V[n, 0] = 0.0  # before batch 1: all unfinished, no work done
        checkpoints, kept = {}, []
        for j in range(1, T + 1):
            if (j - 1) % segment == 0:
                checkpoints[j] = V
            V, from_level, from_count = self._batch(j, V, eta, rho)
            if keep:
                kept.append((from_level, from_count))
        level = int(np.argmin(V[0]))
        value = float(V[0, level])
        count, work = np.zeros(H), np.zeros(H)
        after = 0  # unfinished after the batch being traced back
        for first in sorted(checkpoints, reverse=True):
            if keep:
                moves = kept
            else:
                V, moves = checkpoints[first], []
                for j in range(first, min(first + segment, T + 1)):
                    V, from_level, from_count = self._batch(j, V, eta, rho)
                    moves.append((from_level, from_count))
            for j in range(first + len(moves) - 1, first - 1, -1):
                from_level, from_count = moves[j - first]
                m = int(from_count[after, level])
                before = int(from_level[m, level])
                if j <= H:
                    count[j - 1], work[j - 1] = m, G[level] - G[before]
                after, level = m, before
        return value, count, work

    def _batch(self, j, V, eta, rho):
        """Batch j: from V[m, L] (m unfinished in batch j, level L reached before it) to the states after it."""
        n, G = self.n, self.levels
        K = len(G)
        count = np.arange(n + 1, dtype=float)[:, None]
        # a unit of work in batch j costs m - rho_j, >= 0 wherever m >= nu_j (every reachable m but 0,
        # the state after the last batch, where nothing runs)
        c = np.maximum(count - rho[j - 1], 0.0)
        # reach level L' >= L: V[m, L] + c (G[L'] - G[L]), the best L by a running minimum
        base = V - c * G[None, :]
        low = np.minimum.accumulate(base, axis=1)
        from_level = np.maximum.accumulate(np.where(base == low, np.arange(K)[None, :], 0), axis=1)
        after = low + c * G[None, :] + (self.intercept - eta[j - 1]) * count
        # then m' <= m unfinished after batch j (0: all done, no more batches), the best m by a running minimum
        best = np.minimum.accumulate(after[::-1], axis=0)[::-1]
        ranked = np.where(after == best, np.arange(n + 1)[:, None], n + 1)
        from_count = np.minimum.accumulate(ranked[::-1], axis=0)[::-1]
        needed = self.need[min(j, self.T), n - np.arange(n + 1)]
        feasible = (np.arange(K)[None, :] >= needed[:, None]) & (count >= self.least[j])
        return np.where(feasible, best, np.inf), from_level.astype(np.int32), from_count.astype(np.int32)


class MasterBound:
    """The trajectories' DP (a `LagrangianBound` with alpha = 1 and no batch sharing, its work
    weights and intercepts replaced by rho and eta) and the completion master. Same use as
    `LagrangianBound`: `iterate`, `target`, `first_prefill`."""

    def __init__(self, instance: Instance, objective: Objective, horizon: int):
        self.dp = dp = LagrangianBound(instance, objective, horizon)
        dp.alpha = 1.0
        self.H, self.n, self.intercept, self.first_prefill = dp.H, dp.n, dp.intercept, dp.first_prefill
        self.nu = dp.nu.copy()  # the DP's own nu becomes rho below
        self.master = CompletionMaster(dp.own_work, dp.alone, self.nu, dp.intercept, dp.H, dp.steps)
        self.target = math.inf

    @classmethod
    def where_it_fits(cls, instance: Instance, objective: Objective, horizon: int) -> "MasterBound | None":
        """The bound, or None where the master's DP would exceed `MASTER_CELLS`."""
        if CompletionMaster.cells(len(instance), max(1, int(horizon))) > MASTER_CELLS:
            return None  # even at the fewest batches the DP can have
        bound = cls(instance, objective, horizon)
        return bound if CompletionMaster.cells(bound.n, bound.dp.steps) <= MASTER_CELLS else None

    def price(self, eta, rho, lam, mu) -> tuple[Pricing, np.ndarray, np.ndarray]:
        """The bound at these multipliers (a `Pricing` of the trajectories whose value includes the
        master's) and the master's minimiser (count, work per batch 1..H)."""
        dp = self.dp
        dp.weigh(np.r_[rho, self.nu[self.H:]], np.r_[0.0, np.cumsum(np.r_[eta, np.full(dp.steps - self.H, self.intercept)])])
        pricing = dp.price(lam, mu)
        master, count, work = self.master.solve(eta, rho)
        return dataclasses.replace(pricing, value=pricing.value + master / self.n), count, work

    def iterate(self, upper_bound: float):
        """Projected subgradient ascent from eta = a0, rho = nu (where the master adds nothing), each
        block of multipliers (KV and tokens, eta, rho) with its own Polyak step towards `upper_bound`
        (the caller may lower `self.target`): yields (best bound so far, its pricing, this pricing)."""
        self.target = upper_bound
        H, cap = self.H, self.nu[:self.H]
        eta, rho, lam, mu = np.full(H, self.intercept), cap.copy(), np.zeros(H), np.zeros(H)
        steps = StepControl(FIRST_STEP)
        while steps.theta >= 1e-9:
            pricing, count, work = self.price(eta, rho, lam, mu)
            steps.record(pricing)
            yield steps.best, steps.pricing, pricing
            if steps.best >= self.target * (1 - 1e-9):
                return
            g_kv = projected_subgradient(pricing.usage - self.dp.capacity, lam)
            g_tokens = projected_subgradient(pricing.tokens - self.dp.token_capacity, mu)
            unfinished = self.n - np.cumsum(np.bincount(np.minimum(pricing.completion, H), minlength=H + 1))[:H]
            g_eta = unfinished - count
            g_rho = pricing.decode_work + pricing.prefill_work - work
            g_rho[(rho >= cap) & (g_rho > 0)] = 0.0
            blocks = (np.r_[g_kv, g_tokens], g_eta, g_rho)
            squares = [float(b @ b) for b in blocks]
            moving = sum(1 for q in squares if q)
            if not moving:
                return  # every copy holds and the trajectories fit M and C: the bound is final
            scale = steps.theta * (self.target - pricing.value) * self.n / moving
            step_kv, step_eta, step_rho = (scale / q if q else 0.0 for q in squares)
            lam = np.maximum(0.0, lam + step_kv * g_kv)
            mu = np.maximum(0.0, mu + step_kv * g_tokens)
            eta = eta + step_eta * g_eta
            rho = np.minimum(cap, rho + step_rho * g_rho)


@register
class CompletionMasterBound:
    """The completion master variant, where its DP fits (`MASTER_CELLS`)."""

    name, stage, share = "completion master", Stage.ANYTIME, 1.0

    def skip_reason(self, known) -> str | None:
        if known.objective.is_mean and MasterBound.where_it_fits(known.instance, known.objective,
                                                                 start_horizon(known.best_schedule)) is None:
            return f"its DP would exceed {MASTER_CELLS:,} cells"
        return ceiling_reason(known)

    def passes(self, known):
        return passes_of(MasterBound(known.instance, known.objective, start_horizon(known.best_schedule)), known)
