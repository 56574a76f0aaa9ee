"""Fit the cost model to a batch profile (`kvbound profile`'s CSV) by non-negative least squares.

The fit minimises squared *relative* errors (each row is divided by its measured time), so
that a 2 ms decode batch weighs as much as a 200 ms prefill: schedules are mostly small
batches, and replay judges the model per batch. A random fifth of the batches is held out
and the reported R^2 and relative errors are on those.

Besides the six coefficients the fit may bend the per-token slope at token knees (the
convex term of `CostModel`: a GPU turns compute-bound as a batch grows). `knees=None` picks
them: knees from a grid are added one at a time while one improves the mean relative error
of a 5-fold cross-validation *on the fitted batches* by at least 5% and 0.1 point (the held-out batches
never take part in the choice, so their figures stay honest); `knees=()` fits none.
"""
from __future__ import annotations

import csv
import io
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from .model import FEATURES, MIN_INTERCEPT, CostModel
from ..errors import InputError, KvboundError
from ..fileio import read_user_text

#: the profile CSV's feature columns, in the order of FEATURES (the coefficient each multiplies)
FEATURE_COLUMNS = ("batches", "tokens", "decode_kv", "prefill_attention", "prefill_kv", "prefill_requests")
TIME_COLUMN = "seconds"
#: a profile has at most this many batches (rows)
MAX_PROFILE_ROWS = 1_000_000
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
    intercept_clamped: bool  # NNLS put the intercept at 0; it was raised to MIN_INTERCEPT
    knees_chosen: bool = False  # the knees were picked by cross-validation (not given)


def read_profile(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The feature matrix [batches, 6] and measured seconds of a profile CSV."""
    source = str(path)
    needed = (*FEATURE_COLUMNS, TIME_COLUMN)
    try:
        reader = csv.reader(io.StringIO(read_user_text(path), newline=""))
        header = next(reader, [])
        for column in needed:
            if column not in header:
                raise InputError(source, column, f"missing column (needs {', '.join(FEATURE_COLUMNS)}, "
                                                 f"{TIME_COLUMN})")
        rows = list(itertools.islice(reader, MAX_PROFILE_ROWS + 1))
        if len(rows) > MAX_PROFILE_ROWS:
            raise InputError(source, "", f"more than {MAX_PROFILE_ROWS:,} batches; kvbound fits at most that many")
    except csv.Error as exc:
        raise InputError(source, "", f"malformed CSV: {exc}") from None
    # kvbound's own profiles carry prefill_requests twice (the composition and the feature): a column
    # given more than once is read where its copies agree, and refused on the first row where they differ
    places = {column: [j for j, name in enumerate(header) if name == column] for column in needed}
    data = np.empty((len(rows), len(needed)))
    for k, row in enumerate(rows):
        for j, column in enumerate(needed):
            texts = {row[i].strip() if i < len(row) else "" for i in places[column]}
            if len(texts) > 1:
                raise InputError(source, f"row {k + 2}, {column}", f"the column appears {len(places[column])} "
                                 f"times with different values ({', '.join(sorted(map(repr, texts)))}); which "
                                 f"one to read is ambiguous")
            text = texts.pop()
            try:
                value = float(text)
            except ValueError:
                raise InputError(source, f"row {k + 2}, {column}", f"not a number: {text!r}") from None
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
    problem = degenerate_problem(data[:, :-1], data[:, -1])
    if problem:
        raise InputError(source, "", problem)
    return data[:, :-1], data[:, -1]


def degenerate_problem(features: np.ndarray, seconds: np.ndarray) -> str | None:
    """Why a profile cannot be fitted, or None: every batch the same composition (nothing separates the
    intercept from the other coefficients), or every batch the same time (R^2 undefined, nothing to fit)."""
    n = len(seconds)
    if n and len(np.unique(features, axis=0)) == 1:
        return (f"cannot fit: all {n:,} batches have the same features (the same composition), so nothing "
                "separates the intercept from the per-token costs; profile batches of different sizes")
    if n and np.ptp(seconds) == 0:
        return (f"cannot fit: all {n:,} batches took the same time ({seconds[0]:g} s), so R^2 is undefined "
                "and no coefficient but the intercept can be told; profile again or more batch sizes")
    return None


#: knees tried when `calibrate` picks them (batch tokens)
KNEE_GRID = (64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
#: at most this many knees are picked
MAX_KNEES = 2
#: a knee is kept only if it lowers the cross-validated mean relative error by this fraction
KNEE_GAIN = 0.05
#: ... and by at least this much in absolute terms (a fit already exact needs no more knees)
KNEE_MIN_GAIN = 1e-3


def kind_weights(features: np.ndarray, decode_share: float | None) -> np.ndarray:
    """Each batch's weight in the fit (mean 1): with `decode_share`, the decode-only batches together
    weigh that share and the batches with a prefill-type request the rest; None (or a profile of
    one kind only): every batch the same."""
    decode_only = features[:, FEATURE_COLUMNS.index("prefill_requests")] == 0
    n, k = len(features), int(decode_only.sum())
    if decode_share is None or k in (0, n):
        return np.ones(n)
    return np.where(decode_only, decode_share * n / k, (1 - decode_share) * n / (n - k))


def calibrate(features: np.ndarray, seconds: np.ndarray, *, held_out_fraction: float = 0.2,
              seed: int = 0, knees: tuple[int, ...] | None = None, decode_share: float | None = None) -> Calibration:
    """`decode_share`: the share of the fit's weight the decode-only batches carry together (see
    `kind_weights`; docs/executor.md says when to use it: on CUDA decode-only batches replay full
    graphs, with a smaller fixed cost than the rest, and are most of what schedules run)."""
    problem = degenerate_problem(features, seconds)
    if problem:
        raise KvboundError(problem)
    if decode_share is not None and not 0 <= decode_share <= 1:
        raise KvboundError(f"decode_share must be in [0, 1], got {decode_share}")
    weights = kind_weights(features, decode_share)
    order = np.random.default_rng(seed).permutation(len(seconds))
    n_held = max(1, int(round(held_out_fraction * len(seconds))))
    held_out, train = np.sort(order[:n_held]), np.sort(order[n_held:])
    chosen = knees is None
    if chosen:
        knees = choose_knees(features[train], seconds[train], seed=seed, weights=weights[train])
    knees = tuple(sorted(int(k) for k in knees))
    coef, slopes = _fit(features[train], seconds[train], knees, weights[train])
    clamped = coef[0] <= 0
    if clamped:
        coef[0] = MIN_INTERCEPT
    try:
        cost = CostModel(**{name: float(v) for name, v in zip(FEATURES, coef)}, token_knees=knees,
                         per_token_above=tuple(float(v) for v in slopes))
    except ValueError as exc:
        raise KvboundError(f"the fit gave an unusable cost model: {exc}") from None
    predicted = cost.predict(features)
    return Calibration(cost, train, held_out, FitQuality.of(predicted[train], seconds[train]),
                       FitQuality.of(predicted[held_out], seconds[held_out]), clamped, chosen)


def choose_knees(features: np.ndarray, seconds: np.ndarray, *, seed: int = 0, folds: int = 5,
                 weights: np.ndarray | None = None) -> tuple[int, ...]:
    """Knees from `KNEE_GRID` (inside the profiled token range), added greedily while each lowers the
    `folds`-fold cross-validated (weighted) mean relative error by `KNEE_GAIN` (and `KNEE_MIN_GAIN`)
    or more; at most `MAX_KNEES`."""
    weights = np.ones(len(seconds)) if weights is None else weights
    tokens = features[:, 1]
    grid = [k for k in KNEE_GRID if (tokens > k).sum() >= 2 * len(FEATURES) and (tokens <= k).sum() >= 2 * len(FEATURES)]
    fold_of = np.random.default_rng(seed + 1).permutation(len(seconds)) % folds
    best, knees = _cv_error(features, seconds, (), fold_of, folds, weights), ()
    while len(knees) < MAX_KNEES:
        trials = [(_cv_error(features, seconds, tuple(sorted(knees + (k,))), fold_of, folds, weights), k)
                  for k in grid if k not in knees]
        if not trials:
            break
        error, knee = min(trials)
        if error > best * (1 - KNEE_GAIN) or best - error < KNEE_MIN_GAIN:
            break
        best, knees = error, tuple(sorted(knees + (knee,)))
    return knees


def _cv_error(features, seconds, knees, fold_of, folds, weights) -> float:
    errors, weighs = [], []
    for f in range(folds):
        fit, test = fold_of != f, fold_of == f
        coef, slopes = _fit(features[fit], seconds[fit], knees, weights[fit])
        predicted = _design(features[test], knees) @ np.concatenate([coef, slopes])
        errors.append(np.abs(predicted - seconds[test]) / seconds[test])
        weighs.append(weights[test])
    return float(np.average(np.concatenate(errors), weights=np.concatenate(weighs)))


def _design(features: np.ndarray, knees) -> np.ndarray:
    """The six features, then max(0, tokens - knee) per knee (the columns of the convex term)."""
    tokens = features[:, 1:2]
    return np.hstack([features] + [np.maximum(0.0, tokens - k) for k in knees])


def _fit(features: np.ndarray, seconds: np.ndarray, knees, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative least squares on (weighted) relative errors: (six coefficients, one slope per knee)."""
    scale = np.sqrt(weights) / seconds
    coef, _ = nnls(_design(features, knees) * scale[:, None], seconds * scale)
    return coef[:len(FEATURES)], coef[len(FEATURES):]


def cost_toml(cost: CostModel, comment: str) -> str:
    """A `[cost]` table usable in a case file (and by `kvbound replay --cost`), with a comment on top."""
    lines = [f"# {line}" for line in comment.splitlines()]
    return "\n".join(lines) + "\n" + cost.to_toml()


def profile_coverage(profile: np.ndarray, batches: np.ndarray) -> dict:
    """How well a profile's batches (feature rows, FEATURE_COLUMNS order) cover the batches of a
    replay: a batch is covered when each of its features lies within the range the profile spans
    for batches of its kind (decode-only, or with a prefill-type request), so the fit interpolates
    it rather than extrapolates. `{"covered": share, "outside": {feature: batches outside}}`."""
    prefill = FEATURE_COLUMNS.index("prefill_requests")
    inside = np.zeros(len(batches), dtype=bool)
    outside = {name: 0 for name in FEATURE_COLUMNS}
    for kind in (False, True):
        rows, mine = profile[(profile[:, prefill] > 0) == kind], (batches[:, prefill] > 0) == kind
        if not mine.any():
            continue
        if not len(rows):
            inside[mine] = False
            for name in FEATURE_COLUMNS:
                outside[name] += int(mine.sum())
            continue
        low, high = rows.min(axis=0), rows.max(axis=0)
        within = (batches[mine] >= low) & (batches[mine] <= high)
        inside[mine] = within.all(axis=1)
        for j, name in enumerate(FEATURE_COLUMNS):
            outside[name] += int((~within[:, j]).sum())
    return {"covered": float(inside.mean()) if len(batches) else 1.0,
            "outside": {name: n for name, n in outside.items() if n}}
