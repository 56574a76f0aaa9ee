"""Probe: a time-indexed Lagrangian bound for mean latency against the shipped bounds (not part of kvbound).

    python bench/probes/probe_timeindexed.py CASE [--passes N]     # e.g. bench/cases_real/splitwise_conv_30_loose_t0.toml

Issue 14 names a time-indexed decomposition as the natural candidate for mean latency. This is its
Lagrangian form, measured and not adopted (bench/results/NOTES.md, "Time-indexed bound"): cut time
into slots of length delta = s * a0 (a0 the intercept) and split every batch's time over the slots
it overlaps. For every schedule and slot t

    a0 Y_t + sum_r W_r(t) <= delta        (the machine is busy at most delta in the slot)
    D_r(t) <= Y_t                         (a request is in at most every batch)

with Y_t the slot's share of batches, D_r(t) request r's and W_r(t) r's work there. Dualising both
(rho_t, pi_rt >= 0) separates the requests: each one's cheapest trajectory (its prompt tokens in
its cheapest slots after its arrival, at most tau a slot; then O - 1 decodes in order, at most s a
slot) is a dynamic program, and

    sum_r (C_r - a_r) >= sum_r min_traj [t_end delta + sum_t (rho_t W_r(t) + pi_rt D_r(t))] - sum_r a_r
                         - delta sum_t rho_t + (delta / a0) sum_t min(0, a0 rho_t - sum_r pi_rt).

The multipliers start from a heuristic schedule's unfinished counts and follow projected
subgradient steps (Polyak, towards that schedule's value).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
from scipy.ndimage import minimum_filter1d

import kvbound
from kvbound.objective import Objective
from kvbound.workload import Instance

#: at most this many slots: delta = s * a0 with the smallest whole s that covers the horizon
MAX_SLOTS = 600
FIRST_STEP = 0.1
STALL_ITERATIONS = 10


@dataclass
class TimePricing:
    value: float  # seconds: a lower bound on the objective (mean)
    work: np.ndarray  # per slot: the cheapest trajectories' work
    mass: np.ndarray  # [request, slot]: the cheapest trajectories' share of batches
    busy: np.ndarray  # per slot: Y_t chosen by the Lagrangian (0 or delta / a0)
    end: np.ndarray  # per request: the slot its cheapest trajectory completes in


class TimeIndexedBound:
    """The bound for one instance and a mean objective, over `horizon` seconds of slots."""

    def __init__(self, instance: Instance, objective: str | Objective, horizon: float, max_slots: int = MAX_SLOTS):
        objective = Objective.parse(objective)
        if not objective.is_mean:
            raise ValueError("the time-indexed bound is for mean latency and mean TTFT")
        cost, system = instance.cost, instance.system
        self.instance, self.objective, self.n = instance, objective, len(instance)
        a0 = self.a0 = cost.intercept
        self.s = max(1, math.ceil(horizon / (max_slots * a0)))
        self.delta = self.s * a0
        self.H = max(1, math.ceil(horizon / self.delta))
        prompt = instance.prompts.astype(np.int64)
        self.prompt = prompt
        self.decodes = (np.zeros(self.n, dtype=np.int64) if objective.first_token
                        else np.array([r.output - 1 for r in instance.requests], dtype=np.int64))
        P = min(system.max_prefill_tokens, system.max_batch_tokens)
        self.P = P
        # a request's prefill tokens in one slot: its chunks' batches take a0 + per_token c each
        self.tau = self.delta / (a0 / P + cost.per_token) if cost.per_token > 0 or a0 > 0 else float("inf")
        self.k1, self.k3 = cost.per_token, cost.prefill_attention
        self.attention = cost.prefill_attention * prompt.astype(float) ** 2
        arrivals = instance.arrivals
        self.arrival_sum = float(arrivals.sum())
        self.first_slot = np.floor(arrivals / self.delta).astype(np.int64)
        # flat layout: per request s sentinels (inf), then k = 0..K decode pieces done
        s = self.s
        lengths = s + self.decodes + 1
        self.base = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64) + s  # index of k = 0
        L = int(lengths.sum())
        self.L = L
        owner = np.repeat(np.arange(self.n), lengths)
        k = np.arange(L) - self.base[owner]
        self.owner, self.k = owner, k
        self.pad = k < 0
        m = prompt[owner] + k - 1  # cached tokens before decode piece k (k >= 1)
        piece = cost.per_token + np.minimum(cost.decode_kv * m, cost.per_token * m + cost.prefill_attention * m * m
                                            + cost.per_prefill_request)
        piece = np.where(k >= 1, piece, 0.0)
        cum = np.zeros(L)
        for r in range(self.n):  # cumulative work of pieces 1..k within each request
            lo = self.base[r]
            cum[lo:lo + self.decodes[r] + 1] = np.cumsum(piece[lo:lo + self.decodes[r] + 1])
        self.cum_work = cum
        self.kf = np.where(self.pad, 0, k).astype(float)
        self.last = self.base + self.decodes

    # ------------------------------------------------------------------ the prefill

    def _prefill(self, price: np.ndarray, rho: np.ndarray):
        """F[r, t]: the cheapest cost of all of r's prompt tokens in slots first_slot..t (at most tau a
        slot, `price[r, t]` a token), its attention at the cheapest rho of those slots; inf where
        they cannot fit."""
        H, tau = self.H, self.tau
        F = np.full((self.n, H), np.inf)
        for r in range(self.n):
            t0, I = int(self.first_slot[r]), int(self.prompt[r])
            if t0 >= H:
                continue
            need = max(1, math.ceil(I / tau - 1e-12))
            rem = I - (need - 1) * tau
            heap: list[float] = []  # the `need` cheapest prices so far, as negatives (a max-heap)
            total = 0.0
            low = math.inf
            row = price[r]
            for t in range(t0, H):
                p = float(row[t])
                low = min(low, float(rho[t]))
                if len(heap) < need:
                    heapq.heappush(heap, -p)
                    total += p
                elif p < -heap[0]:
                    total += p + heapq.heappushpop(heap, -p)
                if len(heap) == need:
                    top = -heap[0]
                    F[r, t] = tau * (total - top) + rem * top + self.attention[r] * low
        return F

    def _prefill_allocation(self, r: int, t_end: int, price: np.ndarray, rho: np.ndarray):
        """The tokens per slot of r's cheapest prefill ending by t_end, and the slot its attention is charged to."""
        t0, I = int(self.first_slot[r]), float(self.prompt[r])
        window = price[r, t0:t_end + 1]
        order = np.argsort(window, kind="stable")
        tokens = np.zeros(t_end + 1 - t0)
        left = I
        for i in order:
            take = min(self.tau, left)
            tokens[i] = take
            left -= take
            if left <= 0:
                break
        at = t0 + int(np.argmin(rho[t0:t_end + 1]))
        return t0, tokens, at

    # ------------------------------------------------------------------ one pricing pass

    def price(self, rho: np.ndarray, pi: np.ndarray) -> TimePricing:
        """The bound at multipliers rho (per slot) and pi ([request, slot]), both >= 0."""
        H, s, delta, n = self.H, self.s, self.delta, self.n
        token_price = self.k1 * rho[None, :] + pi / self.P
        F = self._prefill(token_price, rho)
        V = np.full(self.L, np.inf)
        history = np.empty((H, self.L))
        best = np.full(n, np.inf)
        end = np.full(n, -1, dtype=np.int64)
        nonpad = ~self.pad
        for t in range(H):
            X = V.copy()
            X[self.base] = F[:, t]
            S = rho[t] * self.cum_work + pi[self.owner, t] * self.kf
            Y = np.where(nonpad, X - S, np.inf)
            window = minimum_filter1d(Y, size=s, origin=(s - 1) // 2, mode="constant", cval=np.inf)
            placed = np.empty(self.L)
            placed[0] = np.inf
            placed[1:] = window[:-1]
            placed += S
            Vn = np.minimum(V, placed)
            Vn[self.base] = F[:, t]
            Vn[self.pad] = np.inf
            history[t] = Vn
            finish = np.where(self.decodes > 0, placed[self.last], F[:, t]) + t * delta
            better = finish < best
            best[better] = finish[better]
            end[better] = t
            V = Vn
        # completing after the horizon: at least the slots the remaining pieces need
        k_idx = np.where(self.pad, 0, self.k)
        rest = self.decodes[self.owner] - k_idx
        beyond = V + (H - 1 + np.ceil(rest / s)) * delta
        beyond = np.where(self.pad | (rest == 0), np.inf, beyond)
        tail = np.minimum.reduceat(beyond, self.base - s)
        tail = np.minimum(tail, (H + np.maximum(0, np.ceil(self.decodes / s) - 1)) * delta)
        late = tail < best
        best[late] = tail[late]
        end[late] = H
        share = self.a0 * rho - pi.sum(axis=0)
        busy = np.where(share < 0, delta / self.a0, 0.0)
        value = (best.sum() - self.arrival_sum - delta * rho.sum() + float((busy * share).sum())) / n
        work, mass = self._backtrack(rho, pi, token_price, F, history, end)
        return TimePricing(value, work, mass, busy, end)

    def _backtrack(self, rho, pi, token_price, F, history, end):
        H, s, n = self.H, self.s, self.n
        work = np.zeros(H)
        mass = np.zeros((n, H))
        pos = self.decodes.copy()  # pieces still to place, walking back
        live = end < H  # trajectories that end inside the horizon (others: no subgradient)
        prefilled = np.zeros(n, dtype=bool)
        offsets = np.arange(1, s + 1)
        for t in range(H - 1, -1, -1):
            act = live & ~prefilled & (end >= t)
            if not act.any():
                continue
            prev = history[t - 1] if t > 0 else np.full(self.L, np.inf)
            rs = np.flatnonzero(act)
            k = pos[rs]
            here = self.base[rs] + k
            must = end[rs] == t
            idle = ~must & (k >= 1) & (history[t][here] == prev[here])
            place = ~idle & (k >= 1)
            pr = rs[place]
            if len(pr):
                kk = pos[pr]
                cand = self.base[pr, None] + kk[:, None] - offsets[None, :]  # i = k - 1 .. k - s
                ok = (kk[:, None] - offsets[None, :]) >= 0
                X = prev[np.clip(cand, 0, self.L - 1)]
                is_zero = (kk[:, None] - offsets[None, :]) == 0
                X = np.where(is_zero, F[pr, t][:, None], X)
                S = rho[t] * self.cum_work[np.clip(cand, 0, self.L - 1)] + pi[pr, t][:, None] * (kk[:, None] - offsets[None, :])
                Yc = np.where(ok, X - S, np.inf)
                j = np.argmin(Yc, axis=1)
                i = kk - offsets[j]
                work[t] += float((self.cum_work[self.base[pr] + kk] - self.cum_work[self.base[pr] + i]).sum())
                mass[pr, t] += kk - i
                pos[pr] = i
            # requests with no decode left: their prefill ended by this slot
            for r in rs[pos[rs] == 0]:
                if prefilled[r]:
                    continue
                prefilled[r] = True
                t0, tokens, at = self._prefill_allocation(int(r), t, token_price, rho)
                work[t0:t + 1] += self.k1 * tokens
                mass[r, t0:t + 1] += tokens / self.P
                work[at] += self.attention[r]
        return work, mass

    # ------------------------------------------------------------------ multipliers

    def initial(self, completions: np.ndarray, decoding: np.ndarray | None = None):
        """Multipliers from a schedule: rho_t = requests arrived and unfinished at the slot's start,
        pi shares a0 rho_t among those (all of them, or `decoding` [request, slot] weights)."""
        starts = np.arange(self.H) * self.delta
        arr = self.instance.arrivals
        waiting = (arr[:, None] <= starts[None, :]) & (completions[:, None] > starts[None, :])
        rho = waiting.sum(axis=0).astype(float)
        weights = waiting.astype(float) if decoding is None else decoding
        total = weights.sum(axis=0)
        pi = np.where(total > 0, self.a0 * rho / np.maximum(total, 1e-300), 0.0)[None, :] * weights
        return rho, pi

    def iterate(self, upper_bound: float, rho: np.ndarray, pi: np.ndarray):
        """Subgradient ascent with Polyak steps towards `upper_bound` (a mean, seconds): yields (best
        bound so far, this pass's pricing) after every pass."""
        self.target = upper_bound
        best, theta, stall = -math.inf, FIRST_STEP, 0
        while True:
            pricing = self.price(rho, pi)
            if best == -math.inf or pricing.value > best + 1e-12 * abs(best):
                best, stall = pricing.value, 0
            else:
                stall += 1
                if stall >= STALL_ITERATIONS:
                    theta, stall = theta / 2, 0
            yield best, pricing
            g = self.a0 * pricing.busy + pricing.work - self.delta
            g[(rho <= 0) & (g < 0)] = 0.0
            h = pricing.mass - pricing.busy[None, :]
            h[(pi <= 0) & (h < 0)] = 0.0
            norm = float(g @ g + (h * h).sum())
            if norm == 0.0 or theta < 1e-9:
                return
            step = theta * (self.target - pricing.value) * self.n / norm
            rho = np.maximum(0.0, rho + step * g)
            pi = np.maximum(0.0, pi + step * h)


def main() -> int:
    import argparse
    import time

    from kvbound.bounds.analytic import analytic_bounds
    from kvbound.schedule import validate
    from kvbound.schedulers import get_scheduler, simulate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--passes", type=int, default=300)
    ap.add_argument("--objective", default="mean_latency", choices=("mean_latency", "mean_ttft"))
    args = ap.parse_args()
    inst = kvbound.load_case(args.case)
    best = None
    for name in ("sjf-mc", "srpt", "srpt:ratio=2", "spt-waves"):
        rep = validate(inst, simulate(inst, get_scheduler(name)).schedule)
        v = getattr(rep.metrics, args.objective)
        if best is None or v < best[0]:
            best = (v, name, rep)
    value, name, rep = best
    analytic = max(b.value for b in analytic_bounds(inst, Objective(args.objective)))
    print(f"best heuristic {name} {value:.6g} s, analytic bound {analytic:.6g} s")
    done = np.asarray(rep.completion if args.objective == "mean_latency" else rep.first_token, dtype=float)
    probe = TimeIndexedBound(inst, args.objective, 1.05 * float(np.max(rep.batch_end)))
    print(f"{probe.H} slots of {probe.delta:.4g} s (s = {probe.s})")
    t0 = time.perf_counter()
    rho, pi = probe.initial(done)
    for i, (bound, pricing) in enumerate(probe.iterate(value, rho, pi)):
        if i % 50 == 0 or i == args.passes - 1:
            print(f"pass {i}: bound {bound:.6g} s ({time.perf_counter() - t0:.1f} s)", flush=True)
        if i >= args.passes - 1:
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
