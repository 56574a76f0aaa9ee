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

import math
from dataclasses import dataclass

import numpy as np

from ..schedule import Batch, ReplayState, Schedule
from ..workload import Instance
from .bigm import (OBJECTIVES, Constraints, Formulation, ModelClock, TimeUnits, carry_idle, complete_schedule,
                   first_token_prefix, stops_at_first_tokens)
from .model import Model


@dataclass
class _Class:
    prompt: int
    output: int
    arrival: float
    members: list[int]
    states: list[tuple[int, int]]  # (m, n); the last one is the done state (-1, O)
    index: dict
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
    features: np.ndarray  # (t, 6) batch-time features of the transition (intercept feature 0)


def _build_class(prompt: int, output: int, arrival: float, members: list[int], block: int, C: int, P: int,
                 constraints: Constraints) -> _Class:
    states = [(m, n) for n in range(output) for m in range(prompt + n)]
    done = len(states)
    states.append((-1, output))
    index = {s: k for k, s in enumerate(states)}
    rows = []  # src, dst, c, prefill c, kv, processing, decode, evict, first token, features...
    blocks = lambda t: -(-t // block) * block  # noqa: E731
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
            decode = n >= 1 and S - m == 1
            if constraints.no_chunk and not decode and c != S - m:
                continue
            if m + c < S:
                d = index[(m + c, n)]
            elif n + 1 == output:
                d = done
            else:
                d = index[(S, n + 1)]
            first = int(m + c == S and n == 0)
            if decode:
                feats = (c, m, 0, 0, 0)
            else:
                feats = (c, 0, c * c + 2 * m * c, m, 1)
            rows.append((s, d, c, 0 if decode else c, blocks(m + c), 1, int(decode), 0, first) + feats)
    rows.append((done, done, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
    a = np.array(rows, dtype=np.int64)
    feats = np.zeros((len(a), 6))
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


def request_classes(instance: Instance) -> list[tuple[int, int, float, list[int]]]:
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(instance.requests):
        groups.setdefault((r.prompt, r.output, r.arrival), []).append(i)
    return [(I, O, a, ids) for (I, O, a), ids in groups.items()]


class NetworkFormulation(Formulation):
    classes: list

    def warm_start(self, schedule: Schedule) -> np.ndarray:
        return _assignment(self, schedule)

    def extract(self, x: np.ndarray) -> Schedule:
        return _extract(self, x)


def build_network(instance: Instance, objective: str = "total_latency", horizon: int = 8,
                  constraints: Constraints = Constraints(), tick: float | None = None) -> NetworkFormulation:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}")
    if constraints.admission_order is not None:
        raise ValueError("the network formulation counts identical requests and cannot fix an admission order; use bigm")
    sys_ = instance.system
    cost = instance.cost
    J = int(horizon)
    N = len(instance)
    C, P, M, b = sys_.max_batch_tokens, sys_.max_prefill_tokens, sys_.kv_capacity, sys_.block_size
    units = TimeUnits.for_model(instance, tick)
    coef, to_time, up_time = units.coefficients(cost), units.down, units.up
    A = instance.arrivals
    online = bool((A > 0).any())
    md = Model()
    y = md.binary("y", J)
    T_max = (cost.intercept + cost.per_token * C + cost.decode_kv * M + cost.prefill_attention * (C * C + 2.0 * M * C)
             + cost.prefill_kv * M + cost.per_prefill_request * min(N, C))
    T = md.add_vars("T", J, 0, up_time(T_max), tick is not None)
    idle_max = float(A.max()) if online else 0.0
    idle = md.add_vars("idle", J, 0, up_time(idle_max), tick is not None) if online else None
    t_start = None
    if online:
        t_start = md.add_vars("t", J, 0, up_time(idle_max + J * T_max), tick is not None)
        md.add_rows(1, [(t_start[:1], 1), (idle[:1], -1)], 0, 0)
        if J > 1:
            md.add_rows(J - 1, [(t_start[1:], 1), (t_start[:-1], -1), (T[:-1], -1), (idle[1:], -1)], 0, 0)

    classes = []
    # per batch, the terms of the batch rows: (cols, coefs) lists
    tok_terms = [[] for _ in range(J)]
    pre_terms = [[] for _ in range(J)]
    kv_terms = [[] for _ in range(J)]
    cost_terms = [[] for _ in range(J)]
    proc_terms = [[] for _ in range(J)]
    dec_terms = [[] for _ in range(J)]
    unfinished_terms = [[] for _ in range(J)]  # requests not done before batch j (mean latency)
    no_token_terms = [[] for _ in range(J)]  # requests without a first token before batch j (mean TTFT)
    for k, (I, O, a, ids) in enumerate(request_classes(instance)):
        cl = _build_class(I, O, a, ids, b, C, P, constraints)
        nk = len(ids)
        n_of = np.array([s[1] for s in cl.states])
        n_states = len(cl.states)
        # time windows: before batch j (0-based) at most j tokens exist; O - n tokens need O - n more batches
        free_end = stops_at_first_tokens(objective, constraints)
        need = np.maximum(0, 1 - n_of) if free_end else O - n_of  # batches still needed at least
        allowed = [(n_of <= j) & (need <= J - j) for j in range(J + 1)]

        allowed[0] = np.zeros(n_states, bool)
        allowed[0][cl.index[(0, 0)]] = True
        cols_j = []
        z_cols: dict[int, int] = {}
        for j in range(J):
            ok = allowed[j][cl.src] & allowed[j + 1][cl.dst]
            tids = np.nonzero(ok)[0]
            xv = md.add_vars(f"x{k}_{j}", len(tids), 0, nk, True)
            cols_j.append((tids, xv))
            if len(tids) == 0:
                continue
            tok_terms[j].append((xv, cl.tokens[tids]))
            pre_terms[j].append((xv, cl.prefill_tokens[tids]))
            kv_terms[j].append((xv, cl.kv[tids]))
            cost_terms[j].append((xv, cl.features[tids] @ coef))
            proc = cl.processing[tids]
            if proc.any():
                proc_terms[j].append((xv[proc], np.ones(proc.sum())))
                md.add_rows(1, [(y[j:j + 1], nk), (xv[proc][None, :], -1)], lo=0)
                if online and a > 0:  # z = 1 if the class processes anything; then the batch starts after a
                    z = md.binary(f"z{k}_{j}", 1)
                    z_cols[j] = int(z[0])
                    md.add_rows(1, [(z, nk), (xv[proc][None, :], -1)], lo=0)
                    md.add_rows(1, [(t_start[j:j + 1], 1), (z, -to_time(a))], lo=0)
            dec = cl.decode[tids]
            if dec.any():
                dec_terms[j].append((xv[dec], np.ones(dec.sum())))
            not_done = cl.src[tids] != n_states - 1
            if not_done.any():
                unfinished_terms[j].append((xv[not_done], np.ones(not_done.sum())))
            no_tok = n_of[cl.src[tids]] == 0
            if no_tok.any():
                no_token_terms[j].append((xv[no_tok], np.ones(no_tok.sum())))
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
            _add_sparse_rows(md, len(states), np.array(rr, dtype=np.int64), np.array(cc, dtype=np.int64),
                             np.array(vv), target, target)
        cl.cols = cols_j
        cl.z = z_cols
        classes.append(cl)

    def batch_row(j, terms_list, extra=(), lo=-np.inf, hi=np.inf):
        terms = [(np.asarray(c)[None, :], np.asarray(v, dtype=float)[None, :]) for c, v in terms_list[j]] + list(extra)
        if terms:
            md.add_rows(1, terms, lo, hi)

    for j in range(J):
        batch_row(j, tok_terms, hi=C)
        batch_row(j, pre_terms, hi=P)
        batch_row(j, kv_terms, hi=M)
        batch_row(j, cost_terms, extra=[(T[j:j + 1], -1.0), (y[j:j + 1], coef[0])], lo=0, hi=0)
        if constraints.max_batch_size is not None:
            batch_row(j, proc_terms, hi=constraints.max_batch_size)
    if constraints.no_hybrid:
        w = md.binary("w", J)
        for j in range(J):  # w_j = 1: a decode-only batch; 0: prefill-type only
            batch_row(j, dec_terms, extra=[(w[j:j + 1], -N)], hi=0)
            prefill = proc_terms[j] + [(c, -np.asarray(v, dtype=float)) for c, v in dec_terms[j]]
            md.add_rows(1, [(np.asarray(c)[None, :], np.asarray(v, dtype=float)[None, :]) for c, v in prefill]
                        + [(w[j:j + 1], N)], hi=N)
    if J > 1:
        md.add_rows(J - 1, [(y[:-1], 1), (y[1:], -1)], lo=0)

    delta = [(T, 1)] + ([(idle, 1)] if online else [])
    if objective == "total_latency":
        obj_terms, offset = delta, 0.0
    else:
        # sum over batches of Delta_j times the number U_j of requests not finished (no first token) before j;
        # U_j = sum_b 2^b u_jb in binary, q_jb >= Delta_j - Dmax (1 - u_jb) is exact at integer points
        dmax = up_time(T_max + idle_max)
        bits = max(1, int(math.ceil(math.log2(N + 1))))
        pw = 2.0 ** np.arange(bits)
        u = md.binary("u", (J, bits))
        q = md.add_vars("q", (J, bits), 0, dmax, tick is not None)
        source = unfinished_terms if objective == "mean_latency" else no_token_terms
        for j in range(J):
            batch_row(j, source, extra=[(u[j][None, :], -pw[None, :])], lo=0, hi=0)
        md.add_rows((J, bits), [(q, 1), (T[:, None], -1), (u, -dmax)] + ([(idle[:, None], -1)] if online else []), lo=-dmax)
        if tick is None:
            obj_terms, offset = [(q, pw[None, :] / N)], -float(sum(map(to_time, A))) / N
        else:
            obj_terms, offset = [(q, pw[None, :])], -float(sum(up_time(a) for a in A))
    md.set_objective(obj_terms, offset)
    if constraints.objective_cap is not None:
        cap = constraints.objective_cap * units.objective_scale(objective, N)
        flat = [(np.asarray(c).reshape(-1), np.broadcast_to(np.asarray(v, dtype=float), np.shape(c)).reshape(-1))
                for c, v in obj_terms]
        md.add_rows(1, [(c[None, :], v[None, :]) for c, v in flat], hi=cap - offset)
    form = NetworkFormulation(instance, objective, J, constraints, md, tick, coef, units, name="network")
    form.classes = classes
    form.info.update(md.size)
    form.info["classes"] = len(classes)
    return form


def _add_sparse_rows(md: Model, count: int, rr, cc, vv, lo, hi) -> None:
    base = md.n_rows
    if len(rr):
        md._rows.append((rr + base, cc, vv))
    md._row_lo.append(np.asarray(lo, dtype=float))
    md._row_hi.append(np.asarray(hi, dtype=float))
    md.n_rows += count


# ------------------------------------------------------------------------------ schedules <-> points

def _model_batches(form: NetworkFormulation, schedule: Schedule) -> list[list[Batch]]:
    """The schedule's batches grouped as the model's batches: evict-only batches join the next batch."""
    groups: list[list[Batch]] = []
    pending: list[Batch] = []
    batches = first_token_prefix(form.instance, schedule.batches) if form.free_end else schedule.batches
    for bt in carry_idle(batches):
        if not bt.tokens:
            pending.append(bt)
            continue
        groups.append(pending + [bt])
        pending = []
    if pending:
        groups.append(pending)
    if len(groups) > form.horizon:
        raise ValueError(f"the schedule needs {len(groups)} batches, more than the horizon J = {form.horizon}")
    return groups


def _state(st: ReplayState, i: int) -> tuple[int, int]:
    return (-1, st.output[i]) if st.finished[i] else (st.m[i], st.n[i])


def _assignment(form: NetworkFormulation, schedule: Schedule) -> np.ndarray:
    inst = form.instance
    groups = _model_batches(form, schedule)
    x = np.zeros(form.model.n_cols)
    st = ReplayState(inst)
    lookup = []
    for cl in form.classes:
        table = {}
        for tid in range(len(cl.src)):
            table.setdefault((int(cl.src[tid]), int(cl.dst[tid]), int(cl.tokens[tid]), bool(cl.evict[tid])), tid)
        lookup.append(table)
    coef = form.coef
    B = form.model.blocks
    clock = ModelClock(form)
    for j in range(form.horizon):
        group = groups[j] if j < len(groups) else []
        before = [_state(st, i) for i in range(len(inst))]
        evicted = set()
        for b in group:
            st.apply(b)
            evicted.update(b.evict)
        bt = Batch(group[-1].tokens if group else {}, tuple(evicted), None)
        T = 0.0
        any_c = bool(bt.tokens)
        latest = 0.0
        for k, cl in enumerate(form.classes):
            tids, xv = cl.cols[j]
            pos = {int(t): p for p, t in enumerate(tids)}
            for i in cl.members:
                src = cl.index[before[i]]
                dst = cl.index[_state(st, i)]
                c = bt.tokens.get(i, 0)
                tid = lookup[k][(src, dst, c, i in bt.evict)]
                if tid not in pos:
                    raise ValueError(f"request {i} leaves the time window of the network model at batch {j}")
                x[xv[pos[tid]]] += 1
                if c and j in cl.z:
                    x[cl.z[j]] = 1
                T += float(cl.features[tid] @ coef)
                if c:
                    latest = max(latest, inst.requests[i].arrival)
        T += coef[0] if any_c else 0.0
        x[B["y"][j]] = any_c
        clock.advance(x, j, T, any_c, latest)
    if "w" in B:
        _fill_hybrid_flags(form, x)
    if "u" in B:
        _fill_counts(form, x)
    return x


def _fill_hybrid_flags(form, x) -> None:
    B = form.model.blocks
    for j in range(form.horizon):
        dec = 0
        for cl in form.classes:
            tids, xv = cl.cols[j]
            dec += float(x[xv][cl.decode[tids]].sum()) if len(tids) else 0.0
        x[B["w"][j]] = 1.0 if dec > 0 else 0.0


def _fill_counts(form, x) -> None:
    B = form.model.blocks
    bits = B["u"].shape[1]
    delta = x[B["T"]] + (x[B["idle"]] if "idle" in B else 0.0)
    for j in range(form.horizon):
        count = 0
        for cl in form.classes:
            tids, xv = cl.cols[j]
            if not len(tids):
                continue
            n_src = np.array([cl.states[s][1] for s in cl.src[tids]])
            done = cl.src[tids] == len(cl.states) - 1
            mask = ~done if form.objective == "mean_latency" else (n_src == 0)
            count += int(round(x[xv][mask].sum()))
        for bit in range(bits):
            on = (count >> bit) & 1
            x[B["u"][j, bit]] = on
            x[B["q"][j, bit]] = delta[j] if on else 0.0


def _extract(form: NetworkFormulation, x: np.ndarray) -> Schedule:
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
                s = cl.index[_state(st, i)]
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
        if refill:
            bt = Batch({}, tuple(refill), None)
            st.apply(bt)
            batches.append(bt)
        if not tokens and not evict:
            continue
        start = max(inst.requests[i].arrival for i in tokens) if online and tokens else None
        bt = Batch(tokens, tuple(evict), start)
        st.apply(bt)
        batches.append(bt)
    if st.unfinished:
        return complete_schedule(inst, batches, form.constraints)
    return Schedule(inst.requests, batches)
