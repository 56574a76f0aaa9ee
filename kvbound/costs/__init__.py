"""Batch-time cost model: features, the linear model, named presets (fitting comes with calibration)."""
from .model import FEATURES, CostModel, batch_features
from .presets import DEFAULT_PRESET, PRESETS, preset

__all__ = ["FEATURES", "CostModel", "batch_features", "PRESETS", "DEFAULT_PRESET", "preset"]
