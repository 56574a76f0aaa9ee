"""Apt-Serve's per-iteration scheduling (Gao et al., SIGMOD 2025, Section 5), with KV cache only.

Each batch is either a prefill or a decode iteration, whichever queue has the larger cumulative
pending time (ties: prefill). A request's pending time is now minus its arrival while it has not
produced a token, else now minus the time of its latest token (Section 4.2). Within the iteration
the candidates (the waiting queue, or the running queue) are taken greedily by pending time per
unit of memory, p_i / m_i, highest first, each while it fits (a 0-1 knapsack's greedy; a request
that does not fit is skipped, the next one is tried):

* prefill iteration: m_i = the KV of its whole sequence S = I + n (prompts are not chunked; a
  preempted request refills all of S); the memory left is M minus the running requests' KV; the
  batch's C and P bound the tokens;
* decode iteration: m_i = m + 1, under all of M (the paper's M^e = M); running requests left out
  keep their KV, and while that does not fit the lowest-ratio ones among them are preempted
  (recompute) and go back to waiting.

Not modelled: the hidden cache (Apt-Serve's beta = 1 option, which halves a request's memory for
extra compute), so this is its beta = 0 special case; and its SLO-aware demotion of requests that
already missed the SLO. Like vLLM without chunking it refuses a case whose prompt, or refill of
up to I + O - 1 tokens, exceeds P.
"""
from __future__ import annotations

from ..schedule import Batch, ReplayState
from ..workload import Instance
from .base import Policy
from .registry import policy, register


def refill_too_long(instance: Instance, P: int) -> str | None:
    """Why a policy that never chunks but may evict cannot serve `instance` with prefill budget P, or None."""
    for i, r in enumerate(instance.requests):
        if r.prompt > P:
            return f"request {i} has a prompt of {r.prompt} tokens, more than P = {P}, and this scheduler does not chunk prefills"
        if r.peak_kv > P:
            return (f"request {i} may need a refill of up to I + O - 1 = {r.peak_kv} tokens after an eviction, "
                    f"more than P = {P}, and this scheduler does not chunk prefills")
    return None


class AptGreedy(Policy):
    name = "apt-greedy"

    def refuse_reason(self, instance: Instance) -> str | None:
        return refill_too_long(instance, instance.system.max_prefill_tokens)

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        self.P = instance.system.max_prefill_tokens

    def next_batch(self, st: ReplayState) -> Batch:
        arrival, n, last = st.arrival, st.n, st.last_token
        now = max([st.now] + [arrival[i] for _, i in self.waiting])
        waiting = [i for _, i in self.waiting]
        running = list(self.reserved)

        def pending(i: int) -> float:
            return now - (last[i] if n[i] else arrival[i])

        prefill_first = bool(waiting) and (not running or sum(map(pending, waiting)) >= sum(map(pending, running)))
        kinds = (self._prefill, self._decode) if prefill_first else (self._decode, self._prefill)
        for kind in kinds:
            batch = kind(st, waiting, running, pending)
            if batch is not None:
                return batch
        return Batch({}, ())

    def _greedy(self, ids, memory, pending):
        """ids by pending time per unit of memory, highest first (ties: earlier arrival, lower id)."""
        arrival = self.instance.requests
        return sorted(ids, key=lambda i: (-pending(i) / memory(i), arrival[i].arrival, i))

    def _prefill(self, st: ReplayState, waiting, running, pending) -> Batch | None:
        if not waiting:
            return None
        prompt, n = st.prompt, st.n
        blocks = self.blocks
        free = self.M - self.kv_reserved
        tokens: dict[int, int] = {}
        tok = 0
        for i in self._greedy(waiting, lambda i: blocks(prompt[i] + n[i]), pending):
            S = prompt[i] + n[i]
            if tok + S <= min(self.C, self.P) and blocks(S) <= free:
                tokens[i] = S
                tok += S
                free -= blocks(S)
        if not tokens:
            return None
        for i in tokens:
            self.reserve(i, tokens[i])
        self.waiting = [w for w in self.waiting if w[1] not in tokens]
        return Batch(tokens, ())

    def _decode(self, st: ReplayState, waiting, running, pending) -> Batch | None:
        if not running:
            return None
        m = st.m
        blocks = self.blocks
        order = self._greedy(running, lambda i: blocks(m[i] + 1), pending)
        chosen, used = [], 0
        for i in order:
            if len(chosen) < self.C and used + blocks(m[i] + 1) <= self.M:
                chosen.append(i)
                used += blocks(m[i] + 1)
        picked = set(chosen)
        rest = [i for i in order if i not in picked]
        held = sum(blocks(m[i]) for i in rest)
        evicted: list[int] = []
        while used + held > self.M:  # the lowest-ratio idle requests make room
            victim = rest.pop()
            held -= blocks(m[victim])
            self.evict_to_waiting(victim, evicted)
        for i in chosen:
            self.reserve(i, m[i] + 1)
        return Batch({i: 1 for i in chosen}, tuple(evicted))


register(policy("apt-greedy", AptGreedy,
                "Apt-Serve (Gao et al. Sec. 5) with KV cache only (beta = 0; its hidden cache is not modelled): "
                "prefill or decode iteration by the larger summed pending time, requests greedily by pending "
                "time per unit of KV under the memory left; no chunking, P = C; decode iterations preempt "
                "the lowest-ratio idle requests when M runs out"))
