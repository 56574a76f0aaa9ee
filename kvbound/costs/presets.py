"""Named cost coefficient sets (seconds), usable as `[cost] preset = "<name>"` in case files.

Where each number comes from:

* `intercept` and `per_token` of the `llama2-7b-*` presets are a least-squares line
  through the measured non-attention operator times of one Llama-2-7B layer
  (Vidur profiles in `shared/data/profiling/{a100,h100}/llama-2-7b/mlp.csv`, tensor
  parallel 1, 1..4096 tokens), summed over the operators and multiplied by the model's
  32 layers. `tests/test_costs.py` re-fits them from that data. (R^2 = 0.9986 on A100.)
* `decode_kv` is the time to read one token's KV from HBM: 2 (K and V) x 32 layers x
  4096 x 2 bytes = 512 KiB per token, at 70% of the GPU's peak bandwidth
  (A100-80GB 2.0 TB/s, H100-SXM 3.35 TB/s).
* `prefill_attention` prices one unit of (c^2 + 2mc), about two query-key pairs:
  4 x 4096 x 32 FLOP per pair (QK^T and PV) / 2, at 50% of dense bf16 peak
  (A100 312 TFLOP/s, H100 989 TFLOP/s). The A100 figure, 1.68e-9, is close to the
  coefficient the seed paper's calibration suggests for this term.
* `prefill_kv` and `per_prefill_request` are 0 in these presets (calibration fills them).

`unit-batches` makes every non-empty batch cost 1: total latency is the number of batches.
"""
from __future__ import annotations

from .model import CostModel

_KV_BYTES_PER_TOKEN = 2 * 32 * 4096 * 2
_FLOP_PER_UNIT = 4 * 4096 * 32 / 2

PRESETS: dict[str, CostModel] = {
    "llama2-7b-a100": CostModel(
        intercept=3.71976e-03,
        per_token=6.52783e-05,
        decode_kv=_KV_BYTES_PER_TOKEN / (0.7 * 2.0e12),
        prefill_attention=_FLOP_PER_UNIT / (0.5 * 312e12),
    ),
    "llama2-7b-h100": CostModel(
        intercept=3.69924e-03,
        per_token=2.08198e-05,
        decode_kv=_KV_BYTES_PER_TOKEN / (0.7 * 3.35e12),
        prefill_attention=_FLOP_PER_UNIT / (0.5 * 989e12),
    ),
    "unit-batches": CostModel(intercept=1.0),
}

DEFAULT_PRESET = "llama2-7b-a100"


def preset(name: str) -> CostModel:
    return PRESETS[name]
