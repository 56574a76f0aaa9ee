"""The linear batch-time cost model (seed paper, Section 3.2).

T = intercept
  + per_token           * sum c
  + decode_kv           * sum over decode-type requests of m
  + prefill_attention   * sum over prefill-type requests of (c^2 + 2 m c)
  + prefill_kv          * sum over prefill-type requests of m
  + per_prefill_request * number of prefill-type requests

m is the number of cached tokens of a request before the batch, c the tokens it
processes. A batch that processes nothing takes no time.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..accounting import account_batch

FEATURES = (
    "intercept",
    "per_token",
    "decode_kv",
    "prefill_attention",
    "prefill_kv",
    "per_prefill_request",
)


@dataclass(frozen=True)
class CostModel:
    intercept: float
    per_token: float = 0.0
    decode_kv: float = 0.0
    prefill_attention: float = 0.0
    prefill_kv: float = 0.0
    per_prefill_request: float = 0.0

    def __post_init__(self):
        for name in FEATURES:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"cost.{name} must be a finite number >= 0, got {value!r}")
        if self.intercept <= 0:
            raise ValueError("cost.intercept must be > 0")

    @property
    def coefficients(self) -> np.ndarray:
        return np.array([getattr(self, name) for name in FEATURES], dtype=float)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def batch_time(self, tokens: int, decode_kv: int, prefill_attention: int, prefill_kv: int, prefill_requests: int) -> float:
        """Time of one batch from its five aggregate features (the intercept's feature is 1)."""
        if tokens <= 0:
            return 0.0
        return (
            self.intercept
            + self.per_token * tokens
            + self.decode_kv * decode_kv
            + self.prefill_attention * prefill_attention
            + self.prefill_kv * prefill_kv
            + self.per_prefill_request * prefill_requests
        )

    def batch_features(self, cached, tokens, is_decode) -> np.ndarray:
        """The six features of one batch from per-request arrays (requests with c >= 1)."""
        return batch_features(cached, tokens, is_decode)

    def to_toml(self) -> str:
        lines = ["[cost]"]
        lines += [f"{name} = {getattr(self, name)!r}" for name in FEATURES]
        return "\n".join(lines) + "\n"


def batch_features(cached, tokens, is_decode) -> np.ndarray:
    """Six-vector of features for a batch: per-request cached m, tokens c, decode-type flags.

    Counted by `kvbound.accounting.account_batch` (the one formula): a flagged request is
    given the state of a decode (n = 1, S = m + 1), any other one a first prefill (n = 0).
    """
    cached, tokens = [int(m) for m in cached], [int(c) for c in tokens]
    generated = [1 if decode else 0 for decode in is_decode]
    prompt = [m if decode else m + c for m, c, decode in zip(cached, tokens, generated)]
    return np.array(account_batch(dict(enumerate(tokens)), cached, generated, prompt).features, dtype=float)
