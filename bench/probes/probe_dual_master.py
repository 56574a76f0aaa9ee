"""Probe: how far the Lagrangian bound's subgradient method is from its best multipliers (a Dantzig-Wolfe master).

    python bench/probes/probe_dual_master.py CASE [--seconds 60] [--start sjf-mc] [--subgradient 60]

A Dantzig-Wolfe master over the trajectories the bound prices (docs/formulation.md, "The
Lagrangian bound"): an LP whose columns are the trajectories priced so far, with the KV and token
rows of batches 1..H (penalised slack keeps every restricted master feasible; any duals still give
a bound), one convexity row per request, and the batch-sharing term as max(nu_j D_j, S_j^2) through
t_j >= nu_j D_j and tangent cuts t_j >= 2 s S_j - s^2, added where the master's S_j^2 exceeds t_j.
Each round prices at the master's duals (lambda, mu; theta_j = the cut rows' dual weight / alpha,
sigma_j their weighted tangent point), a certified Lagrangian value, and adds the new trajectories.
The master's LP value is an upper limit on what any multipliers give. `--subgradient S` first runs
the shipped method for S seconds at the same horizon, for comparison.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from kvbound.bounds.lagrangian import ALPHAS, LagrangianBound
from kvbound.objective import Objective
from kvbound.schedulers import run_scheduler
from kvbound.io.cases import load_case


def priced_columns(bound: LagrangianBound, lam: np.ndarray, mu: np.ndarray):
    """The Lagrangian value at (lam, mu) and the current sharing, each request's trajectory as
    sparse H-vectors (KV, tokens, decode work, decode sqrt-work), and its cost without the
    multiplier and batch-1..H decode terms (the master prices those)."""
    columns = []
    pricing = bound.price(lam, mu, columns=columns)
    parts = {key: ([], [], []) for key in "KTDS"}

    def put(key, batch, requests, values):
        parts[key][0].append(np.full(len(requests), batch))
        parts[key][1].append(requests)
        parts[key][2].append(values)

    for j, resident, kv, decoding, refilling, refill_tokens, priced_in, work, root in columns:
        put("K", j - 1, resident, kv)
        put("T", j - 1, decoding, np.ones(len(decoding)))
        if priced_in >= 0 and len(refilling):
            put("T", priced_in, refilling, refill_tokens)
        put("D", j - 1, decoding, work)
        put("S", j - 1, decoding, root)
    shape = (bound.H, bound.n)
    mats = {key: sp.csc_matrix((np.concatenate(v[2]), (np.concatenate(v[0]), np.concatenate(v[1]))), shape=shape)
            for key, v in parts.items()}
    assert np.allclose(np.asarray(mats["K"].sum(axis=1)).ravel(), pricing.usage)
    assert np.allclose(np.asarray(mats["T"].sum(axis=1)).ravel(), pricing.tokens)
    nu, theta, sigma = bound.nu[:bound.H], bound.sharing, bound.sharing_point
    decode = mats["D"].T @ ((1 - theta) * nu) + mats["S"].T @ (2 * theta * sigma)
    base = pricing.cost - mats["K"].T @ lam - mats["T"].T @ mu - bound.alpha * decode
    return pricing.value, base, mats


def priced_at(bound: LagrangianBound, alpha: float, lam: np.ndarray, mu: np.ndarray):
    """The bound's pricing at work weight `alpha` (it stays set), through its public `alpha` and `price`."""
    bound.alpha = alpha
    return bound.price(lam, mu)


class DualMaster:
    def __init__(self, bound: LagrangianBound, penalty: float):
        self.bound, self.penalty = bound, penalty
        self.base, self.owner, self.seen = [], [], set()
        self.cols = {key: [] for key in "KTDS"}
        self.cuts: list[tuple[int, float]] = []

    def add(self, base, mats) -> None:
        for r in range(self.bound.n):
            key = (r,) + tuple(mats[k][:, r].indices.tobytes() + mats[k][:, r].data.tobytes() for k in "KTD")
            if key not in self.seen:
                self.seen.add(key)
                self.base.append(base[r])
                self.owner.append(r)
                for k in "KTDS":
                    self.cols[k].append(mats[k][:, r])

    def solve(self):
        b, H, m = self.bound, self.bound.H, len(self.base)
        K, T, D, S = (sp.hstack(self.cols[k]).tocsr() for k in "KTDS")
        Z, I = sp.csr_matrix((H, H)), sp.identity(H, format="csr")
        nc = len(self.cuts)
        cj = np.array([c[0] for c in self.cuts], dtype=int)
        cs = np.array([c[1] for c in self.cuts])
        cut_rows = sp.diags(2 * cs) @ S[cj] if nc else sp.csr_matrix((0, m))
        cut_t = sp.csr_matrix((-np.ones(nc), (np.arange(nc), cj)), shape=(nc, H))
        # columns: trajectories (m), t_j (H), KV slack (H), token slack (H)
        A_ub = sp.vstack([sp.hstack([K, Z, -I, Z]), sp.hstack([T, Z, Z, -I]),
                          sp.hstack([sp.diags(b.nu[:H]) @ D, -I, Z, Z]),
                          sp.hstack([cut_rows, cut_t, sp.csr_matrix((nc, 2 * H))])]).tocsr()
        b_ub = np.r_[np.full(H, b.capacity), np.full(H, b.token_capacity), np.zeros(H), cs ** 2]
        A_eq = sp.csr_matrix((np.ones(m), (self.owner, np.arange(m))), shape=(b.n, m + 3 * H))
        c = np.r_[self.base, np.full(H, b.alpha), np.full(2 * H, self.penalty)]
        bounds = [(0, None)] * m + [(None, None)] * H + [(0, None)] * (2 * H)
        res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=np.ones(b.n), bounds=bounds, method="highs")
        if res.status != 0:
            raise RuntimeError(res.message)
        dual = -res.ineqlin.marginals
        lam, mu, cut_dual = dual[:H], dual[H:2 * H], dual[3 * H:]
        weight = np.bincount(cj, weights=cut_dual, minlength=H) if nc else np.zeros(H)
        point = np.bincount(cj, weights=cut_dual * cs, minlength=H) if nc else np.zeros(H)
        theta = np.clip(weight / b.alpha, 0.0, 1.0) if b.alpha else np.zeros(H)
        sigma = np.where(weight > 0, point / np.maximum(weight, 1e-300), 0.0)
        x, t = res.x[:m], res.x[m:m + H]
        return res.fun, lam, mu, theta, sigma, S @ x, t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--start", default="sjf-mc", help="the schedule whose batches x 1.1 give the horizon")
    ap.add_argument("--subgradient", type=float, default=0.0, help="seconds of the shipped method first")
    ap.add_argument("--penalty", type=float, default=100.0, help="slack price, in intercepts per token of M")
    args = ap.parse_args()
    instance, objective = load_case(args.case), Objective.parse("mean_latency")
    start = run_scheduler(instance, args.start)
    target = objective.of(start.replay.metrics)
    horizon = int(1.1 * len(start.schedule.batches))
    if args.subgradient:
        began, shipped, passes = time.perf_counter(), LagrangianBound(instance, objective, horizon), 0
        for value, _, _ in shipped.iterate(target):
            passes += 1
            if time.perf_counter() - began > args.subgradient:
                break
        print(f"subgradient: {value:.6g} s after {passes} passes (H = {shipped.H})", flush=True)
        horizon = shipped.H
    bound = LagrangianBound(instance, objective, horizon)
    began = time.perf_counter()
    zero = np.zeros(bound.H)
    trials = {a: priced_at(bound, a, zero, zero) for a in ALPHAS}
    bound.alpha = max(trials, key=lambda a: trials[a].value)
    const = ((1.0 - bound.alpha) * bound.pairwise - bound.arrival_sum) / bound.n
    master = DualMaster(bound, args.penalty * instance.cost.intercept / instance.system.kv_capacity)
    best, base, mats = priced_columns(bound, zero, zero)
    master.add(base, mats)
    master.cuts = [(j, s) for j, s in enumerate(np.asarray(mats["S"].sum(axis=1)).ravel()) if s > 0]
    print(f"{args.case}: {bound.n} requests, H = {bound.H}, alpha = {bound.alpha}, zero multipliers {best:.6g} s")
    rounds = 0
    while time.perf_counter() - began < args.seconds:
        lp, lam, mu, theta, sigma, S, t = master.solve()
        bound.sharing, bound.sharing_point = theta, sigma
        value, base, mats = priced_columns(bound, lam, mu)
        master.add(base, mats)
        best = max(best, value)
        new = [(j, S[j]) for j in np.flatnonzero(S ** 2 > t * (1 + 1e-9) + 1e-12)]
        master.cuts += new
        rounds += 1
        print(f"  round {rounds}: master LP {lp / bound.n + const:.6g}  Lagrangian {value:.6g}  best {best:.6g}  "
              f"trajectories {len(master.base)}  cuts {len(master.cuts)}  {time.perf_counter() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
