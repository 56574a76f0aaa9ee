"""A solver-neutral mixed-integer linear model built from whole arrays.

Variables come in named blocks (numpy index arrays of any shape); constraints are added
as batches of rows, each row given by equally shaped arrays of column indices and
coefficients (`linear` terms), so that building never loops over single terms in Python.
Rows are stored as COO triplets and turned into one CSR/CSC matrix at the end.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
    def add_rows(self, shape, terms, lo=-INF, hi=INF) -> np.ndarray:
        """Add a block of rows of the given shape: lo <= sum of terms <= hi.

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
        self.n_rows += count
        return rows

    def set_objective(self, terms, offset: float = 0.0) -> None:
        obj = np.zeros(self.n_cols)
        for cols, coefs in terms:
            c = np.asarray(cols).reshape(-1)
            v = np.broadcast_to(np.asarray(coefs, dtype=float), np.shape(cols)).reshape(-1)
            np.add.at(obj, c, v)
        self.objective = obj
        self.objective_offset = offset

    # ------------------------------------------------------------------ export
    def finalize(self):
        """(col_lb, col_ub, integrality, row_lo, row_hi, rows, cols, vals) as flat arrays."""
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
        r, c, v = _sum_duplicates(r.astype(np.int64), c.astype(np.int64), v, self.n_cols)
        lo = np.concatenate(self._row_lo) if self._row_lo else np.zeros(0)
        hi = np.concatenate(self._row_hi) if self._row_hi else np.zeros(0)
        obj = self.objective if self.objective is not None else np.zeros(self.n_cols)
        return ModelArrays(lb, ub, integ, lo, hi, r, c, v, obj, self.objective_offset)

    @property
    def size(self) -> dict:
        integ = np.concatenate(self.integer) if self.integer else np.zeros(0, bool)
        nnz = sum(len(x[0]) for x in self._rows)
        return {"variables": self.n_cols, "integer_variables": int(integ.sum()), "constraints": self.n_rows, "nonzeros": nnz}


def _sum_duplicates(rows, cols, vals, n_cols):
    """One entry per (row, column), zeros dropped: terms of one row may name a column twice, and
    HiGHS's presolve loops forever (or crashes) on a matrix with repeated entries."""
    key = rows * max(n_cols, 1) + cols
    uniq, inverse = np.unique(key, return_inverse=True)
    summed = np.bincount(inverse, weights=vals, minlength=len(uniq))
    keep = summed != 0
    uniq, summed = uniq[keep], summed[keep]
    return uniq // max(n_cols, 1), uniq % max(n_cols, 1), summed


@dataclass
class ModelArrays:
    col_lb: np.ndarray
    col_ub: np.ndarray
    integrality: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    objective: np.ndarray
    objective_offset: float

    @property
    def n_cols(self) -> int:
        return len(self.col_lb)

    @property
    def n_rows(self) -> int:
        return len(self.row_lo)

    def csc(self):
        """(starts, index, value) of the constraint matrix in compressed-column form."""
        order = np.lexsort((self.rows, self.cols))
        cols = self.cols[order]
        starts = np.searchsorted(cols, np.arange(self.n_cols + 1)).astype(np.int32)
        return starts, self.rows[order].astype(np.int32), self.vals[order]

    def csr(self):
        order = np.lexsort((self.cols, self.rows))
        rows = self.rows[order]
        starts = np.searchsorted(rows, np.arange(self.n_rows + 1))
        return starts, self.cols[order], self.vals[order]

    def check(self, x: np.ndarray, tol: float = 1e-6) -> list[str]:
        """Violations of bounds, integrality and rows by the point x (for tests and warm starts)."""
        bad = []
        for k in np.nonzero((x < self.col_lb - tol) | (x > self.col_ub + tol))[0][:5]:
            bad.append(f"column {k} = {x[k]} outside [{self.col_lb[k]}, {self.col_ub[k]}]")
        frac = np.abs(x - np.round(x)) > tol
        for k in np.nonzero(self.integrality & frac)[0][:5]:
            bad.append(f"column {k} = {x[k]} not integer")
        act = np.zeros(self.n_rows)
        np.add.at(act, self.rows, self.vals * x[self.cols])
        scale = 1 + np.abs(act)
        viol = np.nonzero((act < self.row_lo - tol * scale) | (act > self.row_hi + tol * scale))[0]
        for k in viol[:5]:
            bad.append(f"row {k}: {act[k]} not in [{self.row_lo[k]}, {self.row_hi[k]}]")
        return bad
