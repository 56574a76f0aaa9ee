"""What every formulation shares (docs/formulation.md): the abstract `Formulation`, the batch-level
variables and clock rows every model has (`add_clock`), and the model clock of warm starts."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..accounting import largest_batch_time
from ..constraints import Constraints
from ..objective import Objective
from ..schedule import Schedule
from ..workload import Instance
from .model import Model
from .units import TimeUnits


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
        return self.constraints.stops_at_first_tokens(self.objective)

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
    online = not instance.offline
    y = md.binary("y", J)
    T_max = largest_batch_time(instance.system, instance.cost, len(instance), instance.tokens_held)
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
