"""SRPT: shortest remaining processing time first, with prefill chunks that ride along only when worth it.

For mean latency every batch's time is paid by every request present, so a batch should spend
it on the requests closest to done: shortest remaining processing time first, which is optimal on
one preemptive machine with arrivals. A request's remaining time is what it would need alone from
its state: its prefill chunks and decodes, an intercept each, plus its work. Requests are visited
in that order, running and waiting alike (the unified loop, `priority = rank-i` with this order).

Batching is what one machine lacks: a decode adds little to a batch, so decodes always join, but a
prefill chunk makes the batch longer for everyone in it. A lower-priority prefill chunk therefore
joins a batch only if the delay it causes the requests ahead of it (each is slowed by the prefill
work still to do while it runs: min(prefill time left, its batches left x a full chunk's time))
is at most `ratio` x what leaving it out costs: the request waits for them (the longest remaining
time among them), and its chunks later need batches of their own, whose intercepts every other
request present pays. Large ratios fill every batch's budget as rank-i does; 0 never mixes
prefills in. Under light load ratio 1 does best, under heavy load (hundreds of Splitwise code
requests at their arrival times) ratio 2; the warm-start portfolio runs both.
"""
from __future__ import annotations

from ..alone import fewest_batches, remaining_alone
from ..schedule import ReplayState
from ..workload import Instance
from .unified import UnifiedParams, UnifiedScheduler

PARAMS = UnifiedParams(priority="rank-i", hybrid=True, chunked=True)


class Srpt(UnifiedScheduler):
    ranks_by_keys = False  # an admission pattern's holds apply, its order is SRPT's own

    def __init__(self, name: str = "srpt", params: UnifiedParams = PARAMS, ratio: float = 1.0):
        super().__init__(name, params)
        if not ratio >= 0:
            raise ValueError(f"srpt: ratio must be a number >= 0, got {ratio}")
        self.ratio = ratio

    def options(self) -> dict:
        return {"ratio": self.ratio}

    def reset(self, instance: Instance) -> None:
        super().reset(instance)
        self._cost, self._intercept, self._per_token = instance.cost, instance.cost.intercept, instance.cost.per_token
        self._alone: dict[int, tuple[int, float, float]] = {}

    def remaining(self, st: ReplayState, i: int) -> tuple[int, float, float]:
        """Request i alone from its state (m cached, n generated): (batches, time, prefill work time)."""
        return remaining_alone(self._cost, self.P, st.prompt[i], st.output[i], st.m[i], st.n[i])

    def _order(self, st: ReplayState) -> tuple[list[int], list[int]]:
        present = list(self.reserved) + [i for _, i in self.waiting]
        self._alone = {i: self.remaining(st, i) for i in present}
        order = sorted(present, key=lambda i: (self._alone[i][1], i))
        return order, [i for i in order if i in self.reserved]

    def _rides_along(self, st: ReplayState, i: int, c: int, ahead: dict[int, int]) -> bool:
        prefill = self._alone[i][2]
        chunk_time = self.C * self._per_token
        delay = sum(min(prefill, self._alone[a][0] * chunk_time) for a in ahead)
        wait = max(self._alone[a][1] for a in ahead)
        # riding along also saves the intercepts of the chunks' own batches, paid by the rest
        behind = len(self._alone) - len(ahead) - 1
        chunks = fewest_batches(st.prompt[i] + st.n[i] - st.m[i], 1, self.P)
        return delay <= self.ratio * (wait + chunks * self._intercept * behind)
