"""The configuration (Gilmore-Gomory) LP of the KV items: a batch-count lower bound at least as strong
as the KV area and every dual-feasible function (docs/formulation.md, "The configuration LP").

The batch generating token q of request i holds at least I + q - 1 KV tokens (block-rounded), in any
schedule, with pauses or evictions (`kv_items`). A schedule's batches are bins of capacity M covering
every item once, so their number is at least the value of the LP

    min sum_p x_p   s.t.   sum_p a_sp x_p >= d_s (every item size s),  x >= 0,

over the configurations p (a_sp items of size s, together at most M). Column generation: HiGHS
solves the LP over the configurations so far; its row duals y price a new one by a bounded knapsack
(max y.a, s.a <= M, a <= d), solved exactly by dynamic programming. Whatever y >= 0 is, y / max(1,
best knapsack value) is feasible for the dual of the full LP, so Farley's bound y.d / max(1, best)
holds at every step: a run cut by its deadline still gives a certified bound. The first batches hold
less than M while prefills fill the cache (`ramp_capacities`); with f(c) the knapsack's value at
capacity c, any y >= 0 gives y.d <= sum over a schedule's batches of f(its capacity), which counts
those batches at their own capacity (docs/formulation.md, "The prefill ramp").
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..alone import minimum_work
from ..deadline import Deadline
from ..fileio import native_stdout_aside
from ..workload import Instance
from .base import Bound, Stage, register
from .kv_items import batches_to_hold, kv_items, ramp_capacities


#: the most cells (0-1 pieces x capacity units) of the pricing's knapsack table (a bool each)
KNAPSACK_CELLS = 20_000_000


@register
class ConfigurationLp:
    """Total latency >= the configuration LP's batches x intercept + the least work, where no model is
    solved. It may take half the time left; it stops where column generation converges, and cut
    earlier Farley's bound is far weaker."""

    name, stage, share = "configuration_lp", Stage.SEARCH, 0.5

    def skip_reason(self, known) -> str | None:
        return "for total latency only" if known.objective.is_mean else None

    def compute(self, known, deadline: Deadline) -> list[Bound]:
        config = configuration_batches(known.instance, deadline)
        value = config.batches * known.instance.cost.intercept + minimum_work(known.instance)
        cut = "" if config.lp is not None else " (Farley's bound: cut by the time limit)"
        return [Bound("batches (configuration LP of the KV items) x intercept + minimum work", value, config.seconds,
                      note=f"at least {config.batches} batches{cut}", batches=config.batches,
                      details={**config.to_json(), "bound": value})]


@dataclass
class ConfigurationBound:
    """At least `batches` batches in every schedule; `lp` the LP value where column generation
    converged (None if the deadline cut it), how long it ran, and the size unit it used."""

    batches: int
    lp: float | None
    columns: int
    seconds: float
    unit: int = 1  # KV blocks per size unit (> 1 where M is too large for the knapsack table)

    def to_json(self) -> dict:
        return {"batches": self.batches, "lp": self.lp, "columns": self.columns, "seconds": round(self.seconds, 3),
                "unit_blocks": self.unit}


def configuration_batches(instance: Instance, deadline: Deadline) -> ConfigurationBound:
    """The configuration LP's batch bound (Farley's at the last step if `deadline` cuts it short)."""
    import highspy

    t0 = time.perf_counter()
    block = instance.system.block_size
    items, _ = kv_items(instance)
    unit, capacity, sizes, demand = _coarse_sizes(items // block, instance.system.kv_capacity // block)
    n = len(sizes)
    if n == 0:  # every item fits any batch with the others: the LP says nothing
        return ConfigurationBound(0, 0.0, 0, time.perf_counter() - t0, unit)
    with native_stdout_aside():  # highspy prints its banner when constructed
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    inf = highspy.kHighsInf
    h.addRows(n, demand.astype(float), np.full(n, inf), 0, np.array([0], dtype=np.int32),
              np.array([], dtype=np.int32), np.array([], dtype=float))
    for s in range(n):  # one size alone, as many as fit and exist: every item is covered from the start
        h.addCol(1.0, 0.0, inf, 1, np.array([s], dtype=np.int32), np.array([float(min(demand[s], capacity // sizes[s]))]))
    pieces = _binary_pieces(demand)
    # the ramp's capacities in size units: the items' blocks sum to at most floor(tokens / b), their
    # sizes (rounded down) to at most that over the unit
    ramp = ramp_capacities(instance) // (block * unit)
    batches, columns, lp = 0, n, None
    while True:
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break
        y = np.maximum(np.array(h.getSolution().row_dual), 0.0)
        value, column, by_capacity = _knapsack(sizes, y, pieces, capacity)
        # y.d and the knapsack's sums are floating point (relative error ~1e-12): `batches_to_hold`
        # counts a total a hair above a batch's worth as that batch
        batches = max(batches, batches_to_hold(float(y @ demand), by_capacity[ramp], value))
        if value <= 1 + 1e-9:
            lp = float(h.getInfo().objective_function_value)
            break
        if deadline.expired():
            break
        nz = np.nonzero(column)[0]
        h.addCol(1.0, 0.0, inf, len(nz), nz.astype(np.int32), column[nz].astype(float))
        columns += 1
    return ConfigurationBound(batches, lp, columns, time.perf_counter() - t0, unit)


def _coarse_sizes(blocks: np.ndarray, capacity: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(unit, capacity, sizes, demand) in units of `unit` blocks, the smallest power of two that
    keeps the knapsack table within KNAPSACK_CELLS. Sizes and capacity are rounded down: whatever
    fits in a batch still fits (sum floor(s / u) <= floor(sum s / u)), so the coarse LP is a
    relaxation and its bound holds; items that round to 0 fit anywhere and leave the LP."""
    unit = 1
    while True:
        sizes, demand = np.unique(blocks // unit, return_counts=True)
        keep = sizes > 0
        sizes, demand = sizes[keep], demand[keep]
        pieces = int(sum(int(d).bit_length() for d in demand))
        if pieces * (capacity // unit + 1) <= KNAPSACK_CELLS or capacity // unit <= 1:
            return unit, capacity // unit, sizes, demand
        unit *= 2


def _binary_pieces(demand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bounded knapsack as a 0-1 one: size s with demand d splits into pieces of 1, 2, 4, ...
    copies and a remainder, whose sums reach every count 0..d. Returns (size index, copies)."""
    index, copies = [], []
    for s, d in enumerate(demand):
        k = 1
        while d > 0:
            take = min(k, d)
            index.append(s)
            copies.append(take)
            d -= take
            k *= 2
    return np.array(index), np.array(copies)


def _knapsack(sizes: np.ndarray, y: np.ndarray, pieces, capacity: int) -> tuple[float, np.ndarray, np.ndarray]:
    """max y.a over a <= demand with sizes.a <= capacity, exactly (0-1 DP over the pieces), a, and the
    same maximum for every capacity 0..capacity."""
    index, copies = pieces
    keep = (y[index] > 0) & (sizes[index] * copies <= capacity)
    index, copies = index[keep], copies[keep]
    best = np.zeros(capacity + 1)
    taken = np.zeros((len(index), capacity + 1), dtype=bool)
    for k, (s, c) in enumerate(zip(index, copies)):
        w, v = int(sizes[s] * c), float(y[s] * c)
        with_it = best[:capacity + 1 - w] + v
        better = with_it > best[w:]
        taken[k, w:] = better
        best[w:] = np.where(better, with_it, best[w:])
    column, room = np.zeros(len(sizes), dtype=np.int64), capacity
    for k in range(len(index) - 1, -1, -1):
        if taken[k, room]:
            column[index[k]] += copies[k]
            room -= int(sizes[index[k]] * copies[k])
    return float(best[capacity]), column, best
