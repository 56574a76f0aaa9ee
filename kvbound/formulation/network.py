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
class ClassStates:
    """What every state-network model knows of a class of identical requests: its lengths, arrival,
    members and states (m cached, n generated), the last one the done state (-1, O)."""
    prompt: int
    output: int
    arrival: float
    members: list[int]
    states: list[tuple[int, int]]
    index: dict  # state -> its position in `states`


def class_states(prompt: int, output: int) -> tuple[list[tuple[int, int]], dict]:
    """The states (m, n) of a request with these lengths, done state last, and their positions."""
    states = [(m, n) for n in range(output) for m in range(prompt + n)] + [(-1, output)]
    return states, {s: k for k, s in enumerate(states)}


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
    features: np.ndarray  # (t, 6) batch-time features of the transition (intercept feature 0)


def _build_class(prompt: int, output: int, arrival: float, members: list[int], block: int, C: int, P: int,
                 constraints: Constraints) -> _Class:
    states, index = class_states(prompt, output)
    done = len(states) - 1
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


@dataclass
class BatchTerms:
    """Per batch j, the (cols, coefs) terms of the rows that every state-network model shares:
    tokens (C), prefill-type tokens (P), KV (M), batch time, requests processing, decode-type
    requests, requests unfinished / without a first token before the batch (mean objectives)."""
    J: int

    def __post_init__(self):
        for name in self.KINDS:
            setattr(self, name, [[] for _ in range(self.J)])

    KINDS = ("tokens", "prefill", "kv", "cost", "processing", "decode", "unfinished", "no_token")

    def add(self, j: int, cols: np.ndarray, **coefs) -> None:
        """Columns `cols` of batch j with per-column coefficients for the named rows (zeros dropped)."""
        for name, v in coefs.items():
            v = np.broadcast_to(np.asarray(v, dtype=float), cols.shape)
            keep = v != 0
            if keep.any():
                getattr(self, name)[j].append((cols[keep], v[keep]))

    def value(self, name: str, j: int, x: np.ndarray) -> float:
        return float(sum(x[c] @ v for c, v in getattr(self, name)[j]))


@dataclass
class Clock:
    """The batch-level variables every model shares: y (batch processes), T (batch time), and
    with arrivals idle (wait before the batch) and t (its start)."""
    y: np.ndarray
    T: np.ndarray
    idle: np.ndarray | None
    t: np.ndarray | None
    T_max: float
    idle_max: float


def add_clock(md: Model, instance: Instance, J: int, units, integral: bool) -> Clock:
    cost, s = instance.cost, instance.system
    C, M, N = s.max_batch_tokens, s.kv_capacity, len(instance)
    A = instance.arrivals
    online = bool((A > 0).any())
    y = md.binary("y", J)
    T_max = (cost.intercept + cost.per_token * C + cost.decode_kv * M + cost.prefill_attention * (C * C + 2.0 * M * C)
             + cost.prefill_kv * M + cost.per_prefill_request * min(N, C))
    T = md.add_vars("T", J, 0, units.up(T_max), integral)
    idle_max = float(A.max()) if online else 0.0
    idle = t = None
    if online:
        idle = md.add_vars("idle", J, 0, units.up(idle_max), integral)
        t = md.add_vars("t", J, 0, units.up(idle_max + J * T_max), integral)
        md.add_rows(1, [(t[:1], 1), (idle[:1], -1)], 0, 0)
        if J > 1:
            md.add_rows(J - 1, [(t[1:], 1), (t[:-1], -1), (T[:-1], -1), (idle[1:], -1)], 0, 0)
    return Clock(y, T, idle, t, T_max, idle_max)


def link_processing(md: Model, clock: Clock, units, j: int, count: int, arrival: float, proc_cols: np.ndarray,
                    name: str) -> int | None:
    """Rows of batch j for `count` interchangeable requests (one class) whose processing columns are
    `proc_cols`: the batch is used if any of them processes, and with arrivals it then starts after
    their arrival (gated by a binary z, returned)."""
    if not len(proc_cols):
        return None
    md.add_rows(1, [(clock.y[j:j + 1], count), (proc_cols[None, :], -1)], lo=0)
    if clock.t is None or arrival <= 0:
        return None
    z = md.binary(name, 1)
    md.add_rows(1, [(z, count), (proc_cols[None, :], -1)], lo=0)
    md.add_rows(1, [(clock.t[j:j + 1], 1), (z, -units.down(arrival))], lo=0)
    return int(z[0])


def finish_model(md: Model, instance: Instance, objective: str, constraints: Constraints, clock: Clock,
                 terms: BatchTerms, coef: np.ndarray, units, integral: bool) -> None:
    """The batch rows (C, P, M, batch time, batch-size cap, no-hybrid), used batches first, the
    objective and the objective cap, from the per-batch terms."""
    s = instance.system
    N, J = len(instance), terms.J
    y, T, idle = clock.y, clock.T, clock.idle

    def batch_row(j, parts, extra=(), lo=-np.inf, hi=np.inf):
        rows = [(np.asarray(c)[None, :], np.asarray(v, dtype=float)[None, :]) for c, v in parts] + list(extra)
        if rows:
            md.add_rows(1, rows, lo, hi)

    for j in range(J):
        batch_row(j, terms.tokens[j], hi=s.max_batch_tokens)
        batch_row(j, terms.prefill[j], hi=s.max_prefill_tokens)
        batch_row(j, terms.kv[j], hi=s.kv_capacity)
        batch_row(j, terms.cost[j], extra=[(T[j:j + 1], -1.0), (y[j:j + 1], coef[0])], lo=0, hi=0)
        if constraints.max_batch_size is not None:
            batch_row(j, terms.processing[j], hi=constraints.max_batch_size)
    if constraints.no_hybrid:
        w = md.binary("w", J)
        for j in range(J):  # w_j = 1: a decode-only batch; 0: prefill-type only
            batch_row(j, terms.decode[j], extra=[(w[j:j + 1], -N)], hi=0)
            prefill = terms.processing[j] + [(c, -np.asarray(v, dtype=float)) for c, v in terms.decode[j]]
            batch_row(j, prefill, extra=[(w[j:j + 1], N)], hi=N)
    if J > 1:
        md.add_rows(J - 1, [(y[:-1], 1), (y[1:], -1)], lo=0)
    _add_capacity_cuts(md, instance, terms, y, linked=not stops_at_first_tokens(objective, constraints))

    A = instance.arrivals
    delta = [(T, 1)] + ([(idle, 1)] if idle is not None else [])
    if objective == "total_latency":
        obj_terms, offset = delta, 0.0
    else:
        # sum over batches of Delta_j times the number U_j of requests not finished (no first token) before j.
        # A batch some request still needs is used (y_j = 1), so the intercept part of Delta_j U_j is
        # k0 U_j, linear; only the rest R_j = Delta_j - k0 y_j multiplies U_j through a Big-M:
        # U_j = sum_b 2^b u_jb in binary, q_jb >= R_j - Rmax (1 - u_jb), exact at integer points.
        # For mean_latency sum_b 2^b q_jb >= R_j holds too (a batch that processes has U_j >= 1).
        rmax = units.up(clock.T_max + clock.idle_max) - coef[0]
        bits = max(1, int(math.ceil(math.log2(N + 1))))
        pw = 2.0 ** np.arange(bits)
        u = md.binary("u", (J, bits))
        q = md.add_vars("q", (J, bits), 0, rmax, integral)
        source = terms.unfinished if objective == "mean_latency" else terms.no_token
        for j in range(J):
            batch_row(j, source[j], extra=[(u[j][None, :], -pw[None, :])], lo=0, hi=0)
        minus_rest = [(T, -1), (y, coef[0])] + ([(idle, -1)] if idle is not None else [])
        md.add_rows((J, bits), [(q, 1), (u, -rmax)] + [(c[:, None], v) for c, v in minus_rest], lo=-rmax)
        if objective == "mean_latency":  # with mean_ttft, batches after the last first token have U_j = 0
            md.add_rows(J, [(q, pw[None, :])] + minus_rest, lo=0)
        weights = np.broadcast_to(pw[None, :], (J, bits))
        if not integral:
            obj_terms = [(q, weights / N), (u, coef[0] * weights / N)]
            offset = -float(sum(map(units.down, A))) / N
        else:
            obj_terms, offset = [(q, weights), (u, coef[0] * weights)], -float(sum(units.up(a) for a in A))
    md.set_objective(obj_terms, offset)
    if constraints.objective_cap is not None:
        cap = constraints.objective_cap * units.objective_scale(objective, N)
        flat = [(np.asarray(c).reshape(-1), np.broadcast_to(np.asarray(v, dtype=float), np.shape(c)).reshape(-1))
                for c, v in obj_terms]
        md.add_rows(1, [(c[None, :], v[None, :]) for c, v in flat], hi=cap - offset)


def state_windows(n_of: np.ndarray, output: int, J: int, free_end: bool, initial: int) -> list[np.ndarray]:
    """Per batch boundary j = 0..J, which states (with n_of tokens generated) a request can be in:
    before batch j at most j tokens exist, and O - n tokens (1 - n when the model stops at the first
    tokens) need as many batches more; at j = 0 only the initial state."""
    need = np.maximum(0, 1 - n_of) if free_end else output - n_of
    allowed = [(n_of <= j) & (need <= J - j) for j in range(J + 1)]
    allowed[0] = np.zeros(len(n_of), bool)
    allowed[0][initial] = True
    return allowed


#: capacity cuts for k = 1 .. this many (Fekete-Schepers functions u^(k) of the KV row)
CAPACITY_CUTS = 8


def dual_feasible_weights(used: np.ndarray, capacity: int, k: int) -> np.ndarray:
    """Fekete and Schepers' dual-feasible function u^(k) of used / capacity: x if (k + 1) x is an
    integer, else floor((k + 1) x) / k. Superadditive with u(1) = 1, so the weights of whatever fits
    in one batch sum to at most 1."""
    return _dff_numerators(used, capacity, k) / (k * capacity)


def _dff_numerators(used, capacity: int, k: int) -> np.ndarray:
    """u^(k) times k * capacity: integers, so that the integer (CP-SAT) model can take the rows."""
    used = np.asarray(used, dtype=np.int64)
    scaled = (k + 1) * used
    return np.where(scaled % capacity == 0, k * used, (scaled // capacity) * capacity)


def _add_capacity_cuts(md: Model, instance: Instance, terms: BatchTerms, y: np.ndarray, linked: bool) -> None:
    """Valid inequalities that tighten the relaxation (docs/formulation.md, "capacity cuts").

    The KV row of a batch, mapped through the dual-feasible functions u^(k): for k = 1 at most one
    request holds more than M / 2, or two exactly M / 2; likewise for more, smaller requests. When
    every request must be done by the horizon (`linked`), an unused batch (y = 0, and so are all
    later batches) holds no KV at all, so the right-hand sides scale with y: KV <= M y,
    tokens <= C y, and the u^(k) rows <= y. The relaxation then pays an intercept for every
    fraction of a batch that a fraction of a request occupies.
    """
    s = instance.system
    M = s.kv_capacity
    peaks = np.array([s.blocks(r.peak_kv) for r in instance.requests])
    # a row the requests' peak KVs could never violate is left out
    binding = [k for k in range(1, CAPACITY_CUTS + 1) if dual_feasible_weights(peaks, M, k).sum() > 1]
    for j in range(terms.J):
        if terms.tokens[j] and linked:
            cols = np.concatenate([c for c, _ in terms.tokens[j]])
            vals = np.concatenate([v for _, v in terms.tokens[j]])
            md.add_rows(1, [(cols[None, :], vals[None, :]), (y[j:j + 1], -float(s.max_batch_tokens))], hi=0)
        if not terms.kv[j]:
            continue
        cols = np.concatenate([c for c, _ in terms.kv[j]])
        kv = np.concatenate([v for _, v in terms.kv[j]]).astype(np.int64)
        if linked:
            md.add_rows(1, [(cols[None, :], kv[None, :]), (y[j:j + 1], -float(M))], hi=0)
        for k in binding:
            w = _dff_numerators(kv, M, k)  # the row times k M
            keep = w > 0
            if not keep.any():
                continue
            if linked:
                md.add_rows(1, [(cols[keep][None, :], w[keep][None, :]), (y[j:j + 1], -float(k * M))], hi=0)
            else:
                md.add_rows(1, [(cols[keep][None, :], w[keep][None, :])], hi=k * M)


def build_network(instance: Instance, objective: str = "total_latency", horizon: int = 8,
                  constraints: Constraints = Constraints(), tick: float | None = None) -> NetworkFormulation:
    return build_state_network(instance, objective, horizon, constraints, tick, NetworkFormulation, "network",
                               _build_class, _add_class)


def build_state_network(instance: Instance, objective: str, horizon: int, constraints: Constraints,
                        tick: float | None, form_cls, name: str, build_class, add_class):
    """The frame every state-network model shares: clock, per-class flows (`build_class` makes a
    class's template, `add_class` its variables and flow rows for every batch), batch rows, cuts
    and the objective."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}")
    if constraints.admission_order is not None:
        raise ValueError(f"the {name} formulation counts identical requests and cannot fix an admission order; use bigm")
    s = instance.system
    J = int(horizon)
    units = TimeUnits.for_model(instance, tick)
    coef = units.coefficients(instance.cost)
    md = Model()
    clock = add_clock(md, instance, J, units, tick is not None)
    terms = BatchTerms(J)
    free_end = stops_at_first_tokens(objective, constraints)
    classes = []
    for k, (I, O, a, ids) in enumerate(request_classes(instance)):
        cl = build_class(I, O, a, ids, s.block_size, s.max_batch_tokens, s.max_prefill_tokens, constraints)
        add_class(md, cl, k, J, free_end, clock, units, terms, coef)
        classes.append(cl)
    finish_model(md, instance, objective, constraints, clock, terms, coef, units, tick is not None)
    form = form_cls(instance, objective, J, constraints, md, tick, coef, units, name=name)
    form.classes = classes
    form.terms = terms
    form.info.update(md.size)
    form.info["classes"] = len(classes)
    return form


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
        z = link_processing(md, clock, units, j, nk, a, xv[cl.processing[tids]], f"z{k}_{j}")
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
        _add_sparse_rows(md, len(states), np.array(rr, dtype=np.int64), np.array(cc, dtype=np.int64),
                         np.array(vv), target, target)
    cl.cols = cols_j
    cl.z = z_cols


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
    lookup = []
    for cl in form.classes:
        table = {}
        for tid in range(len(cl.src)):
            table.setdefault((int(cl.src[tid]), int(cl.dst[tid]), int(cl.tokens[tid]), bool(cl.evict[tid])), tid)
        lookup.append(table)

    def transition(k, cl, before, after, c, evicted):
        return [lookup[k][(cl.index[before], cl.index[after], c, evicted)]]

    return assign_paths(form, schedule, transition)


def assign_paths(form, schedule: Schedule, arcs_of) -> np.ndarray:
    """The warm start of a state-network model (`network`, `chain`): per model batch and request,
    `arcs_of(k, cl, before, after, c, evicted)` names the template arcs the request takes in
    class k; the arc flows, batch times, clock and the shared auxiliaries follow."""
    inst = form.instance
    groups = _model_batches(form, schedule)
    x = np.zeros(form.model.n_cols)
    st = ReplayState(inst)
    B = form.model.blocks
    clock = ModelClock(form)
    for j in range(form.horizon):
        group = groups[j] if j < len(groups) else []
        before = [_state(st, i) for i in range(len(inst))]
        evicted = set()
        for b in group:
            st.apply(b)
            evicted.update(b.evict)
        tokens = group[-1].tokens if group else {}
        T, latest = 0.0, 0.0
        for k, cl in enumerate(form.classes):
            tids, xv = cl.cols[j]
            pos = {int(t): p for p, t in enumerate(tids)}
            for i in cl.members:
                c = tokens.get(i, 0)
                for arc in arcs_of(k, cl, before[i], _state(st, i), c, i in evicted):
                    if arc not in pos:
                        raise ValueError(f"request {i} leaves the time window of the {form.name} model at batch {j}")
                    x[xv[pos[arc]]] += 1
                    T += float(cl.features[arc] @ form.coef)
                if c:
                    latest = max(latest, inst.requests[i].arrival)
                    if j in cl.z:
                        x[cl.z[j]] = 1
        T += form.coef[0] if tokens else 0.0
        x[B["y"][j]] = bool(tokens)
        clock.advance(x, j, T, bool(tokens), latest)
    if "w" in B:
        fill_hybrid_flags(form, x)
    if "u" in B:
        fill_counts(form, x)
    return x


def fill_hybrid_flags(form, x) -> None:
    """The no-hybrid flag w_j of a warm start: 1 for a batch with a decode-type request."""
    for j in range(form.horizon):
        x[form.blocks["w"][j]] = 1.0 if form.terms.value("decode", j, x) > 0 else 0.0


def fill_counts(form, x) -> None:
    """The binary counts u and products q of a warm start (mean objectives; q carries the batch time
    and idle beyond the intercept)."""
    B = form.blocks
    bits = B["u"].shape[1]
    rest = x[B["T"]] - form.coef[0] * x[B["y"]] + (x[B["idle"]] if "idle" in B else 0.0)
    source = "unfinished" if form.objective == "mean_latency" else "no_token"
    for j in range(form.horizon):
        count = int(round(form.terms.value(source, j, x)))
        for bit in range(bits):
            on = (count >> bit) & 1
            x[B["u"][j, bit]] = on
            x[B["q"][j, bit]] = rest[j] if on else 0.0


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
        append_model_batch(st, batches, tokens, evict, refill, online)
    return finish_extraction(form, st, batches)


def append_model_batch(st: ReplayState, batches: list[Batch], tokens: dict, evict: list, refill: list,
                       online: bool) -> None:
    """One model batch of a state network as schedule batches: the requests it refills from 0 are
    evicted in a batch of their own first (no time); with arrivals the batch starts after those it
    processes."""
    if refill:
        bt = Batch({}, tuple(refill), None)
        st.apply(bt)
        batches.append(bt)
    if not tokens and not evict:
        return
    start = max(st.arrival[i] for i in tokens) if online and tokens else None
    bt = Batch(tokens, tuple(evict), start)
    st.apply(bt)
    batches.append(bt)


def finish_extraction(form, st: ReplayState, batches: list[Batch]) -> Schedule | None:
    """The extracted schedule, completed after a first-token prefix (None if that is impossible)."""
    if st.unfinished:
        return complete_schedule(form.instance, batches, form.constraints)
    return Schedule(form.instance.requests, batches)
