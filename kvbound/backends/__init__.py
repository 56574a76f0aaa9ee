"""Solver backends: each module registers one `Backend` (`base`); the import line below is the
registry, in the order `--solver` lists them. A new backend: its module, and its name added there."""
from .base import BACKENDS, Backend, BackendOutcome
from . import highs, cpsat, cbc  # noqa: E402,F401  the registry: each registers its backend
from .race import AUTO, chosen_backends  # noqa: E402

#: what `--solver` takes: auto (the race on small models, else the first backend), or one backend
SOLVERS = (AUTO, *BACKENDS)

__all__ = ["AUTO", "BACKENDS", "SOLVERS", "Backend", "BackendOutcome", "chosen_backends"]
