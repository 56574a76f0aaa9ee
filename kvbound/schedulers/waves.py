"""SPT waves: a planned schedule for mean latency (hypothetical: knows every O).

Requests are ordered shortest first by I + O and cut into consecutive waves whose peak KV
(block-rounded I + O - 1 each) fits in M together. A wave runs alone: each member with its
first token decodes every batch, and the prefill chunks of the others fill what is left of C
and P, in order. Waves never overlap, so nothing is evicted, and long prompts never slow the
decodes of short requests: hybrid batching's cost for mean latency (every batch's time is paid
by every request still unfinished).

The cut comes from dynamic programming over the order. Offline, a wave's length D and the sum S
of its members' completion times measured from its start do not depend on when it starts, so
the sum of completion times is sum over waves (S + D x requests in later waves), minimised
exactly over the cuts (into units of ceil(N / 128) consecutive requests, so that thousands of
requests plan in seconds). With arrivals the plan is the offline one: when nothing runs, the
first wave with an arrived unfinished member starts with its arrived members; members that
arrive while their wave runs join it.
"""
from __future__ import annotations

import math

from ..accounting import account_batch
from ..schedule import Batch, ReplayState
from ..workload import Instance
from .base import Policy
from .registry import policy, register

#: the DP cuts the order into at most about this many units
DP_UNITS = 128


def wave_tokens(members: list[int], m: list[int], n: list[int], prompt: list[int], C: int, P: int) -> dict[int, int]:
    """One batch of a wave: decodes first (one token each), then prefill chunks in member order."""
    tokens: dict[int, int] = {}
    room = C
    for i in members:
        if n[i] >= 1 and room >= 1:  # a member never evicted with its first token is decode-type
            tokens[i] = 1
            room -= 1
    pre_room = min(room, P)
    for i in members:
        if n[i] == 0:
            c = min(prompt[i] - m[i], pre_room)
            if c <= 0:
                break
            tokens[i] = c
            pre_room -= c
    return tokens


def wave_cost(instance: Instance, members: list[int]) -> tuple[float, float]:
    """(D, S) of a wave run alone from time 0: its length and the sum of its members' completion
    times (`tests/test_schedulers.py` checks the plan's estimate against the validator)."""
    reqs, cost, s = instance.requests, instance.cost, instance.system
    prompt = {i: reqs[i].prompt for i in members}
    out = {i: reqs[i].output for i in members}
    m = dict.fromkeys(members, 0)
    n = dict.fromkeys(members, 0)
    live = list(members)
    t = total = 0.0
    while live:
        tokens = wave_tokens(live, m, n, prompt, s.max_batch_tokens, s.max_prefill_tokens)
        t += account_batch(tokens, m, n, prompt).time(cost)
        for i, c in tokens.items():
            m[i] += c
            if m[i] >= prompt[i]:
                n[i] += 1
                if n[i] == out[i]:
                    total += t
        live = [i for i in live if n[i] < out[i]]
    return t, total


def plan_waves(instance: Instance) -> list[list[int]]:
    """The waves: the shortest-first order cut where the DP says (see the module docstring)."""
    reqs, s = instance.requests, instance.system
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].prompt + reqs[i].output, reqs[i].output, i))
    peak = [s.blocks(reqs[i].peak_kv) for i in order]
    size = max(1, math.ceil(len(order) / DP_UNITS))
    bounds = [0]  # unit u is order[bounds[u]:bounds[u + 1]]; a unit that would not fit M is cut short
    while bounds[-1] < len(order):
        a = bounds[-1]
        b, kv = a, 0
        while b < len(order) and b - a < size and kv + peak[b] <= s.kv_capacity:
            kv += peak[b]
            b += 1
        bounds.append(b)
    units, N = len(bounds) - 1, len(order)
    best = [math.inf] * units + [0.0]
    cut = [units] * units
    for u in range(units - 1, -1, -1):
        kv = 0
        for v in range(u + 1, units + 1):
            kv += sum(peak[bounds[v - 1]:bounds[v]])
            if kv > s.kv_capacity:
                break
            D, S = wave_cost(instance, order[bounds[u]:bounds[v]])
            value = S + D * (N - bounds[v]) + best[v]
            if value < best[u]:
                best[u], cut[u] = value, v
    waves, u = [], 0
    while u < units:
        waves.append(order[bounds[u]:bounds[cut[u]]])
        u = cut[u]
    return waves


class SptWaves(Policy):
    name = "spt-waves"

    def __init__(self, waves: list[list[int]] | None = None):
        """`waves`: a plan to follow instead of the DP's (each must fit M)."""
        super().__init__()
        self.plan = waves

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        self.P = instance.system.max_prefill_tokens
        self.waves = self.plan if self.plan is not None else plan_waves(instance)
        self.wave_of = {i: w for w, members in enumerate(self.waves) for i in members}
        self.rank = {i: r for r, i in enumerate(i for members in self.waves for i in members)}
        self.current: int | None = None

    def waiting_key(self, i: int) -> tuple:
        return (self.rank[i],)

    def next_batch(self, st: ReplayState) -> Batch:
        if not self.reserved:  # the first wave in plan order with an arrived member starts
            self.current = min(self.wave_of[i] for _, i in self.waiting)
        joining = [i for _, i in self.waiting if self.wave_of[i] == self.current]
        for i in joining:
            self.reserve(i, st.prompt[i] + st.output[i] - 1)
        if joining:
            self.waiting = [(key, i) for key, i in self.waiting if self.wave_of[i] != self.current]
        members = sorted(self.reserved, key=self.rank.__getitem__)
        return Batch(wave_tokens(members, st.m, st.n, st.prompt, self.C, self.P))


register(policy("spt-waves", SptWaves,
                "shortest I + O first in waves that fit M and run alone (no hybrid mixing across waves), cut by "
                "dynamic programming for the least mean latency; never evicts (hypothetical: knows O)"))
