"""The model's clock: continuous models count time in units of the intercept, integer (CP-SAT)
models in whole ticks, with every cost coefficient floored so that bounds stay valid."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..accounting import largest_batch_time
from ..objective import Objective
from ..workload import Instance


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
        return self.per_second * (n_requests if self.integral and objective.is_mean else 1)


CPSAT_MAGNITUDE_BITS = 36


def tick_for(instance: Instance, horizon: int) -> float:
    """Time units per second for the integer (CP-SAT) model.

    Cost coefficients are floored to integers in these units, which keeps the bound valid.
    If a power of ten makes every coefficient and arrival an exact integer, that one is used
    (then nothing is lost); otherwise the smallest non-zero coefficient becomes >= 10^5
    units. Either way horizon * (largest batch time) must stay below 2^36 units: with larger
    values CP-SAT's floating-point relaxation was seen proving a wrong optimum (a bound 9% above a
    feasible point of the same model, tests/test_solvers.py::test_cpsat_with_a_non_decimal_preset_and_arrivals).
    """
    cost, s = instance.cost, instance.system
    t_max = largest_batch_time(s, cost, len(instance), instance.tokens_held)
    span = ((horizon + 1) * t_max + float(instance.arrivals.max()) + 1.0) * max(1, len(instance))
    limit = 2.0 ** CPSAT_MAGNITUDE_BITS / span
    values = [v for v in list(cost.coefficients) + list(cost.per_token_above) + list(instance.arrivals) if v > 0]
    for k in range(0, 13):
        tick = 10.0 ** k
        if tick > limit:
            break
        if all(abs(v * tick - round(v * tick)) <= 1e-9 * max(1.0, v * tick) for v in values):
            return tick
    return min(1e5 / min(c for c in cost.coefficients if c > 0), limit)
