"""Schedules rewritten: empty batches dropped, evict-only batches merged into the next, the prefix up
to the last first token, and a prefix completed by a simple heuristic (models that stop at the first
tokens leave the rest to it)."""
from __future__ import annotations

from ..accounting import is_decode_type
from ..constraints import Constraints
from ..schedule import Batch, ReplayState, Schedule
from ..workload import Instance


def carry_idle(batches) -> list[Batch]:
    """The batches without empty ones (nothing processed or evicted); the `start` of an empty batch
    (an idle jump, docs/semantics.md) moves to the next batch, so the clock still waits."""
    out: list[Batch] = []
    wait = None
    for bt in batches:
        if bt.start is not None and wait is not None:
            bt = Batch(bt.tokens, bt.evict, max(wait, bt.start))
        elif wait is not None:
            bt = Batch(bt.tokens, bt.evict, wait)
        if not bt.tokens and not bt.evict:
            wait = bt.start
            continue
        wait = None
        out.append(bt)
    return out


def merge_evict_only(batches) -> list[Batch]:
    """The schedule's batches without empty ones; an evict-only batch merges into the next batch
    unless that one processes a request it evicts (same schedule, fewer batches)."""
    merged: list[Batch] = []
    pending: list[int] = []
    for bt in carry_idle(batches):
        if not bt.tokens:
            pending.extend(bt.evict)
            continue
        if pending and not set(pending) & set(bt.tokens):
            bt = Batch(bt.tokens, tuple(pending) + tuple(bt.evict), bt.start)
        elif pending:
            merged.append(Batch({}, tuple(pending), None))
        pending = []
        merged.append(bt)
    if pending:
        merged.append(Batch({}, tuple(pending), None))
    return merged


def first_token_prefix(instance: Instance, batches: list[Batch]) -> list[Batch]:
    """The batches up to the one that generates the last first token."""
    st = ReplayState(instance)
    for k, bt in enumerate(batches):
        st.apply(bt)
        if min(st.n) >= 1:
            return list(batches[: k + 1])
    return list(batches)


def complete_schedule(instance: Instance, batches: list[Batch], constraints: Constraints = Constraints()) -> Schedule | None:
    """`batches` followed by batches that finish every request, meeting `constraints`: each batch
    serves the unfinished requests with the least work left first while C, P, M and the batch-size
    cap allow (decode-only or prefill-only batches under no_hybrid; whole prefills under no_chunk);
    when nothing fits, all but one request are evicted (if allowed and, under no_chunk, refillable in one
    chunk; else it completes one request at a time, `_one_at_a_time`, or gives None). Used after models
    that stop at the first tokens, whose objective the completion does not change."""
    st = ReplayState(instance)
    for bt in batches:
        st.apply(bt)
    out = list(batches)
    s = instance.system
    P = s.max_prefill_tokens
    cap = constraints.max_batch_size or len(instance)
    kinds = ({True}, {False}) if constraints.no_hybrid else ({True, False},)  # decode-type or prefill-type

    def fill(order, allowed) -> dict[int, int]:
        tokens: dict[int, int] = {}
        kv, tok, ptok = st.kv_used, 0, 0
        for i in order:
            if len(tokens) == cap:
                break
            S = st.prompt[i] + st.n[i]
            decode = is_decode_type(st.n[i], S - st.m[i])
            if decode not in allowed:
                continue
            c = 1 if decode else min(S - st.m[i], s.max_batch_tokens - tok, P - ptok)
            if constraints.no_chunk and not decode and c < S - st.m[i]:
                continue
            grow = s.blocks(st.m[i] + c) - s.blocks(st.m[i]) if c > 0 else 0
            if c < 1 or tok + c > s.max_batch_tokens or kv + grow > s.kv_capacity:
                continue
            tokens[i] = c
            tok, kv = tok + c, kv + grow
            ptok += 0 if decode else c
        return tokens

    while st.unfinished:
        order = sorted((i for i in range(len(instance)) if not st.finished[i]),
                       key=lambda i: (st.prompt[i] + st.output[i] - st.m[i] - st.n[i], i))
        tokens = next((t for t in map(lambda k: fill(order, k), kinds) if t), {})
        if tokens:
            bt = Batch(tokens, (), None)
        else:
            # keep the request with the least work left, unless another could never be refilled: under
            # no_chunk an evicted request recomputes all S tokens in one chunk, so only S <= min(P, C) may go
            refillable = [i for i in order if _refillable(st, i, constraints, P)]
            keep = next((i for i in order if st.m[i] > 0 and i not in refillable), order[0])
            victims = tuple(i for i in refillable if i != keep and st.m[i] > 0)
            if constraints.no_evict or not victims:
                return _one_at_a_time(instance, batches, constraints)
            bt = Batch({}, victims, None)
        st.apply(bt)
        out.append(bt)
    return Schedule(instance.requests, out)


def _refillable(st: ReplayState, i: int, constraints: Constraints, P: int) -> bool:
    """Whether request i, evicted now, can be refilled: under no_chunk its S tokens recompute in one
    chunk, so S <= P (<= C)."""
    return not constraints.no_chunk or st.prompt[i] + st.n[i] <= P


def _one_at_a_time(instance: Instance, batches: list[Batch], constraints: Constraints) -> Schedule | None:
    """`batches` completed one request at a time, where the greedy completion got stuck: requests that
    can be refilled (under no_chunk: in one chunk of at most P) are evicted at once, before they grow
    past that, and each request then runs alone to its end (refilled in one chunk under no_chunk);
    None where even that does not fit (requests kept resident that cannot grow side by side) or
    eviction is forbidden."""
    if constraints.no_evict:
        return None
    st = ReplayState(instance)
    for bt in batches:
        st.apply(bt)
    s, P = instance.system, instance.system.max_prefill_tokens
    refillable = [i for i in range(len(instance))
                  if not st.finished[i] and st.m[i] > 0 and _refillable(st, i, constraints, P)]
    out = list(batches)
    if refillable:
        out.append(Batch({}, tuple(refillable), None))
        st.apply(out[-1])
    order = sorted((i for i in range(len(instance)) if not st.finished[i]), key=lambda i: (st.m[i] == 0, i))
    for i in order:  # the resident ones first: they hold KV the others need
        while not st.finished[i]:
            S = st.prompt[i] + st.n[i]
            c = 1 if is_decode_type(st.n[i], S - st.m[i]) else min(S - st.m[i], s.max_batch_tokens, P)
            if constraints.no_chunk and c < S - st.m[i]:
                return None
            if st.kv_used + s.blocks(st.m[i] + c) - s.blocks(st.m[i]) > s.kv_capacity:
                return None
            out.append(Batch({i: c}, (), None))
            st.apply(out[-1])
    return Schedule(instance.requests, out)
