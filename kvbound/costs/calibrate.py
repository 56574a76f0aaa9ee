"""Fit the six cost coefficients to a batch profile (`kvbound profile`'s CSV) by non-negative least squares.

The fit minimises squared *relative* errors (each row is divided by its measured time), so
that a 2 ms decode batch weighs as much as a 200 ms prefill: schedules are mostly small
batches, and replay judges the model per batch. A random fifth of the batches is held out
and the reported R^2 and relative errors are on those.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from .model import FEATURES, CostModel
from ..errors import InputError, KvboundError
from ..fileio import check_in_path

#: the profile CSV's feature columns, in the order of FEATURES (the coefficient each multiplies)
FEATURE_COLUMNS = ("batches", "tokens", "decode_kv", "prefill_attention", "prefill_kv", "prefill_requests")
TIME_COLUMN = "seconds"
_MIN_INTERCEPT = 1e-9  # the cost model needs intercept > 0
#: a profile's measured batch time, seconds, is at most this (an hour: no batch takes longer)
MAX_SECONDS = 3600.0
#: a profile's feature values are at most this (prefill_attention of a 2^24-token prompt is 2^48)
MAX_FEATURE = 2.0 ** 53


@dataclass(frozen=True)
class FitQuality:
    r2: float
    mean_relative_error: float
    max_relative_error: float

    @classmethod
    def of(cls, predicted: np.ndarray, measured: np.ndarray) -> "FitQuality":
        resid = measured - predicted
        total = ((measured - measured.mean()) ** 2).sum()
        r2 = 1.0 - (resid @ resid) / total if total > 0 else math.nan
        rel = np.abs(resid) / measured
        return cls(float(r2), float(rel.mean()), float(rel.max()))


@dataclass(frozen=True)
class Calibration:
    cost: CostModel
    train: np.ndarray  # row indices of the fitted batches
    held_out: np.ndarray
    train_quality: FitQuality
    held_out_quality: FitQuality
    intercept_clamped: bool  # NNLS put the intercept at 0; it was raised to _MIN_INTERCEPT


def read_profile(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The feature matrix [batches, 6] and measured seconds of a profile CSV."""
    source = str(path)
    check_in_path(path)
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            for column in (*FEATURE_COLUMNS, TIME_COLUMN):
                if column not in header:
                    raise InputError(source, column, f"missing column (needs {', '.join(FEATURE_COLUMNS)}, "
                                                     f"{TIME_COLUMN})")
            rows = list(reader)
    except OSError as exc:
        raise InputError(source, "", f"cannot read file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(source, "", f"not UTF-8 text (byte {exc.start})") from None
    except csv.Error as exc:
        raise InputError(source, "", f"malformed CSV: {exc}") from None
    data = np.empty((len(rows), len(FEATURE_COLUMNS) + 1))
    for k, row in enumerate(rows):
        for j, column in enumerate((*FEATURE_COLUMNS, TIME_COLUMN)):
            try:
                value = float(row[column])
            except (TypeError, ValueError):
                raise InputError(source, f"row {k + 2}, {column}", f"not a number: {row[column]!r}") from None
            if not math.isfinite(value) or value < 0 or (column == TIME_COLUMN and value == 0):
                raise InputError(source, f"row {k + 2}, {column}",
                                 f"must be a finite number {'> 0' if column == TIME_COLUMN else '>= 0'}, got {value}")
            most = MAX_SECONDS if column == TIME_COLUMN else MAX_FEATURE
            if value > most:
                raise InputError(source, f"row {k + 2}, {column}", f"must be <= {most:g}, got {value:g}")
            data[k, j] = value
    if len(rows) < 2 * len(FEATURES):
        raise InputError(source, "", f"{len(rows)} batches; a fit of {len(FEATURES)} coefficients with held-out "
                                     f"batches needs at least {2 * len(FEATURES)}")
    return data[:, :-1], data[:, -1]


def calibrate(features: np.ndarray, seconds: np.ndarray, *, held_out_fraction: float = 0.2,
              seed: int = 0) -> Calibration:
    order = np.random.default_rng(seed).permutation(len(seconds))
    n_held = max(1, int(round(held_out_fraction * len(seconds))))
    held_out, train = np.sort(order[:n_held]), np.sort(order[n_held:])
    weights = 1.0 / seconds[train]  # relative errors
    coef, _ = nnls(features[train] * weights[:, None], seconds[train] * weights)
    clamped = coef[0] <= 0
    if clamped:
        coef[0] = _MIN_INTERCEPT
    try:
        cost = CostModel(**{name: float(v) for name, v in zip(FEATURES, coef)})
    except ValueError as exc:
        raise KvboundError(f"the fit gave an unusable cost model: {exc}") from None
    predicted = features @ cost.coefficients
    return Calibration(cost, train, held_out, FitQuality.of(predicted[train], seconds[train]),
                       FitQuality.of(predicted[held_out], seconds[held_out]), clamped)


def cost_toml(cost: CostModel, comment: str) -> str:
    """A `[cost]` table usable in a case file (and by `kvbound replay --cost`), with a comment on top."""
    lines = [f"# {line}" for line in comment.splitlines()]
    return "\n".join(lines) + "\n" + cost.to_toml()
