"""What each request does in each batch of a valid schedule (the plots and the interop format need it)."""
from __future__ import annotations

from dataclasses import dataclass

from ..accounting import is_decode_type
from ..schedule import Replay, ReplayState, Schedule, check_requests_match
from ..workload import Instance

PREFILL, DECODE, EVICT = "prefill", "decode", "evict"


@dataclass
class ScheduleRoles:
    """Per batch j: `roles[j]` maps request id -> PREFILL (prefill-type: first prefill, chunk or refill),
    DECODE (decode-type) or EVICT; `holding[j]` are the requests that idle in batch j with cached KV."""

    replay: Replay
    roles: list[dict[int, str]]
    holding: list[tuple[int, ...]]
    kv_after: list[int]  # KV held after each batch (its finished requests freed): what idle time holds

    def prefill_set(self, j: int) -> list[int]:
        return sorted(i for i, role in self.roles[j].items() if role == PREFILL)


def schedule_roles(instance: Instance, schedule: Schedule) -> ScheduleRoles:
    """Replay `schedule` (raises ScheduleError if it is invalid) and classify every request in every batch.

    The classification is the semantics' (docs/semantics.md section 3): decode-type when n >= 1
    and only the last token is uncached (S - m = 1, m taken after the batch's evictions).
    """
    check_requests_match(instance, schedule)
    st = ReplayState(instance)
    roles: list[dict[int, str]] = []
    holding: list[tuple[int, ...]] = []
    kv_after: list[int] = []
    cached: set[int] = set()  # requests with m >= 1; only the batch's requests can change m
    for batch in schedule.batches:
        evicted = set(batch.evict)
        role = {i: EVICT for i in batch.evict}
        for i in batch.tokens:
            if 0 <= i < len(st.m):  # an unknown id is left for apply() to reject
                m = 0 if i in evicted else st.m[i]
                role[i] = DECODE if is_decode_type(st.n[i], st.prompt[i] + st.n[i] - m) else PREFILL
        holding.append(tuple(sorted(cached.difference(role))))
        st.apply(batch)
        for i in role:
            (cached.add if st.m[i] else cached.discard)(i)
        roles.append(role)
        kv_after.append(st.kv_used)
    return ScheduleRoles(st.finish(), roles, holding, kv_after)
