"""Running a sweep: the points not yet in DIR/results.csv, each `compare()`d in a worker (a local
process pool, or Ray tasks on a cluster); the parent appends each finished point's rows to the
resumable results table, then writes the report.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ... import interrupt
from ...interrupt import Stopped
from ...units import check_backend, run_units
from ..compare import METRIC_COLUMNS, compare
from .report import write_report
from .spec import PARAM_COLUMNS, Point, SweepSpec
from .table import ResultsTable

#: the columns of results.csv (a contract: docs/sweeps.md)
COLUMNS = (("point", "point_rows") + PARAM_COLUMNS + ("scheduler", "status", "note") + METRIC_COLUMNS
           + ("gap_to_bound", "gap_to_best", "lower_bound", "bound_certified", "best_known", "point_seconds"))
NUMERIC_COLUMNS = set(METRIC_COLUMNS) | {"gap_to_bound", "gap_to_best", "lower_bound", "best_known", "point_seconds",
                                         "prompt", "output", "requests", "kv_capacity", "max_batch_tokens",
                                         "max_prefill_tokens", "block_size", "rate"}


def evaluate_point(point: Point) -> list[dict]:
    """The rows of one point: compare() on its case, flattened into result-table rows. Runs in a worker."""
    t0 = time.perf_counter()
    run = point.run
    from ...schedule import Slo

    slo = Slo.parse(run["slo"]) if run.get("slo") else None
    table = compare(point.instance, run["schedulers"], solve=run["solve"], options=point.options, slo=slo)
    if interrupt.requested() is not None:  # cut short (its solve reports "interrupted"): never recorded as done
        raise Stopped("interrupted")
    seconds = time.perf_counter() - t0
    rows = []
    for r in table.rows:
        row = {"point": point.key, "point_rows": len(table.rows), **point.params, "scheduler": r.scheduler}
        row["status"] = r.status or ("refused" if r.metrics is None else "ok")
        row["note"] = r.refused or ""
        row.update(r.to_json())
        row.update(lower_bound=table.lower_bound, bound_certified=table.bound_certified, best_known=table.best_known,
                   point_seconds=round(seconds, 3))
        rows.append(row)
    return rows


def results_table(path: str | Path) -> ResultsTable:
    """A sweep's results.csv: rows keyed by their point, each saying how many rows its point has."""
    return ResultsTable(path, COLUMNS, key="point", count_column="point_rows")


def read_results(path: str | Path) -> list[dict]:
    """The rows of a results.csv with numbers parsed (empty cells are None)."""
    return [_typed(r) for r in results_table(path).rows]


def _typed(row: dict) -> dict:
    out = dict(row)
    for k in NUMERIC_COLUMNS:
        v = row.get(k, "")
        out[k] = None if v == "" else (int(v) if v.lstrip("-").isdigit() else float(v))
    out["bound_certified"] = row.get("bound_certified") == "true"
    return out


@dataclass
class SweepResult:
    spec: SweepSpec
    out_dir: Path
    rows: list[dict]  # every row of the spec's points, in grid order, numbers parsed
    ran: int  # points computed in this run
    skipped: int  # points found complete in results.csv
    seconds: float
    plots: list[Path] = field(default_factory=list)
    verdicts: list = field(default_factory=list)  # claims.ClaimVerdict per [[claim]] of the spec (set by the report)
    interrupted: bool = False  # cut short by Ctrl-C or SIGTERM: `ran` counts the points finished before it


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, backend: str = "local", workers: int | None = None,
              address: str | None = None, progress: bool | None = None, plots: bool = True) -> SweepResult:
    """Run the points of `spec` not yet in out_dir/results.csv, then write the summary and plots.

    backend "local": a process pool of `workers` (default: the CPU count; 1 runs in this
    process). backend "ray": one Ray task per point, on the cluster at `address` or on a
    local Ray instance with `workers` CPUs. `progress` None shows the bar on a terminal only.
    """
    from tqdm import tqdm

    check_backend(backend, workers)
    t0 = time.perf_counter()
    points = spec.points()  # every bad grid value is reported before anything is written
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = results_table(out_dir / "results.csv")
    done = table.done
    todo = [p for p in points if p.key not in done]
    runner = run_units(evaluate_point, todo, backend=backend, workers=workers, address=address)
    ran, interrupted = 0, False
    with tqdm(total=len(points), initial=len(points) - len(todo), unit="point", desc=spec.name,
              disable=not progress if progress is not None else None) as bar:
        try:
            for _, rows in runner:
                with interrupt.deferred():  # a point's rows are written whole
                    table.append(rows)
                ran += 1
                bar.update()
        except Stopped:  # an interrupt: the points finished are reported (a re-run does the rest)
            if interrupt.requested() is None:
                raise
            interrupted = True
    with interrupt.deferred():  # what is finished is reported, whatever comes now
        by_key: dict[str, list[dict]] = {}
        for r in table.rows:
            by_key.setdefault(r["point"], []).append(r)
        rows = [_typed(r) for p in points for r in by_key.get(p.key, [])]
        result = SweepResult(spec, out_dir, rows, ran, len(points) - len(todo), time.perf_counter() - t0,
                             interrupted=interrupted)
        if plots:
            result.plots = write_report(result)
        return result
