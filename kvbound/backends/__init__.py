"""Solver backends: each module registers one `Backend` (`base`); the import line below is the
registry, in the order `--solver` lists them. A new backend: its module, and its name added there."""
from .base import BACKENDS, Backend, BackendOutcome
from . import highs, cpsat, cbc  # noqa: E402,F401  the registry: each registers its backend

__all__ = ["BACKENDS", "Backend", "BackendOutcome"]
