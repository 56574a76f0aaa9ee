"""Batch-time cost model: features, the linear model, named presets (fitting comes with calibration)."""
from .model import FEATURES, MAX_COST, CostModel
from .presets import DEFAULT_PRESET, PRESETS, preset

__all__ = ["FEATURES", "MAX_COST", "CostModel", "PRESETS", "DEFAULT_PRESET", "preset"]
