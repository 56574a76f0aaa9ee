"""A solver-neutral mixed-integer linear model built from whole arrays.

Variables and rows both come in named blocks (linopy's lesson): a variable block is a numpy
index array of any shape, a row block is added at once from equally shaped arrays of column
indices and coefficients (`linear` terms), so that building never loops over single terms in
Python. A row block's name may list its axes, `kv_capacity[j]` or `c_uncached[i,j]`, so that a
violated row names itself (`c_uncached[i=3, j=7]`) and an exported LP names its rows. The
triplets are assembled once through scipy.sparse (repeated entries summed, zeros dropped) for
every backend.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse as sp

INF = float("inf")


@dataclass
class Model:
    lb: list = field(default_factory=list)
    ub: list = field(default_factory=list)
    integer: list = field(default_factory=list)
    blocks: dict = field(default_factory=dict)
    _rows: list = field(default_factory=list)  # (row_ids, cols, vals)
    _row_lo: list = field(default_factory=list)
    _row_hi: list = field(default_factory=list)
    row_blocks: list = field(default_factory=list)  # (first row, name, shape), in row order
    n_rows: int = 0
    n_cols: int = 0
    objective: np.ndarray | None = None
    objective_offset: float = 0.0
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ variables
    def add_vars(self, name: str, shape, lb=0.0, ub=INF, integer=False) -> np.ndarray:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        size = int(np.prod(shape)) if shape else 1
        idx = np.arange(self.n_cols, self.n_cols + size).reshape(shape)
        self.n_cols += size
        self.lb.append(np.broadcast_to(np.asarray(lb, dtype=float), shape).reshape(-1))
        self.ub.append(np.broadcast_to(np.asarray(ub, dtype=float), shape).reshape(-1))
        self.integer.append(np.full(size, bool(integer)))
        self.blocks[name] = idx
        return idx

    def binary(self, name: str, shape) -> np.ndarray:
        return self.add_vars(name, shape, 0.0, 1.0, True)

    # ------------------------------------------------------------------ constraints
    def add_rows(self, name: str, shape, terms, lo=-INF, hi=INF) -> np.ndarray:
        """Add a block of rows named `name` of the given shape: lo <= sum of terms <= hi.

        Each term is (cols, coefs): `cols` has the row block's shape plus optional trailing
        axes that are summed within the row; `coefs` broadcasts to `cols`. A term with
        cols None is a constant (broadcast to the rows) moved into the bounds.
        """
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = int(np.prod(shape)) if shape else 1
        rows = np.arange(self.n_rows, self.n_rows + count).reshape(shape)
        const = np.zeros(shape)
        for cols, coefs in terms:
            if cols is None:
                const = const + np.broadcast_to(np.asarray(coefs, dtype=float), shape)
                continue
            cols = np.asarray(cols)
            if cols.ndim < len(shape):
                raise ValueError(f"term of shape {cols.shape} has fewer axes than the row shape {shape}")
            cols = np.broadcast_to(cols, shape + cols.shape[len(shape):])  # size-1 axes stretch over the rows
            vals = np.broadcast_to(np.asarray(coefs, dtype=float), cols.shape).reshape(-1)
            extra = cols.ndim - len(shape)
            r = np.broadcast_to(rows.reshape(shape + (1,) * extra), cols.shape).reshape(-1)
            c = cols.reshape(-1)
            keep = vals != 0
            self._rows.append((r[keep], c[keep], vals[keep]))
        self._row_lo.append((np.broadcast_to(np.asarray(lo, dtype=float), shape) - const).reshape(-1))
        self._row_hi.append((np.broadcast_to(np.asarray(hi, dtype=float), shape) - const).reshape(-1))
        self.row_blocks.append((self.n_rows, name, shape))
        self.n_rows += count
        return rows

    def add_sparse_rows(self, name: str, count: int, rows, cols, vals, lo, hi) -> np.ndarray:
        """Add a block of `count` rows given as triplets (row offsets 0..count-1, columns, coefficients)."""
        first = self.n_rows
        self.row_blocks.append((first, name, (count,)))
        if len(rows):
            self._rows.append((np.asarray(rows) + first, np.asarray(cols), np.asarray(vals, dtype=float)))
        self._row_lo.append(np.broadcast_to(np.asarray(lo, dtype=float), count).reshape(-1))
        self._row_hi.append(np.broadcast_to(np.asarray(hi, dtype=float), count).reshape(-1))
        self.n_rows += count
        return np.arange(first, first + count)

    def set_objective(self, terms, offset: float = 0.0) -> None:
        obj = np.zeros(self.n_cols)
        for cols, coefs in terms:
            c = np.asarray(cols).reshape(-1)
            v = np.broadcast_to(np.asarray(coefs, dtype=float), np.shape(cols)).reshape(-1)
            np.add.at(obj, c, v)
        self.objective = obj
        self.objective_offset = offset

    # ------------------------------------------------------------------ export
    def finalize(self) -> "ModelArrays":
        """The model as arrays: bounds, integrality, row bounds and one sparse matrix."""
        lb = np.concatenate(self.lb) if self.lb else np.zeros(0)
        ub = np.concatenate(self.ub) if self.ub else np.zeros(0)
        integ = np.concatenate(self.integer) if self.integer else np.zeros(0, bool)
        if self._rows:
            r = np.concatenate([x[0] for x in self._rows])
            c = np.concatenate([x[1] for x in self._rows])
            v = np.concatenate([x[2] for x in self._rows])
        else:
            r = c = np.zeros(0, dtype=np.int64)
            v = np.zeros(0)
        import scipy.sparse as sp  # here, not at import: 0.2 s that `kvbound simulate` never needs

        # one entry per (row, column), zeros dropped: terms of one row may name a column twice, and
        # HiGHS's presolve loops forever (or crashes) on a matrix with repeated entries
        matrix = sp.csr_array((v, (r, c)), shape=(self.n_rows, self.n_cols))
        matrix.sum_duplicates()
        matrix.eliminate_zeros()
        lo = np.concatenate(self._row_lo) if self._row_lo else np.zeros(0)
        hi = np.concatenate(self._row_hi) if self._row_hi else np.zeros(0)
        obj = self.objective if self.objective is not None else np.zeros(self.n_cols)
        return ModelArrays(lb, ub, integ, lo, hi, matrix, obj, self.objective_offset,
                           _Labels(self.row_blocks), _Labels.of_columns(self.blocks))

    @property
    def size(self) -> dict:
        integ = np.concatenate(self.integer) if self.integer else np.zeros(0, bool)
        nnz = sum(len(x[0]) for x in self._rows)
        return {"variables": self.n_cols, "integer_variables": int(integ.sum()), "constraints": self.n_rows, "nonzeros": nnz}


class _Labels:
    """Names of rows (or columns) from their blocks: `kv_capacity[j=7]`, `c[i=3, j=7]`."""

    def __init__(self, blocks: list):
        self.blocks = sorted(blocks, key=lambda b: b[0])
        self.starts = [b[0] for b in self.blocks]

    @staticmethod
    def of_columns(blocks: dict) -> "_Labels":
        return _Labels([(int(np.min(idx)), name, np.shape(idx)) for name, idx in blocks.items() if np.size(idx)])

    def __call__(self, k: int) -> str:
        at = bisect.bisect_right(self.starts, k) - 1
        if at < 0:
            return f"#{k}"
        first, name, shape = self.blocks[at]
        offset = k - first
        count = int(np.prod(shape))
        base, axes = _name_axes(name)
        pos = [int(p) for p in np.unravel_index(offset, shape)] if count > 1 else []
        if axes is None:  # a plain block name: its positions
            return f"{name}[{', '.join(map(str, pos))}]" if pos else name
        if any("=" in a for a in axes):  # the name states its own position; rows within it by offset
            return name if count == 1 else f"{base}[{', '.join(axes)}, row={offset}]"
        if len(axes) != len(pos):
            return f"{base}[{', '.join(map(str, pos))}]"
        return f"{base}[{', '.join(f'{a}={p}' for a, p in zip(axes, pos))}]"


def _name_axes(name: str) -> tuple[str, list[str] | None]:
    """`kv[i,j]` -> ("kv", ["i", "j"]); a name without brackets has no axes."""
    m = re.fullmatch(r"([^\[]+)\[([^\]]*)\]", name)
    if not m:
        return name, None
    return m.group(1), [a.strip() for a in m.group(2).split(",")]


@dataclass
class ModelArrays:
    col_lb: np.ndarray
    col_ub: np.ndarray
    integrality: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray
    matrix: sp.csr_array  # rows x columns, no repeated entries, no explicit zeros
    objective: np.ndarray
    objective_offset: float
    row_label: _Labels = field(default_factory=lambda: _Labels([]))
    col_label: _Labels = field(default_factory=lambda: _Labels([]))

    @property
    def n_cols(self) -> int:
        return len(self.col_lb)

    @property
    def n_rows(self) -> int:
        return len(self.row_lo)

    @property
    def vals(self) -> np.ndarray:
        return self.matrix.data

    def triplets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, cols, vals) in row order."""
        coo = self.matrix.tocoo()
        return coo.row, coo.col, coo.data

    def csc(self):
        """(starts, index, value) of the constraint matrix in compressed-column form."""
        m = self.matrix.tocsc()
        m.sort_indices()
        return m.indptr.astype(np.int32), m.indices.astype(np.int32), m.data

    def csr(self):
        m = self.matrix
        m.sort_indices()
        return m.indptr, m.indices, m.data

    def row_names(self) -> list[str]:
        return [self.row_label(k) for k in range(self.n_rows)]

    def check(self, x: np.ndarray, tol: float = 1e-6) -> list[str]:
        """Violations of bounds, integrality and rows by the point x (for tests and warm starts),
        each naming its column or row (`c[i=3, j=7]`, `kv_capacity[j=7]`)."""
        bad = []
        for k in np.nonzero((x < self.col_lb - tol) | (x > self.col_ub + tol))[0][:5]:
            bad.append(f"{self.col_label(k)} = {x[k]} outside [{self.col_lb[k]}, {self.col_ub[k]}]")
        frac = np.abs(x - np.round(x)) > tol
        for k in np.nonzero(self.integrality & frac)[0][:5]:
            bad.append(f"{self.col_label(k)} = {x[k]} not integer")
        act = self.matrix @ x
        scale = 1 + np.abs(act)
        viol = np.nonzero((act < self.row_lo - tol * scale) | (act > self.row_hi + tol * scale))[0]
        for k in viol[:5]:
            bad.append(f"{self.row_label(k)}: {act[k]} not in [{self.row_lo[k]}, {self.row_hi[k]}]")
        return bad
