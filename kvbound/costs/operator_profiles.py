"""Fit the per-token and intercept terms to measured GPU operator profiles (Vidur's `mlp.csv`).

Each row of such a file gives, for one number of tokens in a batch, the time statistics (ms)
of every non-attention operator of one transformer layer (embedding, norms, projections,
rotary, MLP, residual adds). Summed over the operators and multiplied by the model's layers,
this is the non-attention part of a batch's time; the seed paper (Section 3.2, Figure 3a)
finds it linear in the number of tokens with R^2 = 0.999 on the Llama-2-7B A100 data. The
`llama2-7b-*` presets are this fit (tests/test_costs.py re-derives them independently).
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..fileio import read_user_text


@dataclass(frozen=True)
class OperatorFit:
    intercept: float  # seconds per batch
    per_token: float  # seconds per token
    r2: float
    rows: int


def fit_operator_profile(path: str | Path, layers: int = 32, tensor_parallel: int = 1) -> OperatorFit:
    """Least-squares line time = intercept + per_token * tokens through the summed mean operator
    times of one layer x `layers`, on the rows with `tensor_parallel` workers."""
    source = str(path)
    rows = list(csv.DictReader(io.StringIO(read_user_text(path), newline="")))
    if not rows:
        raise InputError(source, "", "no data rows")
    mean_cols = [c for c in rows[0] if c.startswith("time_stats.") and c.endswith(".mean")]
    for col in ("num_tokens", "num_tensor_parallel_workers"):
        if col not in rows[0]:
            raise InputError(source, col, "missing column")
    if not mean_cols:
        raise InputError(source, "time_stats.<op>.mean", "no operator time columns")
    try:
        chosen = [r for r in rows if int(float(r["num_tensor_parallel_workers"])) == tensor_parallel]
        tokens = np.array([float(r["num_tokens"]) for r in chosen])
        seconds = np.array([sum(float(r[c]) for c in mean_cols) for r in chosen]) * layers / 1000.0
    except (TypeError, ValueError) as exc:
        raise InputError(source, "", f"not a number: {exc}") from None
    if len(chosen) < 3:
        raise InputError(source, "num_tensor_parallel_workers", f"fewer than 3 rows with {tensor_parallel} workers")
    design = np.column_stack([np.ones_like(tokens), tokens])
    (intercept, per_token), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    resid = seconds - design @ (intercept, per_token)
    r2 = 1.0 - (resid @ resid) / ((seconds - seconds.mean()) @ (seconds - seconds.mean()))
    return OperatorFit(float(intercept), float(per_token), float(r2), len(chosen))
