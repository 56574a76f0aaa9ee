"""What every formulation shares: the hypothesis constraints and the model's time units (docs/formulation.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..objective import OBJECTIVES
from ..workload import Instance


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
        coef = cost.coefficients * self.per_second
        return np.floor(coef * (1 + 1e-12)) if self.integral else coef

    def down(self, seconds: float) -> float:
        v = seconds * self.per_second
        return float(math.floor(v + 1e-12 * max(1.0, abs(v)))) if self.integral else v

    def up(self, seconds: float) -> float:
        v = seconds * self.per_second
        return float(math.ceil(v - 1e-12 * max(1.0, abs(v)))) if self.integral else v

    def objective_scale(self, objective: str, n_requests: int) -> float:
        """Model objective units per second (the integer model sums latencies instead of averaging)."""
        return self.per_second * (n_requests if self.integral and objective != "total_latency" else 1)


