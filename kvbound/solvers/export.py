"""`solve --export`: the model as an MPS or LP file for other solvers, with readable names."""
from __future__ import annotations

import os
import re
import tempfile

import numpy as np

from ..backends.cbc import build_pulp
from ..fileio import write_user_file


def export_model(arrays, form, path: str) -> None:
    """Write the model as MPS or LP (by suffix) through PuLP, with readable variable names."""
    prob, _ = _pulp_with_names(arrays, form)
    suffix = ".lp" if path.endswith(".lp") else ".mps"
    with tempfile.TemporaryDirectory(prefix="kvbound-export-") as tmp:  # PuLP writes in place: then one atomic write
        staged = os.path.join(tmp, "model" + suffix)
        prob.writeLP(staged) if suffix == ".lp" else prob.writeMPS(staged)
        with open(staged, "rb") as handle:
            write_user_file(path, handle.read())


def _pulp_with_names(arrays, form):
    names = [""] * arrays.n_cols
    for block, idx in form.model.blocks.items():
        flat = np.asarray(idx).reshape(-1)
        for pos, k in zip(np.ndindex(*np.shape(idx)), flat):
            names[k] = block + "_" + "_".join(map(str, pos))
    return build_pulp(arrays, names, _lp_names(arrays.row_names()))


def _lp_names(labels: list[str]) -> list[str]:
    """Row labels as LP/MPS names (letters, digits and _; unique): `kv_capacity[j=7]` -> `kv_capacity_j7`."""
    out, seen = [], set()
    for label in labels:
        name = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", label.replace("=", ""))).strip("_")
        base, k = name, 1
        while name in seen:
            k += 1
            name = f"{base}_{k}"
        seen.add(name)
        out.append(name)
    return out
