"""What every formulation shares (docs/formulation.md): the hypothesis constraints, the model's time
units, the abstract `Formulation`, the certified horizon, the model clock of warm starts, and the
schedule transforms between the semantics' batches and a model's batches."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..accounting import is_decode_type, largest_batch_time
from ..objective import Objective
from ..schedule import Batch, ReplayState, Schedule
from ..workload import Instance
from .bounds import prefill_work, minimum_work, own_time_lower_bound
from .model import Model


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


@dataclass(frozen=True)
class TimeUnits:
    """The model's clock: `per_second` model time units per second.

    Continuous models (HiGHS, CBC) measure time in units of the batch intercept, exactly (no
    rounding): batch times are then about 1, so the solvers' absolute tolerances (1e-6 to 1e-9)
    are small against them, which they are not against 4 ms batches in seconds. Integer models
    (CP-SAT, `tick`) floor every cost coefficient and arrival and round the arrivals subtracted in
    the objective up, so a schedule's model cost never exceeds its true cost and the bound stays
    valid. The 1e-12 slack in the rounding only absorbs the binary representation of values
    such as 0.1 * 3, which are whole ticks up to the last bit.
    """
    per_second: float
    integral: bool

    @staticmethod
    def for_model(instance: Instance, tick: float | None) -> "TimeUnits":
        if tick is not None:
            return TimeUnits(float(tick), True)
        c = instance.cost
        typical = c.intercept if c.intercept > 0 else c.intercept + c.per_token
        return TimeUnits(1.0 / typical if typical > 0 else 1.0, False)

    def coefficients(self, cost) -> np.ndarray:
        return self._scaled(cost.coefficients)

    def kink_slopes(self, cost) -> np.ndarray:
        """The extra per-token slopes past the cost model's token knees, in model units."""
        return self._scaled(np.asarray(cost.per_token_above, dtype=float))

    def _scaled(self, seconds: np.ndarray) -> np.ndarray:
        coef = seconds * self.per_second
        return np.floor(coef * (1 + 1e-12)) if self.integral else coef

    def down(self, seconds: float) -> float:
        v = seconds * self.per_second
        return float(math.floor(v + 1e-12 * max(1.0, abs(v)))) if self.integral else v

    def up(self, seconds: float) -> float:
        v = seconds * self.per_second
        return float(math.ceil(v - 1e-12 * max(1.0, abs(v)))) if self.integral else v

    def objective_scale(self, objective: Objective, n_requests: int) -> float:
        """Model objective units per second (the integer model sums latencies instead of averaging)."""
        return self.per_second * (n_requests if self.integral and Objective.parse(objective).is_mean else 1)




@dataclass
class Formulation:
    instance: Instance
    objective: Objective
    horizon: int
    constraints: Constraints
    model: Model
    tick: float | None  # integer model: time in units of 1/tick seconds, cost coefficients floored
    coef: np.ndarray  # the cost coefficients as used in the model (scaled, and floored when tick)
    units: "TimeUnits"
    name: str = ""
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
        raise NotImplementedError

    def extract(self, x: np.ndarray) -> Schedule | None:
        """The schedule a (rounded) solution point describes (None: a first-token prefix that cannot be completed)."""
        raise NotImplementedError


def stops_at_first_tokens(objective: Objective, constraints: Constraints) -> bool:
    return Objective.parse(objective).first_token and not constraints.no_evict


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
    objective = Objective.parse(objective)
    if not objective.is_mean:
        budget, work = upper_bound, minimum_work(instance)
    else:
        # The last completion (first token) of an optimal schedule comes at most at the sum of all of them,
        # n * mean + sum of arrivals, less what every other request needs at least after its arrival.
        first = objective.first_token
        own = [r.arrival + own_time_lower_bound(instance, i, first) for i, r in enumerate(instance.requests)]
        budget = n * upper_bound + float(instance.arrivals.sum()) - (sum(own) - max(own))
        work = minimum_work(instance) if not first else float(prefill_work(instance.prompts, cost).sum())
    processing = max(0, math.floor((budget - work) / cost.intercept * (1 + 1e-12) + 1e-9))
    horizon = processing if (not allow_evict or evict_batches_implicit) else 2 * processing
    if objective.first_token:
        if allow_evict:  # the model stops at the first tokens; any prefix can then be completed by evicting
            return max(horizon, 1), True, "batches up to the last first token <= (bound on its time - prefill work) / intercept"
        # without evictions only decodes are left after the last first token, one token per batch at least
        tail = sum(r.output - 1 for r in instance.requests)
        return horizon + tail, True, "first-token phase bounded by the upper bound, then at most sum(O - 1) decode batches"
    return max(horizon, 1), True, "batches <= (upper bound - minimum work) / intercept"


class ModelClock:
    """Sets T, idle and t of a warm start batch by batch, on the model's own clock (ticks, floored costs)."""

    def __init__(self, form: Formulation):
        self.blocks = form.model.blocks
        self.online = "idle" in self.blocks
        self.to_time = form.units.down
        self.knees = np.asarray(form.instance.cost.token_knees, dtype=float)
        self.slopes = form.units.kink_slopes(form.instance.cost)
        self.clock = self.prev_T = 0.0

    def advance(self, x: np.ndarray, j: int, T: float, processes: bool, latest_arrival: float, tokens: int) -> None:
        """Batch j takes T model units before the token kinks; it processes `tokens` tokens."""
        B = self.blocks
        if len(self.knees):
            above = np.maximum(0.0, tokens - self.knees)
            x[B["tokens_above"][j]] = above
            T += float(self.slopes @ above)
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
    chunk; else None). Used after models
    that stop at the first tokens, whose objective the completion does not change."""
    st = ReplayState(instance)
    for bt in batches:
        st.apply(bt)
    out = list(batches)
    s = instance.system
    P = s.prefill_per_batch
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
            refillable = [i for i in order if not constraints.no_chunk or st.prompt[i] + st.n[i] <= P]
            keep = next((i for i in order if st.m[i] > 0 and i not in refillable), order[0])
            victims = tuple(i for i in refillable if i != keep and st.m[i] > 0)
            if constraints.no_evict or not victims:
                return None
            bt = Batch({}, victims, None)
        st.apply(bt)
        out.append(bt)
    return Schedule(instance.requests, out)


@dataclass
class Clock:
    """The batch-level variables every model shares: y (batch processes), T (batch time), with
    arrivals idle (wait before the batch) and t (its start), and with a kinked cost model the
    batch's tokens above each knee (`above`, J x knees)."""
    y: np.ndarray
    T: np.ndarray
    idle: np.ndarray | None
    t: np.ndarray | None
    T_max: float
    idle_max: float
    above: np.ndarray | None
    knees: np.ndarray
    kink_slopes: np.ndarray  # model units per token above each knee

    def kink_time_terms(self) -> list:
        """The batch-time row's terms (shape J) of the convex token term: slope * tokens above each knee."""
        return [] if self.above is None else [(self.above, self.kink_slopes[None, :])]

    def link_kinks(self, md: Model, j: int, token_terms: list) -> None:
        """above[j, k] >= (tokens of batch j) - knee_k, from batch j's token terms [(cols, coefs)]:
        exact at the optimum, since the batch time only grows with `above`."""
        if self.above is None or not token_terms:
            return
        K = len(self.knees)
        terms = [(self.above[j], 1.0)] + [(np.broadcast_to(np.asarray(c), (K,) + np.shape(c)),
                                           -np.broadcast_to(np.asarray(v, dtype=float), (K,) + np.shape(c)))
                                          for c, v in token_terms]
        md.add_rows(f"tokens_above_knee[j={j}]", K, terms, lo=-self.knees)


def add_clock(md: Model, instance: Instance, J: int, units, integral: bool) -> Clock:
    """The batch-level variables and the clock rows t_j = t_{j-1} + T_{j-1} + idle_j (with arrivals)."""
    A = instance.arrivals
    online = bool((A > 0).any())
    y = md.binary("y", J)
    T_max = largest_batch_time(instance.system, instance.cost, len(instance))
    T = md.add_vars("T", J, 0, units.up(T_max), integral)
    idle_max = float(A.max()) if online else 0.0
    idle = t = None
    if online:
        idle = md.add_vars("idle", J, 0, units.up(idle_max), integral)
        t = md.add_vars("t", J, 0, units.up(idle_max + J * T_max), integral)
        md.add_rows("clock_start", 1, [(t[:1], 1), (idle[:1], -1)], 0, 0)
        if J > 1:
            md.add_rows("clock_after[j]", J - 1, [(t[1:], 1), (t[:-1], -1), (T[:-1], -1), (idle[1:], -1)], 0, 0)
    knees = np.asarray(instance.cost.token_knees, dtype=float)
    above = None
    if len(knees):
        room = np.maximum(0.0, instance.system.max_batch_tokens - knees)
        above = md.add_vars("tokens_above", (J, len(knees)), 0, room[None, :], integral)
    return Clock(y, T, idle, t, T_max, idle_max, above, knees, units.kink_slopes(instance.cost))
