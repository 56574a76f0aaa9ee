"""The seed paper's Big-M formulation (Section 5), completed and made exact (docs/formulation.md).

Variables per request i and batch j (S, m, c, g, e as in the paper; r, h, d, p, f, y and
the cost auxiliaries are the parts the paper leaves out "for brevity"). Every product in
the batch-time cost is linearised so that it is exact at integer points and a lower bound
elsewhere, so the solver's dual bound is a valid lower bound on the true optimum.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..schedule import Batch, ReplayState, Schedule
from ..workload import Instance
from .model import INF, Model

OBJECTIVES = ("total_latency", "mean_latency", "mean_ttft")


@dataclass(frozen=True)
class Constraints:
    """Restrictions a hypothesis adds to the semantics (all off by default)."""

    no_evict: bool = False
    no_chunk: bool = False  # a prefill-type request processes all its uncached tokens at once
    no_hybrid: bool = False  # a batch is all decode-type or all prefill-type
    max_batch_size: int | None = None  # requests processed per batch
    admission_order: tuple[int, ...] | None = None  # request ids in the order they may first be processed
    objective_cap: float | None = None  # the objective must be <= this (seconds)

    def describe(self) -> list[str]:
        out = []
        if self.no_evict:
            out.append("no evictions")
        if self.no_chunk:
            out.append("no chunked prefill")
        if self.no_hybrid:
            out.append("no hybrid batches")
        if self.max_batch_size is not None:
            out.append(f"at most {self.max_batch_size} requests per batch")
        if self.admission_order is not None:
            out.append("fixed admission order " + ",".join(map(str, self.admission_order)))
        if self.objective_cap is not None:
            out.append(f"objective <= {self.objective_cap:.9g}")
        return out


@dataclass
class Formulation:
    instance: Instance
    objective: str
    horizon: int
    constraints: Constraints
    model: Model
    tick: float | None  # integer model: time in units of 1/tick seconds, cost coefficients floored
    coef: np.ndarray  # the cost coefficients as used in the model (scaled and floored when tick)
    name: str = "bigm"
    info: dict = field(default_factory=dict)

    @property
    def blocks(self) -> dict:
        return self.model.blocks

    def objective_scale(self) -> float:
        """Model objective units per second (the integer model sums latencies instead of averaging)."""
        if self.tick is None:
            return 1.0
        return self.tick * (len(self.instance) if self.objective != "total_latency" else 1)

    # ---------------------------------------------------------------- schedules <-> points
    def warm_start(self, schedule: Schedule) -> np.ndarray:
        """A complete assignment of every variable that represents `schedule` (which must be valid)."""
        return _assignment(self, schedule)

    def extract(self, x: np.ndarray) -> Schedule:
        """The schedule a (rounded) solution point describes."""
        return _extract(self, x)


def horizon_for(instance: Instance, objective: str, upper_bound: float, allow_evict: bool = True) -> tuple[int, bool, str]:
    """(J, certified, reason): a batch count that admits an optimal schedule, given the latency
    `upper_bound` of a valid schedule for the same objective and constraints.

    An optimal schedule needs no batch that processes nothing (its evictions can be done
    in a batch of their own without time, or with the next batch), every processing batch
    costs at least the intercept, and every schedule spends at least `minimum_work` on
    top of its intercepts.
    """
    cost = instance.cost
    work = minimum_work(instance)
    n = len(instance)
    if objective == "total_latency":
        budget = upper_bound
    elif objective == "mean_latency":
        # makespan <= sum of completions = n * mean latency + sum of arrivals
        budget = n * upper_bound + float(instance.arrivals.sum())
    else:  # mean_ttft: the batches up to the last first token are bounded the same way ...
        budget = n * upper_bound + float(instance.arrivals.sum())
    processing = max(0, math.floor((budget - work) / cost.intercept * (1 + 1e-12) + 1e-9))
    # A batch that only evicts can be needed between processing batches, unless dropping the eviction
    # (the request continues instead of refilling) never costs more: decode_kv, prefill_kv <= per_token.
    evict_only_useless = not allow_evict or (cost.decode_kv <= cost.per_token and cost.prefill_kv <= cost.per_token)
    horizon = processing if evict_only_useless else 2 * processing
    if objective == "mean_ttft":
        if not allow_evict:
            return max(horizon, 1), False, "the tail after the last first token is not bounded without evictions"
        # ... and after it every request can finish alone after evicting the rest
        P = min(instance.system.max_prefill_tokens, instance.system.max_batch_tokens)
        tail = sum(math.ceil((r.prompt + r.output) / P) + r.output + 1 for r in instance.requests)
        return horizon + tail, True, "first-token phase bounded by the upper bound, tail by serving requests one by one"
    return max(horizon, 1), True, "batches <= (upper bound - minimum work) / intercept"


def minimum_work(instance: Instance) -> float:
    """A lower bound on the non-intercept cost of any complete schedule (docs/formulation.md)."""
    cost = instance.cost
    total = 0.0
    for r in instance.requests:
        total += cost.per_token * (r.prompt + r.output - 1)
        total += cost.prefill_attention * r.prompt ** 2 + cost.per_prefill_request
        for k in range(2, r.output + 1):  # token k, k >= 2: a decode of m = I + k - 2 or a prefill-type refill
            m = r.prompt + k - 2
            total += min(cost.decode_kv * m, cost.prefill_attention * (2 * (m + 1) - 1) + cost.per_prefill_request)
    return total


def build_bigm(instance: Instance, objective: str = "total_latency", horizon: int = 8,
               constraints: Constraints = Constraints(), tick: float | None = None) -> Formulation:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}")
    sys_ = instance.system
    cost = instance.cost
    N, J = len(instance), int(horizon)
    I = instance.prompts.astype(float)
    O = instance.outputs.astype(float)
    A = instance.arrivals
    online = bool((A > 0).any())
    C, P, M, b = sys_.max_batch_tokens, sys_.max_prefill_tokens, sys_.kv_capacity, sys_.block_size
    coef = cost.coefficients
    if tick is not None:
        coef = np.floor(coef * tick)  # rounding down keeps every schedule's model cost <= its true cost
        to_time = lambda s: math.floor(s * tick)  # noqa: E731 (lower time constants relax)
        up_time = lambda s: math.ceil(s * tick)  # noqa: E731
    else:
        to_time = up_time = float
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
    lbf[:, J] = 1  # termination: every request finishes within the horizon
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
    y = md.binary("y", J)

    T_max = (cost.intercept + cost.per_token * C + cost.decode_kv * M + cost.prefill_attention * (C * C + 2.0 * M * C)
             + cost.prefill_kv * M + cost.per_prefill_request * min(N, C))
    T = md.add_vars("T", J, 0, up_time(T_max), tick is not None)
    idle_max = float(A.max()) if online else 0.0
    idle = md.add_vars("idle", J, 0, up_time(idle_max), tick is not None) if online else None

    Sp, Sn = S[:, :-1], S[:, 1:]
    mp, mn = m[:, :-1], m[:, 1:]
    fp, fn = f[:, :-1], f[:, 1:]
    NJ = (N, J)
    Rc, Cc, Rsc, Rkc, Ic, Oc = col(R), col(Cmax), col(Rs), col(Rk), col(I), col(O)

    # S grows by the generated token; r is m after evictions (paper (1), first half)
    md.add_rows(NJ, [(Sn, 1), (Sp, -1), (g, -1)], 0, 0)
    md.add_rows(NJ, [(r, 1), (mp, -1)], hi=0)
    md.add_rows(NJ, [(r, 1), (mp, -1), (e, Rc)], lo=0)
    md.add_rows(NJ, [(r, 1), (e, Rc)], hi=Rc)
    # tokens to process (paper (2)): none when evicted or finished, at most the uncached ones
    md.add_rows(NJ, [(c, 1), (e, Cc)], hi=Cc)
    md.add_rows(NJ, [(c, 1), (fp, Cc)], hi=Cc)
    md.add_rows(NJ, [(c, 1), (Sp, -1), (r, 1)], hi=0)
    # token generation (paper (3)): g = 1 exactly when all uncached tokens are processed
    md.add_rows(NJ, [(c, 1), (Sp, -1), (r, 1), (g, -Rsc)], lo=-Rsc)
    md.add_rows(NJ, [(c, 1), (Sp, -1), (r, 1), (g, -Rsc)], hi=-1)
    md.add_rows(NJ, [(g, 1), (fp, 1)], hi=1)
    # finished after batch j: f = 1 iff S = I + O
    md.add_rows(NJ, [(Sn, 1), (fn, -Oc)], lo=Ic)
    md.add_rows(NJ, [(Sn, 1), (fn, -1)], hi=Ic + Oc - 1)
    # cached after the batch (paper (1), second half): r + c, or 0 once finished (KV freed)
    md.add_rows(NJ, [(mn, 1), (r, -1), (c, -1)], hi=0)
    md.add_rows(NJ, [(mn, 1), (r, -1), (c, -1), (fn, Rkc)], lo=0)
    md.add_rows(NJ, [(mn, 1), (fn, Rkc)], hi=Rkc)
    # h: a token was generated before batch j (n >= 1)
    md.add_rows(NJ, [(Sp, 1), (h, -1)], lo=Ic)
    md.add_rows(NJ, [(Sp, 1), (h, -Oc)], hi=Ic)
    # phase: d decode-type (n >= 1 and S - m = 1), p prefill-type (any other processing)
    md.add_rows(NJ, [(d, 1), (h, -1)], hi=0)
    md.add_rows(NJ, [(Sp, 1), (r, -1), (d, Rsc)], hi=1 + Rsc)
    md.add_rows(NJ, [(Sp, 1), (r, -1), (h, -1), (p, -2)], lo=-1)
    md.add_rows(NJ, [(d, 1), (p, 1)], hi=1)
    md.add_rows(NJ, [(c, 1), (d, -1), (p, -1)], lo=0)
    md.add_rows(NJ, [(c, 1), (d, -Cc), (p, -Cc)], hi=0)
    md.add_rows(NJ, [(y[None, :], 1), (d, -1), (p, -1)], lo=0)
    # batch limits (paper (4), plus P): prefill-type tokens are c - d, since a decode processes 1
    md.add_rows(J, [(c.T, 1)], hi=C)
    md.add_rows(J, [(c.T, 1), (d.T, -1)], hi=P)
    if b == 1:
        md.add_rows(J, [(r.T, 1), (c.T, 1)], hi=M)
    else:
        kb = md.add_vars("kv_blocks", NJ, 0, col(np.ceil(Rk / b)), True)
        md.add_rows(NJ, [(kb, b), (r, -1), (c, -1)], lo=0)
        md.add_rows(J, [(kb.T, b)], hi=M)
    # empty batches last (every schedule has such an equivalent)
    if J > 1:
        md.add_rows(J - 1, [(y[:-1], 1), (y[1:], -1)], lo=0)

    # ---- batch time T_j = coef . features, products linearised from below
    terms = [(T, 1), (y, -c_int), (c.T, -c_tok), (p.T, -c_ppr)]
    if c_dkv > 0:  # ud = d * r
        ud = md.add_vars("ud", NJ, 0, col(R), tick is not None)
        md.add_rows(NJ, [(ud, 1), (r, -1), (d, -Rc)], lo=-Rc)
        terms.append((ud.T, -c_dkv))
    if c_pkv > 0:  # up = p * r
        up = md.add_vars("up", NJ, 0, col(R), tick is not None)
        md.add_rows(NJ, [(up, 1), (r, -1), (p, -Rc)], lo=-Rc)
        terms.append((up.T, -c_pkv))
    if c_att > 0:  # (c - d)^2 + 2 r (c - d) = sum_t 2^t beta_t ((c - d) + 2 r), with c - d = sum_t 2^t beta_t
        B = max(1, int(np.ceil(np.log2(Cmax.max() + 1))))
        pw = 2.0 ** np.arange(B)
        beta_ub = (pw[None, :] <= Cmax[:, None]).astype(float)  # bits above Cmax are 0
        beta = md.add_vars("beta", (N, J, B), 0, np.broadcast_to(beta_ub[:, None, :], (N, J, B)), True)
        U = (Cmax + 2 * R)[:, None, None]
        omega = md.add_vars("omega", (N, J, B), 0, np.broadcast_to(U, (N, J, B)), tick is not None)
        md.add_rows(NJ, [(beta, pw), (c, -1), (d, 1)], 0, 0)
        md.add_rows((N, J, B), [(omega, 1), (c[:, :, None], -1), (d[:, :, None], 1), (r[:, :, None], -2), (beta, -U)], lo=-U)
        terms.append((omega.transpose(1, 0, 2), -c_att * pw))
    md.add_rows(J, terms, 0, 0)

    # ---- time and arrivals: t_j = t_{j-1} + T_{j-1} + idle_j; a request runs only from its arrival
    if online:
        t = md.add_vars("t", J, 0, up_time(idle_max + J * T_max), tick is not None)
        md.add_rows(1, [(t[:1], 1), (idle[:1], -1)], 0, 0)
        if J > 1:
            md.add_rows(J - 1, [(t[1:], 1), (t[:-1], -1), (T[:-1], -1), (idle[1:], -1)], 0, 0)
        arr = np.array([to_time(a) for a in A])[:, None]
        md.add_rows(NJ, [(t[None, :], 1), (d, -arr), (p, -arr)], lo=0)

    # ---- hypotheses
    if constraints.no_chunk:
        md.add_rows(NJ, [(c, 1), (Sp, -1), (r, 1), (p, -Rsc)], lo=-Rsc)
    if constraints.no_hybrid:
        w = md.binary("w", J)
        md.add_rows(NJ, [(d, 1), (w[None, :], -1)], hi=0)
        md.add_rows(NJ, [(p, 1), (w[None, :], 1)], hi=1)
    if constraints.max_batch_size is not None:
        md.add_rows(J, [(d.T, 1), (p.T, 1)], hi=constraints.max_batch_size)
    if constraints.admission_order is not None:
        order = list(constraints.admission_order)
        if sorted(order) != list(range(N)):
            raise ValueError("admission_order must list every request id once")
        sg = md.binary("started", NJ)
        md.add_rows(NJ, [(sg, 1), (d, -1), (p, -1)], lo=0)
        md.add_rows((N, J - 1), [(sg[:, 1:], 1), (sg[:, :-1], -1)], lo=0)
        md.add_rows((N, 1), [(sg[:, :1], 1), (d[:, :1], -1), (p[:, :1], -1)], hi=0)
        if J > 1:
            md.add_rows((N, J - 1), [(sg[:, 1:], 1), (sg[:, :-1], -1), (d[:, 1:], -1), (p[:, 1:], -1)], hi=0)
        for a_, b_ in zip(order, order[1:]):
            md.add_rows(J, [(sg[b_], 1), (sg[a_], -1)], hi=0)

    # ---- objective
    delta = [(T, 1)] + ([(idle, 1)] if online else [])
    if objective == "total_latency":
        obj_terms, offset = delta, 0.0
    else:
        dmax = up_time(T_max + idle_max)
        q = md.add_vars("q", NJ, 0, dmax, tick is not None)
        gate = fp if objective == "mean_latency" else h  # q_ij >= Delta_j while i is unfinished / has no token
        md.add_rows(NJ, [(q, 1), (T[None, :], -1), (gate, dmax)] + ([(idle[None, :], -1)] if online else []), lo=0)
        if tick is None:
            obj_terms, offset = [(q, 1.0 / N)], -float(A.sum()) / N
        else:  # integer coefficients: the sum of latencies, arrivals rounded up (a lower bound)
            obj_terms, offset = [(q, 1.0)], -float(sum(up_time(a) for a in A))
    md.set_objective(obj_terms, offset)
    if constraints.objective_cap is not None:
        cap = constraints.objective_cap * (1.0 if tick is None else tick * (N if objective != "total_latency" else 1))
        md.add_rows(1, [(np.asarray(cols)[None, ...], np.asarray(v, dtype=float)) for cols, v in _flat_terms(obj_terms)],
                    hi=cap - offset)
    form = Formulation(instance, objective, J, constraints, md, tick, coef)
    form.info.update(md.size)
    return form


def _flat_terms(terms):
    out = []
    for cols, v in terms:
        cols = np.asarray(cols)
        out.append((cols.reshape(-1), np.broadcast_to(np.asarray(v, dtype=float), cols.shape).reshape(-1)))
    return out


# ------------------------------------------------------------------------------ warm starts

def _assignment(form: Formulation, schedule: Schedule) -> np.ndarray:
    inst = form.instance
    md = form.model
    B = md.blocks
    N, J = len(inst), form.horizon
    batches = [bt for bt in schedule.batches if bt.tokens or bt.evict]
    # an evict-only batch merges into the next one unless that one processes an evicted request
    merged: list[Batch] = []
    pending: list[int] = []
    for bt in batches:
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
    if len(merged) > J:
        raise ValueError(f"the schedule has {len(merged)} batches, more than the horizon J = {J}")
    x = np.zeros(md.n_cols)
    st = ReplayState(inst)
    I = inst.prompts
    coef = form.coef
    tick = form.tick
    to_time = (lambda s: math.floor(s * tick)) if tick else float
    online = "idle" in B
    clock = 0.0  # model time
    prev_T = 0.0
    x[B["S"][:, 0]] = I
    for j in range(J):
        bt = merged[j] if j < len(merged) else Batch({}, (), None)
        m_prev = list(st.m)
        n_prev = list(st.n)
        evicted = set(bt.evict)
        st.apply(Batch(bt.tokens, bt.evict, None))
        tok = ptok = npre = 0
        dkv = pkv = att = 0
        any_c = False
        latest_arrival = 0.0
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
            dec = ci >= 1 and n_prev[i] >= 1 and Sp - ri == 1
            pre = ci >= 1 and not dec
            x[B["d"][i, j]] = dec
            x[B["p"][i, j]] = pre
            x[B["S"][i, j + 1]] = int(I[i]) + st.n[i]
            x[B["m"][i, j + 1]] = st.m[i]
            x[B["f"][i, j + 1]] = st.finished[i]
            if "kv_blocks" in B:
                x[B["kv_blocks"][i, j]] = -(-(ri + ci) // inst.system.block_size)
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
            if ci >= 1:
                any_c = True
                latest_arrival = max(latest_arrival, inst.requests[i].arrival)
                tok += ci
                if dec:
                    dkv += ri
                else:
                    ptok += ci
                    npre += 1
                    att += cp * cp + 2 * ri * cp
                    pkv += ri
        x[B["y"][j]] = any_c
        T = float(np.dot(coef, [1.0 if any_c else 0.0, tok, dkv, att, pkv, npre]))
        x[B["T"][j]] = T
        start = clock + prev_T
        if online:
            t_j = max(start, to_time(latest_arrival)) if any_c else start
            x[B["idle"][j]] = t_j - start
            x[B["t"][j]] = t_j
            clock = t_j
        else:
            clock = start
        prev_T = T
        if "w" in B:
            x[B["w"][j]] = any(x[B["d"][i, j]] for i in range(N))
        if "started" in B:
            for i in range(N):
                x[B["started"][i, j]] = 1 if (j > 0 and x[B["started"][i, j - 1]]) or x[B["c"][i, j]] >= 1 else 0
    if "q" in B:
        delta = x[B["T"]] + (x[B["idle"]] if online else 0)
        gate = x[B["f"][:, :-1]] if form.objective == "mean_latency" else x[B["h"]]
        x[B["q"]] = np.where(gate > 0.5, 0.0, delta[None, :])
    return x


def _extract(form: Formulation, x: np.ndarray) -> Schedule:
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
    return Schedule(inst.requests, batches)
