"""A strong formulation: per-class state networks over the batches (docs/formulation.md, "network").

Identical requests (same I, O, arrival) form a class; a request's state between batches is
(m, n) (cached, generated) or done. In each batch every request takes one transition: idle,
evict, or process c tokens. The integer variable x[k, j, t] counts the class-k requests
taking transition t in batch j; flow is conserved per state. Every term of the batch time,
of the token limits and of the KV limit is a constant per transition, so the model is
linear without Big-M rows and its relaxation is a flow problem; symmetric requests are
counted, not named. Exact for every cost model; the size grows like O I^2 per class and
batch, so it suits short prompts or few distinct classes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..accounting import FEATURES, account_batch, is_decode_type, round_to_blocks
from ..schedule import ReplayState, Schedule
from ..workload import Instance
from ..constraints import Constraints
from ..objective import Objective
from .base import Formulation
from .model import Model
from .statenet import (BatchTerms, ClassStates, Clock, append_model_batch, assign_paths, build_state_network,
                       class_states, finish_extraction, link_processing, request_classes, state_of, state_windows)


@dataclass
class _Class(ClassStates):
    # transitions (arrays over t)
    src: np.ndarray
    dst: np.ndarray
    tokens: np.ndarray
    prefill_tokens: np.ndarray
    kv: np.ndarray
    processing: np.ndarray
    decode: np.ndarray
    evict: np.ndarray
    generates_first: np.ndarray
    features: np.ndarray  # (t, len(FEATURES)) batch-time features of the transition (intercept feature 0)


def _build_class(prompt: int, output: int, arrival: float, members: list[int], block: int, C: int, P: int,
                 constraints: Constraints) -> _Class:
    states, index = class_states(prompt, output)
    done = len(states) - 1
    rows = []  # src, dst, c, prefill c, kv, processing, decode, evict, first token, features...
    blocks = lambda t: round_to_blocks(t, block)  # noqa: E731
    for (m, n), s in list(index.items())[:-1]:
        S = prompt + n
        rows.append((s, s, 0, 0, blocks(m), 0, 0, 0, 0, 0, 0, 0, 0, 0))  # idle
        # no_chunk: an evicted request recomputes all S tokens in one chunk, so S <= min(P, C)
        if m > 0 and not constraints.no_evict and not (constraints.no_chunk and S > min(P, C)):
            rows.append((s, index[(0, n)], 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0))
            # evicted in a batch of its own that takes no time, then refilled from 0 in this one
            for c in range(1, min(S, C) + 1):
                if constraints.no_chunk and c != S:
                    continue
                d = index[(c, n)] if c < S else (done if n + 1 == output else index[(S, n + 1)])
                rows.append((s, d, c, c, blocks(c), 1, 0, 1, int(c == S and n == 0), c, 0, c * c, 0, 1))
        for c in range(1, min(S - m, C) + 1):
            decode = bool(is_decode_type(n, S - m))
            if constraints.no_chunk and not decode and c != S - m:
                continue
            if m + c < S:
                d = index[(m + c, n)]
            elif n + 1 == output:
                d = done
            else:
                d = index[(S, n + 1)]
            first = int(m + c == S and n == 0)
            feats = account_batch({0: c}, (m,), (n,), (prompt,)).features[1:]
            rows.append((s, d, c, 0 if decode else c, blocks(m + c), 1, int(decode), 0, first) + feats)
    rows.append((done, done, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
    a = np.array(rows, dtype=np.int64)
    feats = np.zeros((len(a), len(FEATURES)))
    feats[:, 1:] = a[:, 9:14]
    return _Class(prompt, output, arrival, members, states, index, a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4],
                  a[:, 5].astype(bool), a[:, 6].astype(bool), a[:, 7].astype(bool), a[:, 8].astype(bool), feats)


def network_size(instance: Instance, horizon: int) -> int:
    """About how many transition variables the network model has (before time windows)."""
    total = 0
    C = instance.system.max_batch_tokens
    for I, O, _, _ in request_classes(instance):
        for n in range(O):
            S = I + n
            for m in range(S) if S <= 64 else ():
                total += 2 + min(S - m, C) + (min(S, C) if m else 0)
            if S > 64:  # closed form of the same sum: sum_m (S - m) + (S - 1) S + 2 S
                total += S * (S + 1) // 2 + (S - 1) * S + 2 * S
    return total * horizon


def build_network(instance: Instance, objective: Objective = Objective.TOTAL_LATENCY, horizon: int = 8,
                  constraints: Constraints = Constraints(), tick: float | None = None) -> NetworkFormulation:
    return build_state_network(instance, objective, horizon, constraints, tick, NetworkFormulation, "network",
                               _build_class, _add_class)


def _add_class(md: Model, cl: _Class, k: int, J: int, free_end: bool, clock: Clock, units, terms: BatchTerms,
               coef: np.ndarray) -> None:
    """Class k's transition variables of every batch, their terms and the flow conservation rows."""
    O, a, nk = cl.output, cl.arrival, len(cl.members)
    n_of = np.array([s[1] for s in cl.states])
    n_states = len(cl.states)
    allowed = state_windows(n_of, O, J, free_end, cl.index[(0, 0)])
    cols_j = []
    z_cols: dict[int, int] = {}
    for j in range(J):
        ok = allowed[j][cl.src] & allowed[j + 1][cl.dst]
        tids = np.nonzero(ok)[0]
        xv = md.add_vars(f"x{k}_{j}", len(tids), 0, nk, True)
        cols_j.append((tids, xv))
        if len(tids) == 0:
            continue
        src = cl.src[tids]
        terms.add(j, xv, tokens=cl.tokens[tids], prefill=cl.prefill_tokens[tids], kv=cl.kv[tids],
                  cost=cl.features[tids] @ coef, processing=cl.processing[tids], decode=cl.decode[tids],
                  unfinished=src != n_states - 1, no_token=n_of[src] == 0)
        z = link_processing(md, clock, units, j, nk, a, xv[cl.processing[tids]], k)
        if z is not None:
            z_cols[j] = z
    # flow conservation per state and batch boundary
    for j in range(J + 1):
        states = np.nonzero(allowed[j])[0]
        rhs = np.zeros(n_states)
        if j == 0:
            rhs[cl.index[(0, 0)]] = nk
        if j == J and not free_end:
            rhs[n_states - 1] = nk
        # row s: out-flow(s) - in-flow(s) = rhs[s] (initial) or -rhs (final in-flow)
        row_of = {s: r for r, s in enumerate(states)}
        rr, cc, vv = [], [], []
        if j < J:
            tids, xv = cols_j[j]
            for col, s in zip(xv, cl.src[tids]):
                rr.append(row_of[s]); cc.append(col); vv.append(1.0)  # noqa: E702
        if j > 0:
            tids, xv = cols_j[j - 1]
            for col, s in zip(xv, cl.dst[tids]):
                rr.append(row_of[s]); cc.append(col); vv.append(-1.0)  # noqa: E702
        target = rhs[states] if j == 0 else (-rhs[states] if j == J else np.zeros(len(states)))
        if j == J and free_end:  # whatever state after the first token: in-flow is free
            continue
        md.add_sparse_rows(f"flow[class={k}, j={j}]", len(states), np.array(rr, dtype=np.int64), np.array(cc, dtype=np.int64),
                         np.array(vv), target, target)
    cl.cols = cols_j
    cl.z = z_cols


# ------------------------------------------------------------------------------ schedules <-> points


def _assignment(form: "NetworkFormulation", schedule: Schedule) -> np.ndarray:
    lookup = []
    for cl in form.classes:
        table = {}
        for tid in range(len(cl.src)):
            table.setdefault((int(cl.src[tid]), int(cl.dst[tid]), int(cl.tokens[tid]), bool(cl.evict[tid])), tid)
        lookup.append(table)

    def transition(k, cl, before, after, c, evicted):
        return [lookup[k][(cl.index[before], cl.index[after], c, evicted)]]

    return assign_paths(form, schedule, transition)


def _extract(form: "NetworkFormulation", x: np.ndarray) -> Schedule:
    inst = form.instance
    st = ReplayState(inst)
    online = "idle" in form.model.blocks
    batches = []
    for j in range(form.horizon):
        tokens: dict[int, int] = {}
        evict: list[int] = []
        refill: list[int] = []  # evicted in a batch of their own, then processed in this one
        for cl in form.classes:
            tids, xv = cl.cols[j]
            counts = {int(t): int(round(v)) for t, v in zip(tids, x[xv]) if round(v) > 0}
            by_src: dict[int, list[int]] = {}
            for t, n in counts.items():
                by_src.setdefault(int(cl.src[t]), []).extend([t] * n)
            for i in cl.members:
                s = cl.index[state_of(st, i)]
                options = by_src.get(s)
                if not options:
                    raise ValueError(f"solution of the network model leaves request {i} without a transition at batch {j}")
                t = options.pop()
                if cl.tokens[t]:
                    tokens[i] = int(cl.tokens[t])
                    if cl.evict[t]:
                        refill.append(i)
                elif cl.evict[t]:
                    evict.append(i)
        append_model_batch(st, batches, tokens, evict, refill, online)
    return finish_extraction(form, st, batches)


class NetworkFormulation(Formulation):
    classes: list  # the request classes and their transition columns
    warm_start = _assignment
    extract = _extract
