"""The linear batch-time cost model (seed paper, Section 3.2).

T = intercept
  + per_token           * sum c
  + decode_kv           * sum over decode-type requests of m
  + prefill_attention   * sum over prefill-type requests of (c^2 + 2 m c)
  + prefill_kv          * sum over prefill-type requests of m
  + per_prefill_request * number of prefill-type requests

  + sum over k of per_token_above[k] * max(0, sum c - token_knees[k])   (optional)

m is the number of cached tokens of a request before the batch, c the tokens it
processes. A batch that processes nothing takes no time. The optional term bends the
per-token slope upward at each knee (GPUs turn compute-bound as a batch grows); its slopes
are >= 0, so the batch time stays convex in the tokens and every formulation keeps it
linear with one auxiliary variable per batch and knee (docs/formulation.md). A cost model
without knees means exactly what it meant before.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ..accounting import FEATURES

#: cost coefficients are finite and at most this (seconds per unit of their feature)
MAX_COST = 1e3
#: the intercept is at least this (seconds a batch): time is counted in intercepts (the models' units,
#: their horizon), which a vanishing one would make infinite
MIN_INTERCEPT = 1e-9


def coefficient_problem(value, positive: bool = False) -> str | None:
    """Why `value` cannot be a cost coefficient (None: it can): a finite number in [0, MAX_COST] (in
    (0, MAX_COST] where `positive`: the intercept)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return f"must be a number, got {value!r}"
    if not math.isfinite(value):
        return f"must be finite, got {value}"
    if positive and value <= 0:
        return f"must be > 0, got {value}"
    if positive and value < MIN_INTERCEPT:
        return f"must be >= {MIN_INTERCEPT:g} s, got {value:g}"
    if value < 0:
        return f"must be >= 0, got {value}"
    if value > MAX_COST:
        return f"must be <= {MAX_COST:g}, got {value:g}"
    return None


@dataclass(frozen=True)
class CostModel:
    intercept: float
    per_token: float = 0.0
    decode_kv: float = 0.0
    prefill_attention: float = 0.0
    prefill_kv: float = 0.0
    per_prefill_request: float = 0.0
    token_knees: tuple[int, ...] = ()  # batch token counts where the per-token slope bends, increasing
    per_token_above: tuple[float, ...] = ()  # the extra slope past each knee, >= 0

    def __post_init__(self):
        for name in FEATURES:
            problem = coefficient_problem(getattr(self, name), positive=name == "intercept")
            if problem:
                raise ValueError(f"cost.{name} {problem}")
        knees, slopes = tuple(self.token_knees), tuple(self.per_token_above)
        object.__setattr__(self, "token_knees", knees)
        object.__setattr__(self, "per_token_above", slopes)
        if len(knees) != len(slopes):
            raise ValueError(f"cost.token_knees and cost.per_token_above need one slope per knee, "
                             f"got {len(knees)} knees and {len(slopes)} slopes")
        if not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in knees):
            raise ValueError(f"cost.token_knees must be integers >= 1, got {list(knees)!r}")
        if any(b <= a for a, b in zip(knees, knees[1:])):
            raise ValueError(f"cost.token_knees must increase, got {list(knees)!r}")
        if any(coefficient_problem(v) for v in slopes):
            raise ValueError(f"cost.per_token_above must be finite numbers in [0, {MAX_COST:g}], got {list(slopes)!r}")

    @property
    def coefficients(self) -> np.ndarray:
        return np.array([getattr(self, name) for name in FEATURES], dtype=float)

    def as_dict(self) -> dict:
        """The coefficients by name; the knee keys only when there are knees."""
        out = {name: getattr(self, name) for name in FEATURES}
        if self.token_knees:
            out.update(token_knees=list(self.token_knees), per_token_above=list(self.per_token_above))
        return out

    def kink_time(self, tokens):
        """The convex token term: sum over knees of slope * max(0, tokens - knee) (ints or arrays)."""
        extra = 0.0
        for knee, slope in zip(self.token_knees, self.per_token_above):
            extra = extra + slope * np.maximum(0, np.asarray(tokens, dtype=float) - knee)
        return extra if np.ndim(extra) else float(extra)

    def batch_time(self, tokens: int, decode_kv: int, prefill_attention: int, prefill_kv: int, prefill_requests: int) -> float:
        """Time of one batch from its five aggregate features (the intercept's feature is 1)."""
        if tokens <= 0:
            return 0.0
        time = (
            self.intercept
            + self.per_token * tokens
            + self.decode_kv * decode_kv
            + self.prefill_attention * prefill_attention
            + self.prefill_kv * prefill_kv
            + self.per_prefill_request * prefill_requests
        )
        return time + self.kink_time(tokens) if self.token_knees else time

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Batch times of a feature matrix [batches, 6] (`FEATURES` order), the token kinks included."""
        features = np.asarray(features, dtype=float).reshape(-1, len(FEATURES))
        linear = features @ self.coefficients
        if not self.token_knees:
            return linear
        return linear + np.where(features[:, 1] > 0, self.kink_time(features[:, 1]), 0.0)

    def work(self, tokens, cached, decode: bool):
        """The time one request adds to a batch beside the intercept (the convex token term aside: it
        does not split by request): a decode-type request with `cached` m tokens, processing its one
        token, per_token + decode_kv m; a prefill-type chunk of c = `tokens` tokens beside m cached,
        per_token c + prefill_attention (c^2 + 2 m c) + prefill_kv m + per_prefill_request. Numbers
        or numpy arrays."""
        if decode:
            return self.per_token * tokens + self.decode_kv * cached
        return (self.per_token * tokens + self.prefill_attention * (tokens * tokens + 2 * cached * tokens)
                + self.prefill_kv * cached + self.per_prefill_request)

    def to_toml(self) -> str:
        lines = ["[cost]"]
        lines += [f"{name} = {getattr(self, name)!r}" for name in FEATURES]
        if self.token_knees:
            lines.append(f"token_knees = {list(self.token_knees)!r}")
            lines.append(f"per_token_above = {list(self.per_token_above)!r}")
        return "\n".join(lines) + "\n"
