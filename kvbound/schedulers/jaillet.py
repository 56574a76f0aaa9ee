"""Policies from Jaillet et al., "Online Scheduling for LLM Inference with KV Cache Constraints".

* `MCSF` (their Algorithm 2, memory-constrained shortest-first): every running request
  decodes each batch; waiting requests are admitted in order of increasing output length
  while the KV the admitted set will hold at every future batch (each request grows by one
  token a batch until it finishes) stays within M. It never evicts.
* `FcfsProtect` (their Section 7 alpha-protection greedy): running requests decode first;
  waiting prompts are admitted first-come first-served while the KV in use stays within
  (1 - alpha) M; when the running requests' next decodes do not fit in M, all of them are
  cleared (evicted) and go back to the waiting queue.

Neither chunks prefills; both put prefills and decodes in one batch, as in that paper.
"""
from __future__ import annotations

import numpy as np

from ..errors import SchedulerStuck
from ..schedule import Batch, ReplayState
from ..workload import Instance
from .base import Policy, future_kv_fits
from .registry import policy, register


def _prompt_too_long(instance: Instance, limit: int, what: str) -> str | None:
    for i, r in enumerate(instance.requests):
        if r.prompt > limit:
            return f"request {i} has a prompt of {r.prompt} tokens, more than {what} = {limit}, and this scheduler does not chunk prefills"
    return None


class MCSF(Policy):
    name = "mcsf"

    def refuse_reason(self, instance: Instance) -> str | None:
        return _prompt_too_long(instance, instance.system.max_prefill_tokens, "P")

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        self.P = instance.system.max_prefill_tokens

    def waiting_key(self, i: int) -> tuple:
        r = self.instance.requests[i]
        return (r.output, r.arrival)

    def _fits(self, base: np.ndarray, last: np.ndarray) -> bool:
        """KV of the set at each future batch t (request x holds base_x + t while t <= last_x) is within M."""
        return future_kv_fits(base, np.zeros_like(base), last, self.M, self.b)

    def next_batch(self, st: ReplayState) -> Batch:
        m, n, out = st.m, st.n, st.output
        running = sorted(self.reserved, key=lambda i: (st.arrival[i], i))
        tokens = {i: 1 for i in running}  # every running request is decode-type: prompts are never chunked
        base = [m[i] + 1 for i in running]
        last = [out[i] - n[i] - 1 for i in running]
        tok = len(running)
        ptok = 0
        admitted = []
        for key, i in self.waiting:
            c = st.prompt[i]
            if tok + c > self.C or ptok + c > self.P or len(running) + len(admitted) + 1 > self.C:
                break
            if not self._fits(np.array(base + [c]), np.array(last + [out[i] - 1])):
                break
            base.append(c)
            last.append(out[i] - 1)
            admitted.append(i)
            tokens[i] = c
            tok += c
            ptok += c
            self.reserve(i, st.prompt[i] + out[i] - 1)
        if admitted:
            self.waiting = self.waiting[len(admitted):]
        return Batch(tokens, ())


class FcfsProtect(Policy):
    name = "fcfs-protect"

    def __init__(self, alpha: float = 0.2):
        super().__init__()
        if not 0 <= alpha < 1:
            raise ValueError("fcfs-protect: alpha must be in [0, 1)")
        self.alpha = alpha

    def refuse_reason(self, instance: Instance) -> str | None:
        reason = _prompt_too_long(instance, instance.system.max_prefill_tokens, "P")
        if reason:
            return reason
        limit = (1 - self.alpha) * instance.system.kv_capacity
        for i, r in enumerate(instance.requests):
            if instance.system.blocks(r.prompt) > limit:
                return f"request {i}: its prompt of {r.prompt} tokens never fits under the protection threshold (1 - alpha) M = {limit:g}"
        return None

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        self.P = instance.system.max_prefill_tokens
        self.threshold = (1 - self.alpha) * self.M

    def next_batch(self, st: ReplayState) -> Batch:
        m, prompt, n = st.m, st.prompt, st.n
        blocks = self.blocks
        running = sorted(self.reserved, key=lambda i: (st.arrival[i], i))
        tokens: dict[int, int] = {}
        evicted: list[int] = []
        kv = sum(blocks(m[i] + 1) for i in running)
        if kv > self.M:  # overflow: clear every running request
            for i in running:
                self.evict_to_waiting(i, evicted)
            kv = 0
            running = []
        for i in running[: self.C]:
            tokens[i] = 1
        kv -= sum(blocks(m[i] + 1) - blocks(m[i]) for i in running[self.C:])
        tok = len(tokens)
        ptok = 0
        admitted = 0
        for key, i in self.waiting:
            S = prompt[i] + n[i]
            if tok + S > self.C or ptok + S > self.P or kv + blocks(S) > self.threshold:
                break
            tokens[i] = S
            tok += S
            ptok += S
            kv += blocks(S)
            self.reserve(i, S)
            admitted += 1
        self.waiting = self.waiting[admitted:]
        if not tokens and not evicted and self.waiting and not self.reserved:
            i = self.waiting[0][1]
            raise SchedulerStuck(f"scheduler {self.name} (alpha = {self.alpha}) is stuck: request {i} needs a refill of "
                                 f"{prompt[i] + n[i]} tokens, more than the protection threshold (1 - alpha) M = {self.threshold:g}")
        return Batch(tokens, tuple(evicted))


register(policy("mcsf", MCSF,
                "MC-SF: keep running requests, admit shortest output first while the future peak KV fits; never evicts (Jaillet et al. Alg. 2)"))
register(policy("fcfs-protect", FcfsProtect,
                "alpha-protection greedy: FCFS admission under (1 - alpha) M, clears all running requests on overflow; "
                "alpha = 0.2 (Jaillet et al. Sec. 7)",
                options=("alpha",)))
