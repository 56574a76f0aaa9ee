"""Policies from Kossmann et al., "Is the GPU Half-Empty or Half-Full? Practical Scheduling Techniques
for LLMs" (seed paper 003), on the chunked, decode-first engine that paper assumes (vLLM with
chunked prefill: running decodes first, then unfinished prefills, then waiting requests, each chunk
sized by the batch's token room; a running request short of KV preempts, by recompute, the
lowest-priority running request, or itself).

* `Larry` (Section 4.1): waiting requests are ordered by score = queue_len * memory(r) -
  alpha * waiting_time, lowest first, and dispatched while the prompt's KV fits and the batch has
  token room, stopping at the first that does not. The paper writes the score with + alpha and
  dispatches in decreasing order, but says in the same section that LARRY deprioritises large
  prompts under a long queue and prioritises long waits, and that a large alpha degenerates to
  FCFS; only the order used here does all three. Units: memory(r) is the KV the request must
  cache to be dispatched, I + n tokens rounded up to blocks; waiting_time is seconds since its
  arrival; so alpha is in tokens per second (default 1, the paper's Figures 7-11).
* `Trail` (TRAIL+, Section 2): shortest remaining output (O - n, the true lengths) first, running
  and waiting; a running request may additionally be preempted (recompute) for the head waiting
  request when that one has fewer tokens left and its KV does not fit, but only while
  generated / O < c of the running one (c = 0, the paper's best setting, never preempts for
  priority; memory preemption stays as in the engine).
"""
from __future__ import annotations

from ..schedule import Batch, ReplayState
from .unified import UnifiedParams, UnifiedScheduler

#: the engine both run on: decodes first, hybrid batches, chunked prefill with P = C
ENGINE = UnifiedParams(priority="decode", hybrid=True, chunked=True)


def _clock(policy, st: ReplayState) -> float:
    """The time the next batch starts (the simulator may jump to an arrival while nothing runs)."""
    arrival = st.arrival
    return max([st.now] + [arrival[i] for _, i in policy.waiting])


class Larry(UnifiedScheduler):
    def __init__(self, name: str = "larry", params: UnifiedParams = ENGINE, alpha: float = 1.0):
        super().__init__(name, params)
        if not (alpha >= 0 and alpha != float("inf")):
            raise ValueError(f"larry: alpha must be a finite number >= 0, got {alpha}")
        self.alpha = alpha

    def options(self) -> dict:
        return {"alpha": self.alpha}

    def _waiting_order(self, st: ReplayState) -> list[int]:
        now = _clock(self, st)
        q = len(self.waiting)
        prompt, n, arrival, blocks, alpha = st.prompt, st.n, st.arrival, self.blocks, self.alpha
        return sorted((i for _, i in self.waiting),
                      key=lambda i: (q * blocks(prompt[i] + n[i]) - alpha * (now - arrival[i]), arrival[i], i))


class Trail(UnifiedScheduler):
    def __init__(self, name: str = "trail", params: UnifiedParams = ENGINE, c: float = 0.0):
        super().__init__(name, params)
        if not 0 <= c <= 1:
            raise ValueError(f"trail: c must be in [0, 1], got {c}")
        self.c = c

    def options(self) -> dict:
        return {"c": self.c}

    def _remaining(self, st: ReplayState):
        out, n, arrival = st.output, st.n, st.arrival
        return lambda i: (out[i] - n[i], arrival[i], i)

    def _running_rank(self, st: ReplayState) -> list:
        key = self._remaining(st)
        return _LazyKeys(key)

    def _waiting_order(self, st: ReplayState) -> list[int]:
        return sorted((i for _, i in self.waiting), key=self._remaining(st))

    def next_batch(self, st: ReplayState) -> Batch:
        preempted = self._preempt_for_head(st) if self.c > 0 and self.waiting else []
        batch = super().next_batch(st)
        if preempted:
            batch.evict = tuple(preempted) + tuple(batch.evict)
        return batch

    def _preempt_for_head(self, st: ReplayState) -> list[int]:
        """Evict running requests with more tokens left than the head waiting request, early in their
        output (n / O < c), most tokens left first, until the head's KV fits; none if it never would."""
        out, n, prompt = st.output, st.n, st.prompt
        head = self._waiting_order(st)[0]
        need = self.blocks(prompt[head] + n[head])
        if self.kv_reserved + need <= self.M:
            return []
        left = out[head] - n[head]
        victims = sorted((i for i in self.reserved if out[i] - n[i] > left and n[i] < self.c * out[i] and st.m[i] > 0),
                         key=lambda i: (-(out[i] - n[i]), -st.arrival[i], -i))
        chosen, freed = [], 0
        for i in victims:
            if self.kv_reserved - freed + need <= self.M:
                break
            chosen.append(i)
            freed += self.blocks(self.reserved[i])
        if self.kv_reserved - freed + need > self.M:
            return []
        evicted: list[int] = []
        for i in chosen:
            self.evict_to_waiting(i, evicted)
        return evicted


class _LazyKeys:
    """keys[i] computed on access: the running order of TRAIL+ changes as requests generate."""

    def __init__(self, key):
        self._key = key

    def __getitem__(self, i):
        return self._key(i)
