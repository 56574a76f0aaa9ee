"""The state-network toolkit that `network` and `chain` share (docs/formulation.md, "network").

Identical requests form a class whose states are (m cached, n generated) or done; integer flows
count how many of a class take each arc in each batch. This module holds the frame both models
build on: the classes and their states, the per-batch row terms, the clock, the batch rows, the
capacity cuts and the objective, and the warm start and extraction of a state-network point.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..bounds.kv_items import dff_numerators, dual_feasible_weights
from ..constraints import Constraints
from ..objective import Objective
from ..schedule import Batch, ReplayState, Schedule
from ..schedulers.rewrite import carry_idle, complete_schedule, first_token_prefix
from ..workload import Instance
from .base import Clock, ModelClock, add_clock
from .model import Model
from .units import TimeUnits


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


def request_classes(instance: Instance) -> list[tuple[int, int, float, list[int]]]:
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(instance.requests):
        groups.setdefault((r.prompt, r.output, r.arrival), []).append(i)
    return [(I, O, a, ids) for (I, O, a), ids in groups.items()]


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


def link_processing(md: Model, clock: Clock, units, j: int, count: int, arrival: float, proc_cols: np.ndarray,
                    k: int) -> int | None:
    """Rows of batch j for `count` interchangeable requests (one class) whose processing columns are
    `proc_cols`: the batch is used if any of them processes, and with arrivals it then starts after
    their arrival (gated by a binary z, returned)."""
    if not len(proc_cols):
        return None
    md.add_rows(f"used_if_processing[class={k}, j={j}]", 1, [(clock.y[j:j + 1], count), (proc_cols[None, :], -1)], lo=0)
    if clock.t is None or arrival <= 0:
        return None
    z = md.binary(f"z{k}_{j}", 1)
    md.add_rows(f"arrival_gate[class={k}, j={j}]", 1, [(z, count), (proc_cols[None, :], -1)], lo=0)
    md.add_rows(f"start_after_arrival[class={k}, j={j}]", 1, [(clock.t[j:j + 1], 1), (z, -units.down(arrival))], lo=0)
    return int(z[0])


def finish_model(md: Model, instance: Instance, objective: Objective, constraints: Constraints, clock: Clock,
                 terms: BatchTerms, coef: np.ndarray, units, integral: bool) -> None:
    """The batch rows (C, P, M, batch time, batch-size cap, no-hybrid), used batches first, the
    objective and the objective cap, from the per-batch terms."""
    s = instance.system
    N, J = len(instance), terms.J
    y, T, idle = clock.y, clock.T, clock.idle

    def batch_row(name, j, parts, extra=(), lo=-np.inf, hi=np.inf):
        rows = [(np.asarray(c)[None, :], np.asarray(v, dtype=float)[None, :]) for c, v in parts] + list(extra)
        if rows:
            md.add_rows(f"{name}[j={j}]", 1, rows, lo, hi)

    for j in range(J):
        batch_row("max_batch_tokens", j, terms.tokens[j], hi=s.max_batch_tokens)
        batch_row("max_prefill_tokens", j, terms.prefill[j], hi=s.max_prefill_tokens)
        batch_row("kv_capacity", j, terms.kv[j], hi=s.kv_capacity)
        kinks = [(cols[j][None, :], coefs) for cols, coefs in clock.kink_time_terms()]
        batch_row("batch_time", j, terms.cost[j], extra=[(T[j:j + 1], -1.0), (y[j:j + 1], coef[0])] + kinks, lo=0, hi=0)
        clock.link_kinks(md, j, terms.tokens[j])
        if constraints.max_batch_size is not None:
            batch_row("max_batch_size", j, terms.processing[j], hi=constraints.max_batch_size)
    if constraints.no_hybrid:
        w = md.binary("w", J)
        for j in range(J):  # w_j = 1: a decode-only batch; 0: prefill-type only
            batch_row("no_hybrid_decode", j, terms.decode[j], extra=[(w[j:j + 1], -N)], hi=0)
            prefill = terms.processing[j] + [(c, -np.asarray(v, dtype=float)) for c, v in terms.decode[j]]
            batch_row("no_hybrid_prefill", j, prefill, extra=[(w[j:j + 1], N)], hi=N)
    if J > 1:
        md.add_rows("used_batches_first[j]", J - 1, [(y[:-1], 1), (y[1:], -1)], lo=0)
    _add_capacity_cuts(md, instance, terms, y, linked=not constraints.stops_at_first_tokens(objective))

    A = instance.arrivals
    delta = [(T, 1)] + ([(idle, 1)] if idle is not None else [])
    if not objective.is_mean:
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
        source = terms.no_token if objective.first_token else terms.unfinished
        for j in range(J):
            batch_row("waiting_count_bits", j, source[j], extra=[(u[j][None, :], -pw[None, :])], lo=0, hi=0)
        minus_rest = [(T, -1), (y, coef[0])] + ([(idle, -1)] if idle is not None else [])
        md.add_rows("q_rest_while_waiting[j,bit]", (J, bits), [(q, 1), (u, -rmax)] + [(c[:, None], v) for c, v in minus_rest], lo=-rmax)
        if not objective.first_token:  # with mean_ttft, batches after the last first token have U_j = 0
            md.add_rows("q_covers_rest[j]", J, [(q, pw[None, :])] + minus_rest, lo=0)
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
        md.add_rows("objective_cap", 1, [(c[None, :], v[None, :]) for c, v in flat], hi=cap - offset)


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
            md.add_rows(f"max_batch_tokens_if_used[j={j}]", 1, [(cols[None, :], vals[None, :]), (y[j:j + 1], -float(s.max_batch_tokens))], hi=0)
        if not terms.kv[j]:
            continue
        cols = np.concatenate([c for c, _ in terms.kv[j]])
        kv = np.concatenate([v for _, v in terms.kv[j]]).astype(np.int64)
        if linked:
            md.add_rows(f"kv_capacity_if_used[j={j}]", 1, [(cols[None, :], kv[None, :]), (y[j:j + 1], -float(M))], hi=0)
        for k in binding:
            w = dff_numerators(kv, M, k)  # the row times k M
            keep = w > 0
            if not keep.any():
                continue
            if linked:
                md.add_rows(f"kv_capacity_cut[k={k}, j={j}]", 1, [(cols[keep][None, :], w[keep][None, :]), (y[j:j + 1], -float(k * M))], hi=0)
            else:
                md.add_rows(f"kv_capacity_cut[k={k}, j={j}]", 1, [(cols[keep][None, :], w[keep][None, :])], hi=k * M)


def build_state_network(instance: Instance, objective: Objective, horizon: int, constraints: Constraints,
                        tick: float | None, form_cls, name: str, build_class, add_class):
    """The frame every state-network model shares: clock, per-class flows (`build_class` makes a
    class's template, `add_class` its variables and flow rows for every batch), batch rows, cuts
    and the objective."""
    if constraints.admission_order is not None:
        raise ValueError(f"the {name} formulation counts identical requests and cannot fix an admission order; use bigm")
    s = instance.system
    J = int(horizon)
    units = TimeUnits.for_model(instance, tick)
    coef = units.coefficients(instance.cost)
    md = Model()
    clock = add_clock(md, instance, J, units, tick is not None)
    terms = BatchTerms(J)
    free_end = constraints.stops_at_first_tokens(objective)
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


def model_batches(form, schedule: Schedule) -> list[list[Batch]]:
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


def state_of(st: ReplayState, i: int) -> tuple[int, int]:
    return (-1, st.output[i]) if st.finished[i] else (st.m[i], st.n[i])


def assign_paths(form, schedule: Schedule, arcs_of) -> np.ndarray:
    """The warm start of a state-network model (`network`, `chain`): per model batch and request,
    `arcs_of(k, cl, before, after, c, evicted)` names the template arcs the request takes in
    class k; the arc flows, batch times, clock and the shared auxiliaries follow."""
    inst = form.instance
    groups = model_batches(form, schedule)
    x = np.zeros(form.model.n_cols)
    st = ReplayState(inst)
    B = form.model.blocks
    clock = ModelClock(form)
    for j in range(form.horizon):
        group = groups[j] if j < len(groups) else []
        before = [state_of(st, i) for i in range(len(inst))]
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
                for arc in arcs_of(k, cl, before[i], state_of(st, i), c, i in evicted):
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
        clock.advance(x, j, T, bool(tokens), latest, sum(tokens.values()))
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
    source = "no_token" if form.objective.first_token else "unfinished"
    for j in range(form.horizon):
        count = int(round(form.terms.value(source, j, x)))
        for bit in range(bits):
            on = (count >> bit) & 1
            x[B["u"][j, bit]] = on
            x[B["q"][j, bit]] = rest[j] if on else 0.0


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
