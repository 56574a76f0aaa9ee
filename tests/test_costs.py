"""The cost model: the llama2-7b presets re-fitted from the Vidur profiles, the batch-time formula,
and CostModel's checks."""
from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from kvbound.accounting import account_batch
from kvbound.costs import FEATURES, PRESETS, CostModel
from kvbound.schedule import Batch, ReplayState
from kvbound.workload import Instance, Request, SystemConfig

LAYERS = 32  # Llama-2-7B


def _fit_profile(path) -> tuple[float, float, float, int]:
    """Least-squares line through the summed per-layer operator mean times (ms) x 32 layers, in s.
    Returns (intercept, per_token, R^2, rows used)."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    mean_cols = [c for c in rows[0] if c.startswith("time_stats.") and c.endswith(".mean")]
    assert len(mean_cols) >= 8  # emb, layernorms, projections, rope, mlp, add
    tp1 = [r for r in rows if int(float(r["num_tensor_parallel_workers"])) == 1]
    x = np.array([float(r["num_tokens"]) for r in tp1])
    y = np.array([sum(float(r[c]) for c in mean_cols) for r in tp1]) * LAYERS / 1000.0
    design = np.column_stack([np.ones_like(x), x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    r2 = 1 - (resid @ resid) / ((y - y.mean()) @ (y - y.mean()))
    return float(coef[0]), float(coef[1]), float(r2), len(tp1)


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_llama2_7b_presets_are_the_profile_fit(shared_data, gpu):
    path = shared_data / "profiling" / gpu / "llama-2-7b" / "mlp.csv"
    intercept, per_token, r2, n = _fit_profile(path)
    assert n > 100
    preset = PRESETS[f"llama2-7b-{gpu}"]
    assert preset.intercept == pytest.approx(intercept, rel=0.005)
    assert preset.per_token == pytest.approx(per_token, rel=0.005)
    assert r2 > 0.99  # the line is a good description of the data


def test_a100_fit_quality_matches_the_presets_docstring(shared_data):
    *_, r2, _ = _fit_profile(shared_data / "profiling" / "a100" / "llama-2-7b" / "mlp.csv")
    assert round(r2, 4) == 0.9986


def test_preset_bandwidth_and_flop_terms():
    """decode_kv: 512 KiB of KV per token read at 70% of HBM bandwidth; prefill_attention:
    4 * 4096 * 32 / 2 FLOP per unit at 50% of bf16 peak (presets.py docstring)."""
    kv_bytes = 2 * 32 * 4096 * 2
    assert kv_bytes == 512 * 1024
    a100, h100 = PRESETS["llama2-7b-a100"], PRESETS["llama2-7b-h100"]
    assert a100.decode_kv == pytest.approx(kv_bytes / (0.7 * 2.0e12))
    assert h100.decode_kv == pytest.approx(kv_bytes / (0.7 * 3.35e12))
    assert a100.prefill_attention == pytest.approx(1.68e-9, rel=1e-3)
    assert h100.prefill_attention == pytest.approx(4 * 4096 * 32 / 2 / (0.5 * 989e12))
    assert PRESETS["unit-batches"] == CostModel(intercept=1.0)


# ----------------------------------------------------------------------------- the formula

COST = CostModel(intercept=2.0, per_token=0.5, decode_kv=0.25, prefill_attention=0.125, prefill_kv=0.0625,
                 per_prefill_request=3.0)


def test_batch_time_formula_term_by_term():
    # 10 tokens; decode-type m sum 7; prefill attention sum 100; prefill m sum 20; 2 prefill requests
    assert COST.batch_time(10, 7, 100, 20, 2) == 2.0 + 5.0 + 1.75 + 12.5 + 1.25 + 6.0
    assert CostModel(intercept=0.5).batch_time(1000, 10**6, 10**9, 10**6, 50) == 0.5


def test_batch_time_of_an_empty_batch_is_zero():
    assert COST.batch_time(0, 0, 0, 0, 0) == 0.0
    assert account_batch({}, [], [], []).features == (0.0,) * len(FEATURES)


def test_batch_features_split_decode_and_prefill():
    # a decode with m = 9 (n = 1), a first prefill of 4, a chunk of 3 after m = 5 (prefill-type: n = 0)
    feats = np.array(account_batch({0: 1, 1: 4, 2: 3}, [9, 0, 5], [1, 0, 0], [9, 4, 8]).features)
    assert feats.tolist() == [1.0, 8.0, 9.0, 16 + 9 + 2 * 5 * 3, 5.0, 2.0]
    assert COST.coefficients @ feats == pytest.approx(COST.batch_time(8, 9, 55, 5, 2))
    assert list(FEATURES) == ["intercept", "per_token", "decode_kv", "prefill_attention", "prefill_kv",
                              "per_prefill_request"]


def test_replay_charges_the_features_of_account_batch():
    inst = Instance((Request(4, 3), Request(6, 2)), SystemConfig(100, 100), COST)
    st = ReplayState(inst)
    st.apply(Batch({0: 4, 1: 2}))  # two first prefills (one chunked)
    end = st.apply(Batch({0: 1, 1: 4}))  # r0 decodes with m = 4; r1 finishes its prompt with m = 2
    expected = np.array(account_batch({0: 1, 1: 4}, [4, 2], [1, 0], [4, 6]).features)
    assert np.array(st.features[-1]) == pytest.approx(expected)
    assert end - st.starts[-1] == pytest.approx(COST.coefficients @ expected)
    assert end - st.starts[-1] == pytest.approx(2 + 0.5 * 5 + 0.25 * 4 + 0.125 * (16 + 16) + 0.0625 * 2 + 3)


# ----------------------------------------------------------------------------- checks

@pytest.mark.parametrize("name", FEATURES)
@pytest.mark.parametrize("value", [-1e-9, math.inf, -math.inf, math.nan, "1", True, None])
def test_cost_model_rejects_bad_values(name, value):
    values = {"intercept": 1.0, name: value}
    with pytest.raises(ValueError, match=f"cost.{name}"):
        CostModel(**values)


@pytest.mark.parametrize("intercept", [0, 0.0, -1.0])
def test_cost_model_needs_a_positive_intercept(intercept):
    with pytest.raises(ValueError, match=r"cost\.intercept must be (> 0|a finite number >= 0)"):
        CostModel(intercept=intercept)


def test_cost_model_accepts_zero_terms_and_ints():
    cost = CostModel(intercept=1, per_token=0, decode_kv=0.0)
    assert cost.batch_time(3, 0, 0, 0, 0) == 1.0
    assert cost.as_dict() == {"intercept": 1, "per_token": 0, "decode_kv": 0.0, "prefill_attention": 0.0,
                              "prefill_kv": 0.0, "per_prefill_request": 0.0}
