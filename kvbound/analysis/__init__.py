"""Scheduler comparison, schedule plots, sweeps and schedule interop: the notebook API behind
`kvbound compare`, `plot`, `sweep`, `export` and `import`.

    from kvbound.analysis import compare, plot_comparison, plot_schedule
    table = compare(instance, "vllm,sarathi", solve=True, time_limit=30)
    table.to_json(); table.to_markdown(); plot_comparison(table, "cmp.png")
    plot_schedule(instance, table.row("optimal").schedule, "optimal.png")
"""
from .compare import ComparisonRow, ComparisonTable, compare
from .interop import from_precomputed, to_precomputed
from .plot import plot_comparison, plot_schedule, plot_sweep
from .sweep import SweepSpec, load_spec, read_results, run_sweep

__all__ = ["ComparisonRow", "ComparisonTable", "compare", "from_precomputed", "to_precomputed", "plot_comparison",
           "plot_schedule", "plot_sweep", "SweepSpec", "load_spec", "read_results", "run_sweep"]
