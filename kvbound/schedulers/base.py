"""The simulator: runs a scheduling policy over an instance, one batch at a time.

Every batch a policy proposes goes through `ReplayState.apply`, the one implementation
of the semantics, so a schedule the simulator returns is valid by construction (the
tests replay it once more from its JSON).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from ..accounting import round_to_blocks
from ..errors import SchedulerStuck
from ..schedule import Batch, Replay, ReplayState, Schedule, ScheduleError
from ..workload import Instance


class Policy:
    """A scheduler: keeps its queues, proposes the next batch from the replay state.

    Subclasses implement `next_batch`; `waiting` is a sorted list of (key, id) and
    `reserved` maps each running request to the KV tokens the policy holds for it.
    """

    name = "policy"

    def __init__(self):
        self.instance: Instance | None = None

    # --- set-up -------------------------------------------------------------------
    def refuse_reason(self, instance: Instance) -> str | None:
        """Why this policy cannot serve `instance` at all, or None."""
        return None

    def reset(self, instance: Instance) -> None:
        self.instance = instance
        self.waiting: list[tuple] = []
        self.reserved: dict[int, int] = {}
        self.kv_reserved = 0
        s = instance.system
        self.b = s.block_size
        self.C, self.M = s.max_batch_tokens, s.kv_capacity

    def waiting_key(self, i: int) -> tuple:
        return (self.instance.requests[i].arrival, i)

    # --- queues -------------------------------------------------------------------
    def blocks(self, tokens: int) -> int:
        return round_to_blocks(tokens, self.b)

    def arrive(self, i: int) -> None:
        bisect.insort(self.waiting, (self.waiting_key(i), i))

    def reserve(self, i: int, tokens: int) -> None:
        old = self.reserved.get(i, 0)
        self.kv_reserved += self.blocks(tokens) - self.blocks(old)
        self.reserved[i] = tokens

    def release(self, i: int) -> None:
        self.kv_reserved -= self.blocks(self.reserved.pop(i))

    def evict_to_waiting(self, i: int, evicted: list[int]) -> None:
        self.release(i)
        evicted.append(i)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.reserved

    def next_batch(self, st: ReplayState) -> Batch:
        raise NotImplementedError

    def after_batch(self, st: ReplayState, batch: Batch) -> None:
        for i in st.done:  # the requests this batch finished
            self.release(i)
        for i in batch.evict:
            self.arrive(i)


def future_kv_fits(base: np.ndarray, start: np.ndarray, last: np.ndarray, capacity: int, block: int) -> bool:
    """MC-SF's memory test: request x holds base_x + max(0, t - start_x) KV tokens (block-rounded)
    in future batch t = 0, 1, ... while t <= last_x; is the total within `capacity` in every batch?
    Each term only grows until its request ends, so the batches where one ends are the ones to check."""
    ts = np.unique(last)
    kv = round_to_blocks(base[None, :] + np.maximum(0, ts[:, None] - start[None, :]), block)
    return bool((np.where(last[None, :] >= ts[:, None], kv, 0).sum(axis=1) <= capacity).all())


@dataclass
class SimulationResult:
    """The policy's schedule and the validator's replay of it: `simulate` applies every batch with
    `ReplayState.apply`, the replay `kvbound.validate` runs, so `replay` is the schedule's validation."""

    policy: str
    schedule: Schedule
    replay: Replay


def simulate(instance: Instance, policy: Policy) -> SimulationResult:
    """Run `policy` on `instance`; the returned schedule is valid under the semantics."""
    from ..errors import SchedulerRefused

    reason = policy.refuse_reason(instance)
    if reason:
        raise SchedulerRefused(f"scheduler {policy.name} cannot serve {instance.source or 'this case'}: {reason}")
    policy.reset(instance)
    st = ReplayState(instance)
    arrivals = st.arrival
    order = sorted(range(len(arrivals)), key=arrivals.__getitem__)
    k = len(order)
    ptr = 0
    batches: list[Batch] = []
    # Without evictions every batch processes >= 1 token and some token is generated within
    # sum(I + O) batches; a policy that goes longer without generating anything is looping.
    patience = int(sum(st.prompt) + sum(st.output)) + k + 16
    last_progress = 0
    generated = 0
    while st.unfinished:
        now = st.now
        if policy.idle and ptr < k and arrivals[order[ptr]] > now:
            now = arrivals[order[ptr]]  # nothing can run: time jumps to the next arrival
        while ptr < k and arrivals[order[ptr]] <= now:
            policy.arrive(order[ptr])
            ptr += 1
        batch = policy.next_batch(st)
        if not batch.tokens and not batch.evict:
            raise SchedulerStuck(f"scheduler {policy.name} is stuck at {now:.6g} s: "
                                 f"{len(policy.waiting)} waiting and {len(policy.reserved)} running requests, "
                                 "and it schedules nothing")
        batch.start = now
        # the schedule keeps a copy of what was applied: a policy that later changed its batch's dict
        # would otherwise report a schedule other than the one replayed
        applied = Batch(dict(batch.tokens), tuple(batch.evict), now)
        try:
            st.apply(applied)
        except ScheduleError as exc:  # a policy bug, not bad input: say so plainly
            raise RuntimeError(f"scheduler {policy.name} produced an invalid batch: {exc}") from exc
        batches.append(applied)
        policy.after_batch(st, batch)
        total = st.generated
        if total != generated:
            generated, last_progress = total, len(batches)
        elif len(batches) - last_progress > patience:
            raise SchedulerStuck(f"scheduler {policy.name} livelocks: {patience} batches without generating a token "
                                 f"(it keeps evicting and refilling); at {st.now:.6g} s, {st.unfinished} requests unfinished")
    return SimulationResult(policy.name, Schedule(instance.requests, batches), st.finish())
