"""Tuned launch settings of the Triton kernels, per GPU model (as vLLM ships its fused-MoE configs).

`bench/bench_kernels.py --tune` times the decode-attention variants on the GPU it runs on and
writes the fastest as `tuned/<GPU name>.json`; the kernels and the executor read it from there
(`kernel_config`). A GPU without a file runs the defaults below, which are the settings the
kernels had before tuning existed.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from .layout import KV_LAYOUTS

TUNED_DIR = Path(__file__).resolve().parent / "tuned"


@dataclass(frozen=True)
class DecodeConfig:
    """Launch settings of the decode-attention kernel: key positions per tile, warps and software
    pipelining depth per program, whether consecutive programs are the KV heads of one request
    (`heads_first`) or the requests of one KV head, and whether the scores and weighted sums are
    tensor-core products (`dot`, the query heads padded to 16 rows) or float32 sums."""

    tile_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    heads_first: bool = False
    dot: bool = False

    def __post_init__(self):
        if self.dot and self.tile_n < 16:
            raise ValueError(f"decode config: tensor-core products need tile_n >= 16, got {self.tile_n}")
        for name in ("tile_n", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"decode config: {name} must be a power of two, got {value}")
        if self.num_stages < 1:
            raise ValueError(f"decode config: num_stages must be >= 1, got {self.num_stages}")


@dataclass(frozen=True)
class KernelConfig:
    """What the executor takes from tuning: the KV pool's memory layout and the decode kernel's settings."""

    layout: str = "NHD"
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self):
        if self.layout not in KV_LAYOUTS:
            raise ValueError(f"kernel config: layout must be one of {', '.join(KV_LAYOUTS)}, got {self.layout!r}")

    def to_json(self, **extra) -> str:
        return json.dumps({"layout": self.layout, "decode": asdict(self.decode), **extra}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "KernelConfig":
        data = json.loads(text)
        return cls(data.get("layout", "NHD"), DecodeConfig(**data.get("decode", {})))


def tuned_path(device_name: str) -> Path:
    """Where the tuned settings of the GPU called `device_name` live."""
    return TUNED_DIR / (re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_") + ".json")


@lru_cache(maxsize=None)
def kernel_config(device: torch.device | None) -> KernelConfig:
    """The tuned settings of `device`'s GPU model, or the defaults (also for None or a CPU). Cached:
    the kernels ask once per launch."""
    if device is None or device.type != "cuda":
        return KernelConfig()
    path = tuned_path(torch.cuda.get_device_name(device))
    return KernelConfig.from_json(path.read_text()) if path.exists() else KernelConfig()
