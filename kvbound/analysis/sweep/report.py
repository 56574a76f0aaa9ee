"""A sweep's report: DIR/summary.md (markdown pivot tables) and its plots."""
from __future__ import annotations

from pathlib import Path

from ...fileio import write_user_file
from ..plot import plot_sweep, series_order
from .spec import GRID_KEYS


#: the files a sweep writes in its folder besides the plots (`plot_name`)
RESULTS, SUMMARY = "results.csv", "summary.md"


def plot_name(k: int, plot) -> str:
    """The file name of the spec's k-th (0-based) [[plot]] in the sweep's folder."""
    return f"plot_{k + 1}_{plot.objective}_vs_{plot.x}.png"


def written_files(spec, out_dir: Path) -> list[Path]:
    """Every file a sweep of `spec` may write in `out_dir`."""
    return [out_dir / RESULTS, out_dir / SUMMARY] + [out_dir / plot_name(k, p) for k, p in enumerate(spec.plots)]


def write_report(result) -> list[Path]:
    """DIR/summary.md (one pivot table per plotted column) and one PNG per [[plot]] entry of a `SweepResult`."""
    spec, out_dir = result.spec, result.out_dir
    paths = []
    lines = [f"# Sweep {spec.name}", ""]
    if spec.description:
        lines += [spec.description, ""]
    per_point = {r["point"]: r["point_seconds"] or 0.0 for r in result.rows}
    lines += [f"{len(per_point)} points, {sum(per_point.values()):.1f} s of compute in all (the sum over points of "
              f"their own time); the last run computed {result.ran} and found {result.skipped} done, in "
              f"{result.seconds:.1f} s wall time. Rows: `results.csv`. Gaps are (value - reference) / value.", ""]
    for k, plot in enumerate(spec.plots):
        rows = [r for r in result.rows if r["objective"] == plot.objective]
        if not rows:
            continue
        facets = [g for g in GRID_KEYS if g != plot.x and len(spec.grid.get(g, ())) > 1]
        name = plot_name(k, plot)
        plot_sweep(rows, plot, facets, out_dir / name,
                   title=plot.title or f"{spec.name}: {plot.objective.replace('_', ' ')} objective")
        paths.append(out_dir / name)
        lines += [f"![{plot.title or name}]({name})", ""]
        for y in plot.y:
            lines += [f"## {y} vs {plot.x} (objective {plot.objective})", "",
                      pivot_markdown(rows, plot.x, y, facets, plot.schedulers), ""]
    if spec.claims:
        from .claims import check_claims, claims_markdown

        result.verdicts = check_claims(spec.claims, result.rows)
        varying = [g for g in GRID_KEYS if len(spec.grid.get(g, ())) > 1]
        lines[2:2] = ["## Claims", "", claims_markdown(result.verdicts, varying), ""]
    write_user_file(out_dir / SUMMARY, "\n".join(lines))  # a full disk: one error line
    return paths


def pivot_markdown(rows: list[dict], x: str, y: str, facets: list[str], only=None) -> str:
    """Rows: facet values and x; columns: the series (schedulers, optimal); cells: y."""
    series = series_order(rows, only)
    head = facets + [x] + series + (["optimal: evictions", "optimal: proven?"] if "optimal" in series else [])
    text_x = any(isinstance(r[x], str) for r in rows)  # case names, presets: left-aligned
    lines = ["| " + " | ".join(head) + " |",
             "|" + "---|" * (len(facets) + text_x) + "---:|" * (len(head) - len(facets) - text_x)]
    cells: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        cells.setdefault(tuple(r[k] for k in facets) + (r[x],), {})[r["scheduler"]] = r
    for key, by_s in cells.items():
        vals = []
        for s in series:
            r = by_s.get(s)
            v = None if r is None else r.get(y)
            vals.append("refused" if r is not None and r["status"] == "refused" else _fmt(v, y))
        extra = []
        if "optimal" in series and "optimal" in by_s:
            best = by_s["optimal"]
            proven = best["status"] == "optimal"
            extra = [_fmt(best.get("evictions"), "evictions"),
                     "proven" if proven else f"no, {_fmt(best.get('gap_to_bound'), 'gap_to_bound')} to the bound"]
        lines.append("| " + " | ".join([str(k) for k in key] + vals + extra) + " |")
    return "\n".join(lines)


def _fmt(v, column: str) -> str:
    if v is None:
        return "-"
    if column.startswith("gap"):
        return f"{100 * v:.2f}%"
    return f"{v:.6g}" if isinstance(v, float) else str(v)
