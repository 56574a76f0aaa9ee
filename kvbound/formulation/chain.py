"""The token-chain formulation: per-class state networks with one arc per token (docs/formulation.md, "chain").

Like `network`, identical requests form a class and integer arc flows count how many of a class
take each arc in each batch. Instead of one transition per (state, chunk size), a batch is a
path through a chain of token nodes: a request leaves its state (m, n) over a `start` arc, moves
one token at a time along `continue` arcs, and ends the batch with a `stop` (chunk done) or a
`generate` (all S tokens cached: a token is generated). Every cost term is additive per token:
the chunk attention c^2 + 2 m c is the sum of 2 t + 1 over the token positions t = m .. m + c - 1,
the per-chunk terms (prefill_kv m, per_prefill_request) sit on the start arc. So the model is
exact for every cost model, and its size grows like O I per class and batch instead of O I^2.
Evictions go through a per-level pool node: evicted requests idle at m = 0 or, as in `network`,
are refilled in the same model batch (an evict-only batch of no time folded into it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..accounting import FEATURES, is_decode_type, round_to_blocks
from ..schedule import ReplayState, Schedule
from ..workload import Instance
from ..constraints import Constraints
from ..objective import Objective
from .base import Formulation
from .model import Model
from .statenet import (BatchTerms, ClassStates, append_model_batch, assign_paths, build_state_network, class_states,
                       finish_extraction, link_processing, request_classes, state_of, state_windows)

# arc kinds
IDLE, EVICT, EVICT_IDLE, REFILL, START, DECODE, CONTINUE, STOP, GENERATE = range(9)
A_NODE, INTRA = 0, 1  # boundary state nodes; nodes inside a batch (token chain, eviction pool)


@dataclass
class _Arcs:
    """One batch's arc template of a class; node ids index the states (A) or the intra nodes."""
    kind: np.ndarray
    tail_type: np.ndarray
    tail: np.ndarray
    head_type: np.ndarray
    head: np.ndarray
    level: np.ndarray  # n of the request on this arc
    tokens: np.ndarray
    prefill: np.ndarray
    kv: np.ndarray  # KV during the batch (block-rounded) on the arcs that end the batch at a state
    features: np.ndarray  # (arcs, len(FEATURES)) batch-time features


@dataclass
class _ChainClass(ClassStates):
    chain_base: np.ndarray  # intra id of token node (n, p) is chain_base[n] + p - 1
    pool: np.ndarray  # intra id of the eviction pool of level n
    n_intra: int
    arcs: _Arcs
    lookup: dict  # (kind, node) -> arc: node is the state for A-tailed arcs, the intra node otherwise

    @property
    def features(self) -> np.ndarray:
        return self.arcs.features

    @property
    def n_states(self) -> int:
        return len(self.states)

    def intra_level(self) -> np.ndarray:
        lv = np.zeros(self.n_intra, dtype=np.int64)
        for n in range(self.output):
            S = self.prompt + n
            lv[self.chain_base[n]:self.chain_base[n] + S] = n
            if self.pool[n] >= 0:
                lv[self.pool[n]] = n
        return lv


def _build_class(I: int, O: int, arrival: float, members: list[int], block: int, C: int, P: int,
                 constraints: Constraints) -> _ChainClass:
    states, index = class_states(I, O)
    done = len(states) - 1
    evicts = not constraints.no_evict
    chain_base = np.zeros(O, dtype=np.int64)
    pool = np.full(O, -1, dtype=np.int64)
    nxt = 0
    for n in range(O):
        chain_base[n] = nxt
        nxt += I + n
    for n in range(O):
        # no_chunk: an evicted request recomputes all S tokens in one chunk, so S <= min(P, C)
        if evicts and not (constraints.no_chunk and I + n > min(P, C)):
            pool[n] = nxt
            nxt += 1
    cols = {k: [] for k in ("kind", "tt", "tail", "ht", "head", "level", "tok", "pre", "kv", "f")}

    def add(kind, tt, tail, ht, head, level, tok=0, pre=0, kv=0, feats=(0, 0, 0, 0, 0)):
        size = np.broadcast_shapes(*(np.shape(v) for v in (tail, head, tok, pre, kv, *feats)))
        for key, v in (("kind", kind), ("tt", tt), ("tail", tail), ("ht", ht), ("head", head), ("level", level),
                       ("tok", tok), ("pre", pre), ("kv", kv)):
            cols[key].append(np.broadcast_to(np.asarray(v, dtype=np.int64), size).ravel())
        cols["f"].append(np.stack([np.zeros(size)] + [np.broadcast_to(np.asarray(v, dtype=float), size) for v in feats],
                                  axis=-1).reshape(-1, len(FEATURES)))

    blocks = lambda t: round_to_blocks(np.asarray(t), block)  # noqa: E731
    for n in range(O):
        S = I + n
        m = np.arange(S)
        s = index[(0, n)] + m
        after = done if n + 1 == O else index[(S, n + 1)]  # the state once token n + 1 is generated
        add(IDLE, A_NODE, s, A_NODE, s, n, kv=blocks(m))
        if pool[n] >= 0:
            add(EVICT, A_NODE, s[1:], INTRA, pool[n], n)
            add(EVICT_IDLE, INTRA, pool[n], A_NODE, index[(0, n)], n)
            add(REFILL, INTRA, pool[n], INTRA, chain_base[n], n, tok=1, pre=1, feats=(1, 0, 1, 0, 1))
        starts = m if n == 0 else m[:-1]  # at n >= 1 the last uncached token is a decode
        add(START, A_NODE, s[starts], INTRA, chain_base[n] + starts, n, tok=1, pre=1,
            feats=(1, 0, 2 * starts + 1, starts, 1))
        if n >= 1:
            add(DECODE, A_NODE, s[-1], A_NODE, after, n, tok=1, kv=blocks(S), feats=(1, S - 1, 0, 0, 0))
        p = np.arange(1, S)  # token node (n, p): p tokens cached, more may follow in this batch
        add(CONTINUE, INTRA, chain_base[n] + p - 1, INTRA, chain_base[n] + p, n, tok=1, pre=1, feats=(1, 0, 2 * p + 1, 0, 0))
        if not constraints.no_chunk:
            add(STOP, INTRA, chain_base[n] + p - 1, A_NODE, index[(0, n)] + p, n, kv=blocks(p))
        add(GENERATE, INTRA, chain_base[n] + S - 1, A_NODE, after, n, kv=blocks(S))
    add(IDLE, A_NODE, done, A_NODE, done, O)
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    arcs = _Arcs(cat["kind"], cat["tt"], cat["tail"], cat["ht"], cat["head"], cat["level"], cat["tok"], cat["pre"],
                 cat["kv"], np.concatenate(cols["f"]))
    lookup = {(int(k), int(t)): a for a, (k, t) in enumerate(zip(arcs.kind, arcs.tail))}
    return _ChainClass(I, O, arrival, members, states, index, chain_base, pool, nxt, arcs, lookup)


def chain_size(instance: Instance, horizon: int) -> int:
    """About how many arc variables the chain model has (before time windows)."""
    return horizon * sum(6 * O * (I + O) for I, O, _, _ in request_classes(instance))


def build_chain(instance: Instance, objective: Objective = Objective.TOTAL_LATENCY, horizon: int = 8,
                constraints: Constraints = Constraints(), tick: float | None = None) -> ChainFormulation:
    return build_state_network(instance, objective, horizon, constraints, tick, ChainFormulation, "chain",
                               _build_class, _add_class)


def _add_class(md: Model, cl: _ChainClass, k: int, J: int, free_end: bool, clock, units, terms: BatchTerms,
               coef: np.ndarray) -> None:
    arcs, nk, nS, nV = cl.arcs, len(cl.members), cl.n_states, cl.n_intra
    n_of = np.array([st[1] for st in cl.states])
    allowed = state_windows(n_of, cl.output, J, free_end, cl.index[(0, 0)])
    intra_level = cl.intra_level()
    is_a_tail, is_a_head = arcs.tail_type == A_NODE, arcs.head_type == A_NODE
    a_tail, a_head = np.where(is_a_tail, arcs.tail, 0), np.where(is_a_head, arcs.head, 0)
    v_tail, v_head = np.where(is_a_tail, 0, arcs.tail), np.where(is_a_head, 0, arcs.head)
    processing = np.isin(arcs.kind, (START, DECODE, REFILL))
    cost = arcs.features @ coef
    tails, heads, cols_all = [], [], []
    cl.cols = []
    cl.z = {}
    for j in range(J):
        # intra nodes exist for the levels a request can be at before batch j
        alive = np.isin(intra_level, np.unique(n_of[allowed[j]]))
        tail_ok = np.where(is_a_tail, allowed[j][a_tail], alive[v_tail])
        head_ok = np.where(is_a_head, allowed[j + 1][a_head], alive[v_head])
        tids = np.nonzero(tail_ok & head_ok)[0]
        xv = md.add_vars(f"x{k}_{j}", len(tids), 0, nk, True)
        cl.cols.append((tids, xv))
        if not len(tids):
            continue
        # global node ids: state s before batch j -> j nS + s; intra node v of batch j -> (J + 1) nS + j nV + v
        tails.append(np.where(is_a_tail[tids], j * nS + arcs.tail[tids], (J + 1) * nS + j * nV + arcs.tail[tids]))
        heads.append(np.where(is_a_head[tids], (j + 1) * nS + arcs.head[tids], (J + 1) * nS + j * nV + arcs.head[tids]))
        cols_all.append(xv)
        src_n = arcs.level[tids]
        leaves_state = is_a_tail[tids]  # every request leaves its state over exactly one arc per batch
        terms.add(j, xv, tokens=arcs.tokens[tids], prefill=arcs.prefill[tids], kv=arcs.kv[tids], cost=cost[tids],
                  processing=processing[tids], decode=arcs.kind[tids] == DECODE,
                  unfinished=leaves_state & (src_n < cl.output), no_token=leaves_state & (src_n == 0))
        z = link_processing(md, clock, units, j, nk, cl.arrival, xv[processing[tids]], k)
        if z is not None:
            cl.z[j] = z
    # flow conservation: out-flow - in-flow = supply at every node that exists
    n_nodes = (J + 1) * nS + J * nV
    supply = np.zeros(n_nodes)
    supply[cl.index[(0, 0)]] = nk
    if not free_end:
        supply[J * nS + nS - 1] = -nk
    node = np.concatenate(tails + heads) if tails else np.zeros(0, np.int64)
    col = np.concatenate(cols_all + cols_all) if cols_all else np.zeros(0, np.int64)
    val = np.concatenate([np.ones(sum(map(len, tails))), -np.ones(sum(map(len, heads)))])
    if free_end:  # whatever state after the first token: the final in-flow is free
        keep = (node < J * nS) | (node >= (J + 1) * nS)
        node, col, val = node[keep], col[keep], val[keep]
    used = np.union1d(np.unique(node), np.nonzero(supply)[0])
    row = np.searchsorted(used, node)
    md.add_sparse_rows(f"flow[class={k}]", len(used), row.astype(np.int64), col.astype(np.int64), val, supply[used], supply[used])


# ------------------------------------------------------------------------------ schedules <-> points

def _path(cl: _ChainClass, before: tuple[int, int], c: int, evicted: bool) -> list[int]:
    """The template arcs a request in state `before` takes in one model batch."""
    L = cl.lookup
    s = cl.index[before]
    m, n = before
    if m < 0:
        return [L[(IDLE, s)]]
    S = cl.prompt + n
    if evicted:
        pool = int(cl.pool[n])
        if c == 0:
            return [L[(EVICT, s)], L[(EVICT_IDLE, pool)]]
        arcs, m = [L[(EVICT, s)], L[(REFILL, pool)]], 0
    elif c == 0:
        return [L[(IDLE, s)]]
    elif is_decode_type(n, S - m):
        return [L[(DECODE, s)]]
    else:
        arcs = [L[(START, s)]]
    base = int(cl.chain_base[n])
    arcs += [L[(CONTINUE, base + p - 1)] for p in range(m + 1, m + c)]
    end = base + m + c - 1
    arcs.append(L[(GENERATE, end)] if m + c == S else L[(STOP, end)])
    return arcs


def _assignment(form: "ChainFormulation", schedule: Schedule) -> np.ndarray:
    return assign_paths(form, schedule, lambda k, cl, before, after, c, evicted: _path(cl, before, c, evicted))


def _extract(form: "ChainFormulation", x: np.ndarray) -> Schedule | None:
    inst = form.instance
    st = ReplayState(inst)
    online = "idle" in form.model.blocks
    out_arcs = []
    for cl in form.classes:  # per class: (tail type, tail) -> its arcs
        table: dict = {}
        for a, key in enumerate(zip(cl.arcs.tail_type.tolist(), cl.arcs.tail.tolist())):
            table.setdefault(key, []).append(a)
        out_arcs.append(table)
    batches = []
    for j in range(form.horizon):
        tokens: dict[int, int] = {}
        evict: list[int] = []
        refill: list[int] = []
        for cl, table in zip(form.classes, out_arcs):
            tids, xv = cl.cols[j]
            left = np.zeros(len(cl.arcs.kind), dtype=np.int64)
            left[tids] = np.rint(x[xv]).astype(np.int64)
            for i in cl.members:
                node, c, was_evicted = (A_NODE, cl.index[state_of(st, i)]), 0, False
                while True:
                    arc = next((a for a in table.get(node, ()) if left[a] > 0), None)
                    if arc is None:
                        raise ValueError(f"solution of the chain model leaves request {i} without an arc at batch {j}")
                    left[arc] -= 1
                    c += int(cl.arcs.tokens[arc])
                    was_evicted |= cl.arcs.kind[arc] == EVICT
                    if cl.arcs.head_type[arc] == A_NODE:
                        break
                    node = (INTRA, int(cl.arcs.head[arc]))
                if c:
                    tokens[i] = c
                    if was_evicted:
                        refill.append(i)
                elif was_evicted:
                    evict.append(i)
        append_model_batch(st, batches, tokens, evict, refill, online)
    return finish_extraction(form, st, batches)


class ChainFormulation(Formulation):
    classes: list  # the request classes and their arc columns
    terms: BatchTerms
    warm_start = _assignment
    extract = _extract
