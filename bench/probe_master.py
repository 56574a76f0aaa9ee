"""Experiment (not part of kvbound; no command reports its values): the Lagrangian bound with an aggregate master.

    python bench/probe_master.py CASE [--seconds S] [--start shipped|zero]   # e.g. bench/cases_real/splitwise_code_30_loose_t0.toml

The shipped Lagrangian bound (kvbound/formulation/lagrangian.py) weighs the work of batch j by nu_j,
the fewest requests that can be unfinished there, and its trajectories exploit that: they put
their work where nu_j is small, although then they are the unfinished ones. This probe tries to
make the two consistent by a Lagrangian decomposition (measured, not adopted: bench/results/NOTES.md,
"What the remaining gaps are made of", "An aggregate master"). With n_j the requests unfinished in
batch j and W_j its work, every schedule (all at 0) has sum_r C_r >= sum_j n_j (a0 + W_j). Copy
n_j = sum_r u_r(j) (u_r(j) = 1 while r is unfinished) with a multiplier eta_j and W_j = sum_r w_r(j)
with rho_j <= nu_j:

    sum_r C_r >= sum_r min_traj [sum_j (eta_j u_r(j) + rho_j w_r(j)) + KV and token multiplier terms]
                 + min over (n, W) of sum_j [n_j (a0 + W_j) - eta_j n_j - rho_j W_j]   (the master)
                 - M sum lam - C sum mu.

The first line is the shipped dynamic program with a price eta_j per unfinished batch instead of
a0 and weights rho_j instead of nu_j. The master ranges over every (n, W) a schedule can have:
n non-increasing, n_j >= nu_j while batches remain (0 once all are done), and if only m requests
are unfinished after batch j, the N - m done ones all fit alone in j batches and their minimal
work is done: the work of batches 1..j is at least `need[j, N - m]`, the sum of the N - m
smallest minimal works among the requests that fit alone in j batches. For fixed (n, levels)
its cheapest W places the needed work at the cheapest coefficient n_j - rho_j >= 0, so the master
is a dynamic program over batches with state (unfinished m, work level reached), both from
finite sets. With eta = a0 and rho = nu the master is 0 and the bound is the shipped one (without
batch sharing); with eta = rho = 0 it is a completion-order bound. Beyond the horizon H the
multipliers are (a0, nu_j), where the master's costs are >= 0 and a schedule's remaining batches
can be merged, so N more batches suffice for it to finish.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvbound.formulation.bounds import request_minimum_work  # noqa: E402
from kvbound.formulation.lagrangian import FIRST_STEP, STALL_ITERATIONS, LagrangianBound  # noqa: E402
from kvbound.workload import Instance  # noqa: E402


class MasterBound:
    """The decomposed bound for one instance, all arrivals at 0, mean latency."""

    def __init__(self, instance: Instance, horizon: int):
        if (instance.arrivals > 0).any():
            raise ValueError("the probe is for all arrivals at 0")
        self.dp = LagrangianBound(instance, "mean_latency", horizon)
        self.dp.alpha = 1.0
        dp, n = self.dp, len(instance)
        self.H, self.n, self.a0 = dp.H, n, dp.intercept
        self.nu_at_least = dp.nu.copy()  # the DP's own nu is replaced by rho below
        self.T = dp.steps + n  # the master's batches: the DP's, then N in which to finish
        self.unfinished_after = _unfinished_after(dp, self.T)
        work = np.array([request_minimum_work(r, instance.cost) for r in instance.requests])
        alone = dp.first_prefill + np.array([r.output for r in instance.requests]) - 1
        need = np.full((self.T + 1, n + 1), np.inf)
        need[:, 0] = 0.0
        for j in range(self.T + 1):
            smallest = np.sort(work[alone <= j])
            need[j, 1:len(smallest) + 1] = np.cumsum(smallest)
        self.levels = np.unique(need[np.isfinite(need)])
        self.need = np.where(np.isfinite(need), np.searchsorted(self.levels, np.where(np.isfinite(need), need, 0.0)),
                             len(self.levels))  # index of the least level; len(levels): impossible

    def value(self, eta, rho, lam, mu):
        """(bound in seconds, subgradients for eta, rho, lam, mu)."""
        dp = self.dp
        tail = np.full(dp.steps - self.H, self.a0)
        dp.finish_price = np.r_[0.0, np.cumsum(np.r_[eta, tail])]
        dp.nu = np.r_[rho, self.nu_at_least[self.H:]]
        pricing = dp.price(lam, mu)
        master, count, work = self.master(eta, rho)
        unfinished = np.array([(pricing.completion >= j).sum() for j in range(1, self.H + 1)], dtype=float)
        value = pricing.value + master / self.n
        grads = (unfinished - count, pricing.decode_work + pricing.prefill_work - work,
                 pricing.usage - dp.capacity, pricing.tokens - dp.token_capacity)
        return value, grads

    def master(self, eta, rho):
        """min over (n, W) of sum_j n_j (a0 + W_j) - eta_j n_j - rho_j W_j, and the minimiser's n and W
        over batches 1..H."""
        n, H, T, G = self.n, self.H, self.T, self.levels
        K = len(G)
        eta = np.r_[eta, np.full(T - H, self.a0)]
        nu = np.r_[self.nu_at_least, np.ones(T + 1 - len(self.nu_at_least))]
        rho = np.r_[rho, nu[H:T]]
        m = np.arange(n + 1, dtype=float)[:, None]
        V = np.full((n + 1, K), np.inf)
        V[n, 0] = 0.0  # before batch 1: all unfinished, no work done
        moves = []
        for j in range(1, T + 1):
            c = np.maximum(m - rho[j - 1], 0.0)  # the cost of a unit of work in batch j with m unfinished
            # reach level L' >= L in batch j: V[m, L] + c (G[L'] - G[L]), the best L by a running minimum
            base = V - c * G[None, :]
            low = np.minimum.accumulate(base, axis=1)
            from_level = np.maximum.accumulate(np.where(base == low, np.arange(K)[None, :], 0), axis=1)
            after = low + c * G[None, :] + (self.a0 - eta[j - 1]) * m
            # then m' <= m unfinished after batch j (m' = 0: all done)
            best = np.minimum.accumulate(after[::-1], axis=0)[::-1]
            ranked = np.where(after == best, np.arange(n + 1)[:, None], n + 1)
            from_count = np.minimum.accumulate(ranked[::-1], axis=0)[::-1]
            level_needed = self.need[min(j, T), n - np.arange(n + 1)]
            least = self.unfinished_after[j] if j < len(self.unfinished_after) else 0
            feasible = (np.arange(K)[None, :] >= level_needed[:, None]) & (m >= least)
            V = np.where(feasible, best, np.inf)
            moves.append((from_level.astype(np.int32), from_count.astype(np.int32)))
        level = int(np.argmin(V[0]))
        value, count_now = float(V[0, level]), 0
        count, work = np.zeros(H), np.zeros(H)
        for j in range(T, 0, -1):
            from_level, from_count = moves[j - 1]
            m_j = int(from_count[count_now, level])
            before = int(from_level[m_j, level])
            if j <= H:
                count[j - 1], work[j - 1] = m_j, G[level] - G[before]
            count_now, level = m_j, before
        return value, count, work


def _unfinished_after(dp: LagrangianBound, batches: int) -> np.ndarray:
    """Per j = 0..batches: the fewest requests unfinished after j batches (nu of batch j + 1), except
    that where nu reaches its floor of 1 all may be done (0): a relaxation, so that the master can finish."""
    out = np.r_[dp.n, dp.nu[1:batches + 1], np.ones(max(0, batches - len(dp.nu) + 1))].astype(float)
    out[out <= 1] = 0.0
    return out


def improve(bound: MasterBound, seconds: float, target: float, start: str):
    """Projected subgradient steps, each block (eta, rho, lam, mu) with its own Polyak step."""
    H = bound.H
    eta = np.full(H, bound.a0) if start == "shipped" else np.zeros(H)
    rho = bound.nu_at_least[:H].copy() if start == "shipped" else np.zeros(H)
    lam, mu = np.zeros(H), np.zeros(H)
    best, theta, stall, passes, t0 = -math.inf, FIRST_STEP, 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds and theta > 1e-9:
        value, grads = bound.value(eta, rho, lam, mu)
        passes += 1
        if value > best + 1e-12:
            best, stall = value, 0
        else:
            stall += 1
            if stall >= STALL_ITERATIONS:
                theta, stall = theta / 2, 0
        g_eta, g_rho, g_lam, g_mu = (g.copy() for g in grads)
        g_rho[(rho >= bound.nu_at_least[:H]) & (g_rho > 0)] = 0.0
        g_lam[(lam <= 0) & (g_lam < 0)] = 0.0
        g_mu[(mu <= 0) & (g_mu < 0)] = 0.0
        blocks = [g for g in (g_eta, g_rho, g_lam, g_mu) if g @ g > 0]
        if not blocks:
            break
        steps = [theta * (target - value) * bound.n / (len(blocks) * float(g @ g)) if g @ g > 0 else 0.0
                 for g in (g_eta, g_rho, g_lam, g_mu)]
        eta = eta + steps[0] * g_eta
        rho = np.minimum(bound.nu_at_least[:H], rho + steps[1] * g_rho)
        lam = np.maximum(0.0, lam + steps[2] * g_lam)
        mu = np.maximum(0.0, mu + steps[3] * g_mu)
    return best, passes


def main() -> int:
    import argparse

    from kvbound.schedulers import get_scheduler, simulate
    from kvbound.workload import load_case

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--start", choices=("shipped", "zero"), default="zero",
                    help="multipliers of the shipped bound (eta = a0, rho = nu) or all 0")
    args = ap.parse_args()
    instance = load_case(args.case)
    result = simulate(instance, get_scheduler("sjf-mc"))
    schedule, target = result.schedule, result.replay.metrics.mean_latency
    bound = MasterBound(instance, max(1, int(1.1 * len(schedule.batches))))
    best, passes = improve(bound, args.seconds, target, args.start)
    print(f"{args.case}: bound {best:.6g} s after {passes} passes; sjf-mc {target:.6g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
