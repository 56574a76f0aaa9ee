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
from .base import OBJECTIVES, Constraints, TimeUnits
from .model import Model

@dataclass
class Formulation:
    instance: Instance
    objective: str
    horizon: int
    constraints: Constraints
    model: Model
    tick: float | None  # integer model: time in units of 1/tick seconds, cost coefficients floored
    coef: np.ndarray  # the cost coefficients as used in the model (scaled, and floored when tick)
    units: "TimeUnits"
    name: str = "bigm"
    info: dict = field(default_factory=dict)

    @property
    def free_end(self) -> bool:
        """The model stops at the first tokens (mean TTFT with evictions allowed); schedules are completed after."""
        return stops_at_first_tokens(self.objective, self.constraints)

    @property
    def blocks(self) -> dict:
        return self.model.blocks

    def objective_scale(self) -> float:
        """Model objective units per second (the integer model sums latencies instead of averaging)."""
        return self.units.objective_scale(self.objective, len(self.instance))

    # ---------------------------------------------------------------- schedules <-> points
    def warm_start(self, schedule: Schedule) -> np.ndarray:
        """A complete assignment of every variable that represents `schedule` (which must be valid)."""
        return _assignment(self, schedule)

    def extract(self, x: np.ndarray) -> Schedule:
        """The schedule a (rounded) solution point describes."""
        return _extract(self, x)


def stops_at_first_tokens(objective: str, constraints: Constraints) -> bool:
    return objective == "mean_ttft" and not constraints.no_evict


def horizon_for(instance: Instance, objective: str, upper_bound: float, allow_evict: bool = True,
                evict_batches_implicit: bool = False) -> tuple[int, bool, str]:
    """(J, certified, reason): a batch count that admits an optimal schedule, given the latency
    `upper_bound` of a valid schedule for the same objective and constraints.

    Every processing batch costs at least the intercept, and every schedule spends at least
    `minimum_work` on top of its intercepts, which bounds the processing batches. A batch
    that processes nothing is only needed to evict a request that the next batch refills
    (other evictions move into the next batch); at most one before each processing batch,
    unless the formulation represents such a batch inside the next one
    (`evict_batches_implicit`).
    """
    cost = instance.cost
    n = len(instance)
    if objective == "total_latency":
        budget, work = upper_bound, minimum_work(instance)
    else:
        # The last completion (first token) of an optimal schedule comes at most at the sum of all of them,
        # n * mean + sum of arrivals, less what every other request needs at least after its arrival.
        first = objective == "mean_ttft"
        own = [r.arrival + own_time_lower_bound(instance, i, first) for i, r in enumerate(instance.requests)]
        budget = n * upper_bound + float(instance.arrivals.sum()) - (sum(own) - max(own))
        work = minimum_work(instance) if not first else sum(cost.per_token * r.prompt + cost.prefill_attention * r.prompt ** 2 + cost.per_prefill_request
                   for r in instance.requests)
    processing = max(0, math.floor((budget - work) / cost.intercept * (1 + 1e-12) + 1e-9))
    horizon = processing if (not allow_evict or evict_batches_implicit) else 2 * processing
    if objective == "mean_ttft":
        if allow_evict:  # the model stops at the first tokens; any prefix can then be completed by evicting
            return max(horizon, 1), True, "batches up to the last first token <= (bound on its time - prefill work) / intercept"
        # without evictions only decodes are left after the last first token, one token per batch at least
        tail = sum(r.output - 1 for r in instance.requests)
        return horizon + tail, True, "first-token phase bounded by the upper bound, then at most sum(O - 1) decode batches"
    return max(horizon, 1), True, "batches <= (upper bound - minimum work) / intercept"


def own_time_lower_bound(instance: Instance, i: int, first_token: bool = False) -> float:
    """Least time request i needs from its arrival to its completion (first token), even alone."""
    r = instance.requests[i]
    cost = instance.cost
    P = min(instance.system.max_prefill_tokens, instance.system.max_batch_tokens)
    prefill = math.ceil(r.prompt / P) * cost.intercept + cost.per_token * r.prompt + cost.prefill_attention * r.prompt ** 2 \
        + cost.per_prefill_request
    if first_token:
        return prefill
    return (math.ceil(r.prompt / P) + r.output - 1) * cost.intercept + request_minimum_work(r, cost)


def minimum_work(instance: Instance) -> float:
    """A lower bound on the non-intercept cost of any complete schedule (docs/formulation.md)."""
    return sum(request_minimum_work(r, instance.cost) for r in instance.requests)


def request_minimum_work(r, cost) -> float:
    """The least non-intercept batch time that request r adds to any complete schedule."""
    total = cost.per_token * (r.prompt + r.output - 1)
    total += cost.prefill_attention * r.prompt ** 2 + cost.per_prefill_request
    for k in range(2, r.output + 1):
        # token k, k >= 2: after token k - 1 the request holds m = I + k - 2 tokens. Either a decode
        # generates it, or m tokens were evicted and are processed again (at least per_token m and
        # chunks whose attention telescopes to m^2, one prefill-type chunk) besides the one token.
        m = r.prompt + k - 2
        total += min(cost.decode_kv * m, cost.per_token * m + cost.prefill_attention * m * m + cost.per_prefill_request)
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
    free_end = stops_at_first_tokens(objective, constraints)
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
    if free_end:
        md.add_rows(N, [(S[:, J], 1)], lo=I + 1)
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
    # unused batches (nothing processed or evicted) last: every schedule has such an equivalent
    if J > 1:
        used = md.binary("used", J)
        md.add_rows(NJ, [(used[None, :], 1), (e, -1)], lo=0)
        md.add_rows(J, [(used, 1), (y, -1)], lo=0)
        md.add_rows(J - 1, [(used[:-1], 1), (used[1:], -1)], lo=0)

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
        if not constraints.no_evict:  # an evicted request recomputes all S tokens in one chunk: S <= min(P, C)
            big = np.maximum(Rsc - min(P, C), 0)
            md.add_rows(NJ, [(Sp, 1), (e, big)], hi=Rsc)
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
            obj_terms, offset = [(q, 1.0 / N)], -float(sum(map(to_time, A))) / N
        else:  # integer coefficients: the sum of latencies, arrivals rounded up (a lower bound)
            obj_terms, offset = [(q, 1.0)], -float(sum(up_time(a) for a in A))
    md.set_objective(obj_terms, offset)
    if constraints.objective_cap is not None:
        cap = constraints.objective_cap * units.objective_scale(objective, N)
        md.add_rows(1, [(np.asarray(cols)[None, ...], np.asarray(v, dtype=float)) for cols, v in _flat_terms(obj_terms)],
                    hi=cap - offset)
    form = Formulation(instance, objective, J, constraints, md, tick, coef, units)
    form.info.update(md.size)
    return form


def _flat_terms(terms):
    out = []
    for cols, v in terms:
        cols = np.asarray(cols)
        out.append((cols.reshape(-1), np.broadcast_to(np.asarray(v, dtype=float), cols.shape).reshape(-1)))
    return out


# ------------------------------------------------------------------------------ warm starts

class ModelClock:
    """Sets T, idle and t of a warm start batch by batch, on the model's own clock (ticks, floored costs)."""

    def __init__(self, form: Formulation):
        self.blocks = form.model.blocks
        self.online = "idle" in self.blocks
        self.to_time = form.units.down
        self.clock = self.prev_T = 0.0

    def advance(self, x: np.ndarray, j: int, T: float, processes: bool, latest_arrival: float) -> None:
        B = self.blocks
        x[B["T"][j]] = T
        start = self.clock + self.prev_T
        self.clock = start
        if self.online:
            t_j = max(start, self.to_time(latest_arrival)) if processes else start
            x[B["idle"][j]] = t_j - start
            x[B["t"][j]] = t_j
            self.clock = t_j
        self.prev_T = T


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


def _merge_evict_only(batches) -> list[Batch]:
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


def _assignment(form: Formulation, schedule: Schedule) -> np.ndarray:
    inst = form.instance
    md = form.model
    B = md.blocks
    N, J = len(inst), form.horizon
    merged = _merge_evict_only(first_token_prefix(inst, schedule.batches) if form.free_end
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
        if "used" in B:
            x[B["used"][j]] = any_c or bool(bt.evict)
        clock.advance(x, j, float(np.dot(coef, [1.0 if any_c else 0.0, tok, dkv, att, pkv, npre])), any_c, latest_arrival)
        if "w" in B:
            x[B["w"][j]] = any(x[B["d"][i, j]] for i in range(N))
        if "started" in B:
            for i in range(N):
                x[B["started"][i, j]] = 1 if (j > 0 and x[B["started"][i, j - 1]]) or x[B["c"][i, j]] >= 1 else 0
    if "q" in B:
        delta = x[B["T"]] + (x[B["idle"]] if clock.online else 0)
        gate = x[B["f"][:, :-1]] if form.objective == "mean_latency" else x[B["h"]]
        x[B["q"]] = np.where(gate > 0.5, 0.0, delta[None, :])
    return x


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
    when nothing fits, all but one request are evicted (if allowed; else None). Used after models
    that stop at the first tokens, whose objective the completion does not change."""
    st = ReplayState(instance)
    for bt in batches:
        st.apply(bt)
    out = list(batches)
    s = instance.system
    P = min(s.max_prefill_tokens, s.max_batch_tokens)
    cap = constraints.max_batch_size or len(instance)
    kinds = ({True}, {False}) if constraints.no_hybrid else ({True, False},)  # decode-type or prefill-type

    def fill(order, allowed) -> dict[int, int]:
        tokens: dict[int, int] = {}
        kv, tok, ptok = st.kv_used, 0, 0
        for i in order:
            if len(tokens) == cap:
                break
            S = st.prompt[i] + st.n[i]
            decode = st.n[i] >= 1 and S - st.m[i] == 1
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
            victims = tuple(i for i in order[1:] if st.m[i] > 0)  # keep the request with the least work left
            if constraints.no_evict or not victims:
                return None
            bt = Batch({}, victims, None)
        st.apply(bt)
        out.append(bt)
    return Schedule(instance.requests, out)


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
    if st.unfinished:
        return complete_schedule(inst, batches, form.constraints)
    return Schedule(inst.requests, batches)
