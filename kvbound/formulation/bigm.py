"""The seed paper's Big-M formulation (Section 5), completed and made exact (docs/formulation.md).

Variables per request i and batch j (S, m, c, g, e as in the paper; r, h, d, p, f, y and
the cost auxiliaries are the parts the paper leaves out "for brevity"). Every product in
the batch-time cost is linearised so that it is exact at integer points and a lower bound
elsewhere, so the solver's dual bound is a valid lower bound on the true optimum.
"""
from __future__ import annotations

import math

import numpy as np

from ..accounting import account_batch, block_count, is_decode_type
from ..constraints import Constraints
from ..objective import Objective
from ..schedule import Batch, ReplayState, Schedule
from ..schedulers.rewrite import complete_schedule, first_token_prefix, merge_evict_only
from ..workload import Instance
from .base import Formulation, ModelClock, add_clock
from .model import Model
from .units import TimeUnits


def bigm_size(instance: Instance, horizon: int) -> int:
    """About how many variables the Big-M model has at this horizon."""
    bits = max(1, int(math.ceil(math.log2(instance.system.max_batch_tokens + 1))))
    return horizon * len(instance) * (16 + 2 * bits)


def build_bigm(instance: Instance, objective: Objective = Objective.TOTAL_LATENCY, horizon: int = 8,
               constraints: Constraints = Constraints(), tick: float | None = None) -> Formulation:
    sys_ = instance.system
    cost = instance.cost
    N, J = len(instance), int(horizon)
    I = instance.prompts.astype(float)
    O = instance.outputs.astype(float)
    A = instance.arrivals
    online = not instance.offline
    C, P, M, b = sys_.max_batch_tokens, sys_.max_prefill_tokens, sys_.kv_capacity, sys_.block_size
    units = TimeUnits.for_model(instance, tick)
    coef, to_time, up_time = units.coefficients(cost), units.down, units.up
    c_int, c_tok, c_dkv, c_att, c_pkv, c_ppr = coef

    Cmax = np.minimum(C, I + O - 1)  # tokens one request can process in a batch
    R = np.maximum(I + O - 2, 0)  # most cached tokens at a batch start
    Rs = I + O  # bound on S
    Rk = I + O - 1  # most KV tokens of a request
    col = lambda a: a[:, None]  # noqa: E731

    md = Model()
    S = md.add_vars("S", (N, J + 1), col(I), col(I + O), True)
    m = md.add_vars("m", (N, J + 1), 0, col(Rk), True)
    f = md.binary("f", (N, J + 1))
    lbf = np.zeros((N, J + 1))
    # termination: every request finishes within the horizon; for mean TTFT only the first tokens matter,
    # so the model stops there (a relaxation) and the extracted prefix is completed afterwards
    free_end = constraints.stops_at_first_tokens(objective)
    lbf[:, J] = 0 if free_end else 1
    ubf = np.ones((N, J + 1))
    ubf[:, 0] = 0
    md.lb[-1] = lbf.reshape(-1)
    md.ub[-1] = ubf.reshape(-1)
    ubS = np.repeat(col(I + O), J + 1, axis=1)
    ubS[:, 0] = I
    md.ub[0] = ubS.reshape(-1)
    ubm = np.repeat(col(Rk), J + 1, axis=1)
    ubm[:, 0] = 0
    md.ub[1] = ubm.reshape(-1)

    c = md.add_vars("c", (N, J), 0, col(Cmax), True)
    r = md.add_vars("r", (N, J), 0, col(R), True)
    e = md.add_vars("e", (N, J), 0, 0 if constraints.no_evict else 1, True)
    g = md.binary("g", (N, J))
    h = md.binary("h", (N, J))
    d = md.binary("d", (N, J))
    p = md.binary("p", (N, J))
    clock = add_clock(md, instance, J, units, tick is not None)
    y, T, idle, t, T_max, idle_max = clock.y, clock.T, clock.idle, clock.t, clock.T_max, clock.idle_max

    Sp, Sn = S[:, :-1], S[:, 1:]
    mp, mn = m[:, :-1], m[:, 1:]
    fp, fn = f[:, :-1], f[:, 1:]
    NJ = (N, J)
    Rc, Cc, Rsc, Rkc, Ic, Oc = col(R), col(Cmax), col(Rs), col(Rk), col(I), col(O)

    # S grows by the generated token; r is m after evictions (paper (1), first half)
    md.add_rows("S_grows[i,j]", NJ, [(Sn, 1), (Sp, -1), (g, -1)], 0, 0)
    md.add_rows("r_at_most_m[i,j]", NJ, [(r, 1), (mp, -1)], hi=0)
    md.add_rows("r_is_m_unless_evicted[i,j]", NJ, [(r, 1), (mp, -1), (e, Rc)], lo=0)
    md.add_rows("r_zero_if_evicted[i,j]", NJ, [(r, 1), (e, Rc)], hi=Rc)
    # tokens to process (paper (2)): none when evicted or finished, at most the uncached ones
    md.add_rows("c_zero_if_evicted[i,j]", NJ, [(c, 1), (e, Cc)], hi=Cc)
    md.add_rows("c_zero_if_finished[i,j]", NJ, [(c, 1), (fp, Cc)], hi=Cc)
    md.add_rows("c_at_most_uncached[i,j]", NJ, [(c, 1), (Sp, -1), (r, 1)], hi=0)
    # token generation (paper (3)): g = 1 exactly when all uncached tokens are processed
    md.add_rows("g_if_all_cached[i,j]", NJ, [(c, 1), (Sp, -1), (r, 1), (g, -Rsc)], lo=-Rsc)
    md.add_rows("g_only_if_all_cached[i,j]", NJ, [(c, 1), (Sp, -1), (r, 1), (g, -Rsc)], hi=-1)
    md.add_rows("g_zero_if_finished[i,j]", NJ, [(g, 1), (fp, 1)], hi=1)
    # finished after batch j: f = 1 iff S = I + O
    md.add_rows("f_if_complete[i,j]", NJ, [(Sn, 1), (fn, -Oc)], lo=Ic)
    md.add_rows("f_only_if_complete[i,j]", NJ, [(Sn, 1), (fn, -1)], hi=Ic + Oc - 1)
    if free_end:
        md.add_rows("finished_by_horizon[i]", N, [(S[:, J], 1)], lo=I + 1)
    # cached after the batch (paper (1), second half): r + c, or 0 once finished (KV freed)
    md.add_rows("m_after_at_most[i,j]", NJ, [(mn, 1), (r, -1), (c, -1)], hi=0)
    md.add_rows("m_after_at_least[i,j]", NJ, [(mn, 1), (r, -1), (c, -1), (fn, Rkc)], lo=0)
    md.add_rows("m_freed_when_finished[i,j]", NJ, [(mn, 1), (fn, Rkc)], hi=Rkc)
    # h: a token was generated before batch j (n >= 1)
    md.add_rows("h_if_generated[i,j]", NJ, [(Sp, 1), (h, -1)], lo=Ic)
    md.add_rows("h_only_if_generated[i,j]", NJ, [(Sp, 1), (h, -Oc)], hi=Ic)
    # phase: d decode-type (n >= 1 and S - m = 1), p prefill-type (any other processing)
    md.add_rows("decode_after_first_token[i,j]", NJ, [(d, 1), (h, -1)], hi=0)
    md.add_rows("decode_one_uncached[i,j]", NJ, [(Sp, 1), (r, -1), (d, Rsc)], hi=1 + Rsc)
    md.add_rows("prefill_type_otherwise[i,j]", NJ, [(Sp, 1), (r, -1), (h, -1), (p, -2)], lo=-1)
    md.add_rows("one_phase[i,j]", NJ, [(d, 1), (p, 1)], hi=1)
    md.add_rows("phase_if_processing[i,j]", NJ, [(c, 1), (d, -1), (p, -1)], lo=0)
    md.add_rows("processing_if_phase[i,j]", NJ, [(c, 1), (d, -Cc), (p, -Cc)], hi=0)
    md.add_rows("batch_used_if_processing[i,j]", NJ, [(y[None, :], 1), (d, -1), (p, -1)], lo=0)
    # batch limits (paper (4), plus P): prefill-type tokens are c - d, since a decode processes 1
    md.add_rows("max_batch_tokens[j]", J, [(c.T, 1)], hi=C)
    md.add_rows("max_prefill_tokens[j]", J, [(c.T, 1), (d.T, -1)], hi=P)
    if b == 1:
        md.add_rows("kv_capacity[j]", J, [(r.T, 1), (c.T, 1)], hi=M)
    else:
        kb = md.add_vars("kv_blocks", NJ, 0, col(np.ceil(Rk / b)), True)
        md.add_rows("kv_blocks_cover[i,j]", NJ, [(kb, b), (r, -1), (c, -1)], lo=0)
        md.add_rows("kv_capacity[j]", J, [(kb.T, b)], hi=M)
    # unused batches (nothing processed or evicted) last: every schedule has such an equivalent
    if J > 1:
        used = md.binary("used", J)
        md.add_rows("used_if_evicting[i,j]", NJ, [(used[None, :], 1), (e, -1)], lo=0)
        md.add_rows("used_if_processing[j]", J, [(used, 1), (y, -1)], lo=0)
        md.add_rows("used_batches_first[j]", J - 1, [(used[:-1], 1), (used[1:], -1)], lo=0)

    # ---- batch time T_j = coef . features, products linearised from below
    terms = [(T, 1), (y, -c_int), (c.T, -c_tok), (p.T, -c_ppr)]
    if c_dkv > 0:  # ud = d * r
        ud = md.add_vars("ud", NJ, 0, col(R), tick is not None)
        md.add_rows("decode_kv_product[i,j]", NJ, [(ud, 1), (r, -1), (d, -Rc)], lo=-Rc)
        terms.append((ud.T, -c_dkv))
    if c_pkv > 0:  # up = p * r
        up = md.add_vars("up", NJ, 0, col(R), tick is not None)
        md.add_rows("prefill_kv_product[i,j]", NJ, [(up, 1), (r, -1), (p, -Rc)], lo=-Rc)
        terms.append((up.T, -c_pkv))
    if c_att > 0:  # (c - d)^2 + 2 r (c - d) = sum_t 2^t beta_t ((c - d) + 2 r), with c - d = sum_t 2^t beta_t
        B = max(1, int(np.ceil(np.log2(Cmax.max() + 1))))
        pw = 2.0 ** np.arange(B)
        beta_ub = (pw[None, :] <= Cmax[:, None]).astype(float)  # bits above Cmax are 0
        beta = md.add_vars("beta", (N, J, B), 0, np.broadcast_to(beta_ub[:, None, :], (N, J, B)), True)
        U = (Cmax + 2 * R)[:, None, None]
        omega = md.add_vars("omega", (N, J, B), 0, np.broadcast_to(U, (N, J, B)), tick is not None)
        md.add_rows("chunk_in_bits[i,j]", NJ, [(beta, pw), (c, -1), (d, 1)], 0, 0)
        md.add_rows("attention_product[i,j,bit]", (N, J, B), [(omega, 1), (c[:, :, None], -1), (d[:, :, None], 1), (r[:, :, None], -2), (beta, -U)], lo=-U)
        terms.append((omega.transpose(1, 0, 2), -c_att * pw))
    terms += [(cols, -coefs) for cols, coefs in clock.kink_time_terms()]
    md.add_rows("batch_time[j]", J, terms, 0, 0)
    for j in range(J):  # tokens above each knee >= the batch's tokens - knee (no rows without knees)
        clock.link_kinks(md, j, [(c[:, j], np.ones(N))])

    # ---- arrivals (the shared clock has t_j = t_{j-1} + T_{j-1} + idle_j): a request runs only from its arrival
    if online:
        arr = np.array([to_time(a) for a in A])[:, None]
        md.add_rows("start_after_arrival[i,j]", NJ, [(t[None, :], 1), (d, -arr), (p, -arr)], lo=0)

    # ---- hypotheses
    if constraints.no_chunk:
        md.add_rows("no_chunk[i,j]", NJ, [(c, 1), (Sp, -1), (r, 1), (p, -Rsc)], lo=-Rsc)
        if not constraints.no_evict:  # an evicted request recomputes all S tokens in one chunk: S <= min(P, C)
            big = np.maximum(Rsc - min(P, C), 0)
            md.add_rows("no_chunk_refill_fits[i,j]", NJ, [(Sp, 1), (e, big)], hi=Rsc)
    if constraints.no_hybrid:
        w = md.binary("w", J)
        md.add_rows("no_hybrid_decode[i,j]", NJ, [(d, 1), (w[None, :], -1)], hi=0)
        md.add_rows("no_hybrid_prefill[i,j]", NJ, [(p, 1), (w[None, :], 1)], hi=1)
    if constraints.max_batch_size is not None:
        md.add_rows("max_batch_size[j]", J, [(d.T, 1), (p.T, 1)], hi=constraints.max_batch_size)
    if constraints.admission_order is not None:
        order = list(constraints.admission_order)
        if sorted(order) != list(range(N)):
            raise ValueError("admission_order must list every request id once")
        sg = md.binary("started", NJ)
        md.add_rows("started_if_processing[i,j]", NJ, [(sg, 1), (d, -1), (p, -1)], lo=0)
        md.add_rows("started_stays[i,j]", (N, J - 1), [(sg[:, 1:], 1), (sg[:, :-1], -1)], lo=0)
        md.add_rows("started_first_batch[i,j]", (N, 1), [(sg[:, :1], 1), (d[:, :1], -1), (p[:, :1], -1)], hi=0)
        if J > 1:
            md.add_rows("started_only_if_processing[i,j]", (N, J - 1), [(sg[:, 1:], 1), (sg[:, :-1], -1), (d[:, 1:], -1), (p[:, 1:], -1)], hi=0)
        for a_, b_ in zip(order, order[1:]):
            md.add_rows("admission_order[j]", J, [(sg[b_], 1), (sg[a_], -1)], hi=0)

    # ---- objective
    delta = [(T, 1)] + ([(idle, 1)] if online else [])
    if not objective.is_mean:
        obj_terms, offset = delta, 0.0
    else:
        dmax = up_time(T_max + idle_max)
        q = md.add_vars("q", NJ, 0, dmax, tick is not None)
        gate = h if objective.first_token else fp  # q_ij >= Delta_j while i is unfinished / has no token
        md.add_rows("q_batch_time_while_waiting[i,j]", NJ, [(q, 1), (T[None, :], -1), (gate, dmax)] + ([(idle[None, :], -1)] if online else []), lo=0)
        if tick is None:
            obj_terms, offset = [(q, 1.0 / N)], -float(sum(map(to_time, A))) / N
        else:  # integer coefficients: the sum of latencies, arrivals rounded up (a lower bound)
            obj_terms, offset = [(q, 1.0)], -float(sum(up_time(a) for a in A))
    md.set_objective(obj_terms, offset)
    if constraints.objective_cap is not None:
        cap = constraints.objective_cap * units.objective_scale(objective, N)
        md.add_rows("objective_cap", 1, [(np.asarray(cols)[None, ...], np.asarray(v, dtype=float)) for cols, v in _flat_terms(obj_terms)],
                    hi=cap - offset)
    form = BigMFormulation(instance, objective, J, constraints, md, tick, coef, units, name="bigm")
    form.info.update(md.size)
    return form


def _flat_terms(terms):
    out = []
    for cols, v in terms:
        cols = np.asarray(cols)
        out.append((cols.reshape(-1), np.broadcast_to(np.asarray(v, dtype=float), cols.shape).reshape(-1)))
    return out


# ------------------------------------------------------------------------------ warm starts


def _assignment(form: "BigMFormulation", schedule: Schedule) -> np.ndarray:
    inst = form.instance
    md = form.model
    B = md.blocks
    N, J = len(inst), form.horizon
    merged = merge_evict_only(first_token_prefix(inst, schedule.batches) if form.free_end
                               else schedule.batches)
    if len(merged) > J:
        raise ValueError(f"the schedule has {len(merged)} batches, more than the horizon J = {J}")
    x = np.zeros(md.n_cols)
    st = ReplayState(inst)
    I = inst.prompts
    coef = form.coef
    clock = ModelClock(form)
    x[B["S"][:, 0]] = I
    for j in range(J):
        bt = merged[j] if j < len(merged) else Batch({}, (), None)
        m_prev = list(st.m)
        n_prev = list(st.n)
        evicted = set(bt.evict)
        st.apply(Batch(bt.tokens, bt.evict, bt.start))
        bits = B["beta"].shape[2] if "beta" in B else 0
        for i in range(N):
            ci = bt.tokens.get(i, 0)
            ri = 0 if i in evicted else m_prev[i]
            Sp = int(I[i]) + n_prev[i]
            x[B["c"][i, j]] = ci
            x[B["r"][i, j]] = ri
            x[B["e"][i, j]] = 1 if i in evicted else 0
            x[B["g"][i, j]] = 1 if st.n[i] > n_prev[i] else 0
            x[B["h"][i, j]] = 1 if n_prev[i] >= 1 else 0
            dec = ci >= 1 and is_decode_type(n_prev[i], Sp - ri)
            pre = ci >= 1 and not dec
            x[B["d"][i, j]] = dec
            x[B["p"][i, j]] = pre
            x[B["S"][i, j + 1]] = int(I[i]) + st.n[i]
            x[B["m"][i, j + 1]] = st.m[i]
            x[B["f"][i, j + 1]] = st.finished[i]
            if "kv_blocks" in B:
                x[B["kv_blocks"][i, j]] = block_count(ri + ci, inst.system.block_size)
            if "ud" in B:
                x[B["ud"][i, j]] = ri if dec else 0
            if "up" in B:
                x[B["up"][i, j]] = ri if pre else 0
            cp = ci - (1 if dec else 0)
            if bits:
                for t in range(bits):
                    bit = (cp >> t) & 1
                    x[B["beta"][i, j, t]] = bit
                    x[B["omega"][i, j, t]] = bit * (cp + 2 * ri)
        any_c = bool(bt.tokens)
        latest_arrival = max((inst.requests[i].arrival for i in bt.tokens), default=0.0)
        features = account_batch(bt.tokens, m_prev, n_prev, I, evicted).features
        x[B["y"][j]] = any_c
        if "used" in B:
            x[B["used"][j]] = any_c or bool(bt.evict)
        clock.advance(x, j, float(np.dot(coef, features)), any_c, latest_arrival, sum(bt.tokens.values()))
        if "w" in B:
            x[B["w"][j]] = any(x[B["d"][i, j]] for i in range(N))
        if "started" in B:
            for i in range(N):
                x[B["started"][i, j]] = 1 if (j > 0 and x[B["started"][i, j - 1]]) or x[B["c"][i, j]] >= 1 else 0
    if "q" in B:
        delta = x[B["T"]] + (x[B["idle"]] if clock.online else 0)
        gate = x[B["h"]] if form.objective.first_token else x[B["f"][:, :-1]]
        x[B["q"]] = np.where(gate > 0.5, 0.0, delta[None, :])
    return x


def _extract(form: "BigMFormulation", x: np.ndarray) -> Schedule:
    inst = form.instance
    B = form.model.blocks
    N, J = len(inst), form.horizon
    c = np.rint(x[B["c"]]).astype(int)
    e = x[B["e"]] > 0.5
    st = ReplayState(inst)
    online = "idle" in B
    batches = []
    for j in range(J):
        tokens = {i: int(c[i, j]) for i in range(N) if c[i, j] >= 1}
        evict = tuple(i for i in range(N) if e[i, j] and st.m[i] > 0 and not st.finished[i] and i not in tokens)
        if not tokens and not evict:
            continue
        start = None
        if online and tokens:
            start = max(inst.requests[i].arrival for i in tokens)
        bt = Batch(tokens, evict, start)
        st.apply(bt)
        batches.append(bt)
    if st.unfinished:
        return complete_schedule(inst, batches, form.constraints)
    return Schedule(inst.requests, batches)


class BigMFormulation(Formulation):
    warm_start = _assignment
    extract = _extract
