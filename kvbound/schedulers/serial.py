"""The serial schedule: one request at a time, each to its end. Valid under every hypothesis constraint
(no eviction, nothing shared), so a solve always has a schedule to derive its horizon from."""
from __future__ import annotations

from ..schedule import Batch, ReplayState, Schedule
from ..workload import Instance


def serial_schedule(instance: Instance, order=None, chunked: bool = True) -> Schedule | None:
    """Serve requests one at a time (in `order`, default by arrival); None where a prompt needs
    chunks and `chunked` is False."""
    P = instance.system.max_prefill_tokens
    batches = []
    st = ReplayState(instance)
    for i in (order if order is not None else sorted(range(len(instance)), key=lambda k: (instance.requests[k].arrival, k))):
        r = instance.requests[i]
        if r.prompt > P and not chunked:
            return None
        while not st.finished[i]:
            S = r.prompt + st.n[i]
            c = min(S - st.m[i], P) if st.n[i] == 0 else 1
            bt = Batch({i: c}, (), r.arrival if r.arrival > st.now else None)
            st.apply(bt)
            batches.append(bt)
    return Schedule(instance.requests, batches)
