"""Sweeps: a grid of cases x objectives, each point compared (and optionally solved), resumable.

A spec (TOML, docs/sweeps.md) names a grid of case parameters or case files, the schedulers,
the objectives and whether to solve (`spec`). Every point (one case and one objective) runs
`compare()` in a worker: a local process pool, or Ray tasks on a cluster (`run`). The parent
appends each finished point's rows to DIR/results.csv in one write followed by fsync, so an
interrupted sweep loses at most the points still running; every row carries the point's key
(a hash of everything that determines its result) and how many rows the point has, so a
re-run skips complete points and redoes a point whose rows were cut short (`table`). Last,
DIR/summary.md and the plots (`report`).
"""
from .report import pivot_markdown, write_report
from .run import COLUMNS, SweepResult, evaluate_point, read_results, results_table, run_sweep
from .spec import DEFAULT_TIME_LIMIT, PlotSpec, Point, SweepSpec, evaluate, load_spec, parse_spec, point_key
from .table import ResultsTable

__all__ = ["pivot_markdown", "write_report", "COLUMNS", "SweepResult", "evaluate_point", "read_results",
           "results_table", "run_sweep", "DEFAULT_TIME_LIMIT", "PlotSpec", "Point", "SweepSpec", "evaluate",
           "load_spec", "parse_spec", "point_key", "ResultsTable"]
