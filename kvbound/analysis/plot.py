"""Schedule charts (after the seed paper's Figure 15), comparison bar charts and sweep line charts.

Every function builds a `matplotlib.figure.Figure` directly, without pyplot: no global
state and no backend switch, so the CLI works headless (files are rendered by Agg) and a
notebook displays the returned figure inline. matplotlib is imported only when a plot is
made.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import fileio
from ..fileio import save_figure_atomic
from ..schedule import Schedule
from ..workload import Instance
from .roles import DECODE, EVICT, PREFILL, schedule_roles

COLORS = {PREFILL: "#111111", DECODE: "#a0a0a0", EVICT: "#d62728"}
LABELS = {PREFILL: "prefill / refill", DECODE: "decode", EVICT: "evicted"}
HOLD_COLOR = "#9ecae1"  # idle while holding KV: a pale shade of the KV line's blue
KV_COLOR = "#1f77b4"
ARRIVAL_COLOR = "#2ca02c"
EVICT_WAIT_COLOR = "#f4a582"  # aggregate view: evicted, waiting for the refill
QUEUED_COLOR = "#fee8c8"  # aggregate view: arrived, not started
FORMATS = (".png", ".svg", ".pdf")
#: up to this many requests and batches every batch gets its own box (batch boundaries visible, as in
#: Figure 15); beyond, a box would be narrower than its white edge, so runs of one kind merge into one bar
DETAIL_LIMIT = 32
DETAIL_BATCHES = 150
#: up to this many requests one row per request; beyond, the chart shows how many requests are in each state
ROW_LIMIT = 250


def check_out_path(out: str | Path, field: str = "out") -> Path:
    """`out` as an image path (.png, .svg or .pdf, in a writable folder); `field` names the argument."""
    return fileio.check_out_path(out, field, FORMATS)


def save(fig, out: str | Path | None, field: str = "out") -> None:
    if out is not None:
        save_figure_atomic(fig, check_out_path(out, field), dpi=150)


def series_order(rows: list[dict], only=None) -> list[str]:
    """The schedulers of result rows in order of appearance, the optimal row first; only those in `only`."""
    names = list(dict.fromkeys(r["scheduler"] for r in rows))
    names.sort(key=lambda s: s != "optimal")
    return [s for s in names if only is None or s in only]


def _time_unit(total: float) -> tuple[float, str]:
    return (1e3, "ms") if total < 2.0 else (1.0, "s")


def _intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous edges over the batches and the idle gaps between them: (edges, batch index or -1 per interval).

    Batches that take no time (they process nothing) are left out.
    """
    edges, owner = [], []
    t = 0.0
    for j, (s, e) in enumerate(zip(starts, ends)):
        if e <= s:
            continue
        if s > t + 1e-15:
            if not edges:
                edges.append(t)
            edges.append(s)
            owner.append(-1)
        if not edges:
            edges.append(s)
        edges.append(e)
        owner.append(j)
        t = e
    return np.array(edges), np.array(owner, dtype=int)


def plot_schedule(instance: Instance, schedule: Schedule, out: str | Path | None = None, *, title: str | None = None):
    """A chart of one schedule: what every request does over time, and the KV cache in use against M.

    Up to DETAIL_LIMIT requests, one box per request and batch (prefill/refill black, decode grey,
    evicted red; pale blue: idle while holding KV). Up to ROW_LIMIT requests, consecutive boxes of
    one kind merge into one bar. Beyond, the top panel counts the requests in each state instead.
    The schedule is replayed by the validator first (ScheduleError if it is invalid).
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    sr = schedule_roles(instance, schedule)
    rep = sr.replay
    n = len(instance)
    scale, unit = _time_unit(rep.metrics.total_latency)
    starts, ends = rep.batch_start * scale, rep.batch_end * scale
    per_request = n <= ROW_LIMIT
    top_h = float(np.clip(0.3 * n, 1.6, 7.5)) if per_request else 3.0
    fig = Figure(figsize=(10, top_h + 2.6), layout="constrained")
    gs = fig.add_gridspec(2, 1, height_ratios=[top_h, 1.6])
    ax = fig.add_subplot(gs[0])
    ax_kv = fig.add_subplot(gs[1], sharex=ax)
    detail = False
    if per_request:
        detail = n <= DETAIL_LIMIT and len(schedule.batches) <= DETAIL_BATCHES
        _request_rows(ax, instance, sr, starts, ends, scale, detail)
    else:
        _state_counts(ax, instance, sr, starts, ends, scale)
    handles = [Patch(color=COLORS[k], label=LABELS[k]) for k in (PREFILL, DECODE)]
    if not per_request:
        handles += [Patch(color=HOLD_COLOR, label="idle, holding KV"),
                    Patch(color=EVICT_WAIT_COLOR, label="evicted, awaiting refill"),
                    Patch(color=QUEUED_COLOR, label="queued")]
    else:
        handles += [Patch(color=COLORS[EVICT], label=LABELS[EVICT]) if detail else
                    Line2D([], [], color=COLORS[EVICT], marker="x", linestyle="none", label=LABELS[EVICT]),
                    Patch(color=HOLD_COLOR, label="idle, holding KV")]
        if not instance.offline:
            handles.append(Line2D([], [], color=ARRIVAL_COLOR, marker="|", linestyle="none", label="arrival"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles), frameon=False, fontsize=8)
    m = rep.metrics
    ax.set_title(title or f"{instance.name or 'schedule'}: total {m.total_latency * scale:.4g} {unit}, "
                 f"{m.batches} batches, {m.evictions} eviction{'' if m.evictions == 1 else 's'}", loc="left",
                 fontsize=10, pad=22)
    ax.tick_params(labelbottom=False)

    edges, owner = _intervals(starts, ends)
    if len(owner):
        values = np.empty(len(owner))
        held = 0  # in an idle gap, the KV left after the previous batch
        for k, j in enumerate(owner):
            if j >= 0:
                values[k], held = rep.batch_kv[j], sr.kv_after[j]
            else:
                values[k] = held
        ax_kv.stairs(values, edges, fill=True, color=KV_COLOR, alpha=0.18, linewidth=0)
        ax_kv.stairs(values, edges, color=KV_COLOR, linewidth=1.2)
    M = instance.system.kv_capacity
    x_end = max(float(ends.max()) if len(ends) else 1.0, 1e-12) * 1.01
    ax_kv.axhline(M, color="black", linestyle="--", linewidth=1)
    ax_kv.text(x_end, M * 1.03, f"M = {M:,}", ha="right", va="bottom", fontsize=8)
    ax_kv.set_ylim(0, M * 1.2)
    ax_kv.set_ylabel("KV in use (tokens)")
    ax_kv.set_xlabel(f"time ({unit})")
    ax_kv.set_xlim(0, x_end)
    ax_kv.grid(axis="y", alpha=0.3)
    save(fig, out)
    return fig


def _request_rows(ax, instance: Instance, sr, starts, ends, scale: float, detail: bool) -> None:
    from matplotlib.collections import PolyCollection

    n = len(instance)
    boxes: dict[str, list] = {PREFILL: [], DECODE: [], EVICT: []}
    hold: list = []
    open_run: dict[int, list] = {}  # request -> [role, x0, x1] of the bar being merged
    eps = 1e-12 * max(1.0, float(ends.max()) if len(ends) else 1.0)

    def flush(i: int) -> None:
        role, x0, x1 = open_run.pop(i)
        (hold if role == "hold" else boxes[role]).append((i, x0, x1))

    instant: list = []  # evictions in batches that take no time (they only evict): no box to draw
    for j, (s, e) in enumerate(zip(starts, ends)):
        if e <= s:
            instant += [(i, s, s) for i, role in sr.roles[j].items() if role == EVICT]
            continue
        active = dict(sr.roles[j])
        active.update({i: "hold" for i in sr.holding[j]})
        for i in list(open_run):
            run = open_run[i]
            if detail or active.get(i) != run[0] or s - run[2] > eps:
                flush(i)
        for i, role in active.items():
            if i in open_run:
                open_run[i][2] = e
            else:
                open_run[i] = [role, s, e]
    for i in list(open_run):
        flush(i)

    def rects(items, h):
        return [[(x0, i - h / 2), (x1, i - h / 2), (x1, i + h / 2), (x0, i + h / 2)] for i, x0, x1 in items]

    edge = dict(edgecolors="white", linewidths=0.6) if detail else dict(edgecolors="none")
    ax.add_collection(PolyCollection(rects(hold, 0.3), facecolors=HOLD_COLOR, edgecolors="none"))
    for role, items in boxes.items():
        ax.add_collection(PolyCollection(rects(items, 0.8), facecolors=COLORS[role], **edge))
    if not instance.offline:
        ax.scatter(instance.arrivals * scale, np.arange(n), marker="|", s=40 if detail else 12, color=ARRIVAL_COLOR,
                   linewidths=1.2, zorder=3)
    # a box one batch wide is too narrow to see at this scale: mark each eviction with an x
    marks = instant + ([] if detail else boxes[EVICT])
    if marks:
        ax.scatter([x0 for _, x0, _ in marks], [i for i, _, _ in marks], marker="x",
                   s=28 if n <= 60 else 12, color=COLORS[EVICT], linewidths=1.2, zorder=4)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_ylabel("request")
    if n <= DETAIL_LIMIT:
        ax.set_yticks(range(n))
        ax.tick_params(axis="y", labelsize=8 if n > 12 else 9)


def _state_counts(ax, instance: Instance, sr, starts, ends, scale: float, bins: int = 300) -> None:
    """Many requests: the time-averaged number of requests in each state, in `bins` time bins, stacked.

    Per batch a request is processing (prefill-type or decode-type), idle holding KV, evicted and
    waiting for its refill, or queued (arrived, never processed yet); batches alternate too fast to
    show one by one, so each bin shows the average over its time.
    """
    arrivals = np.sort(instance.arrivals) * scale
    states = (PREFILL, DECODE, "hold", EVICT, "queued")
    counts = np.zeros((len(states), len(starts)))
    started, waiting_refill = set(), set()
    for j in range(len(starts)):
        role = sr.roles[j]
        for i, r in role.items():
            if r == EVICT:
                waiting_refill.add(i)
            else:
                waiting_refill.discard(i)
                started.add(i)
        counts[0, j] = sum(r == PREFILL for r in role.values())
        counts[1, j] = sum(r == DECODE for r in role.values())
        counts[2, j] = len(sr.holding[j])
        counts[3, j] = len(waiting_refill)
        counts[4, j] = np.searchsorted(arrivals, starts[j], side="right") - len(started)
    edges, owner = _intervals(starts, ends)
    if not len(owner):
        return
    # exact bin averages from the cumulative time integral of each count (idle gaps count as 0)
    per_interval = np.where(owner >= 0, counts[:, np.maximum(owner, 0)], 0.0)
    area = np.concatenate([np.zeros((len(states), 1)), np.cumsum(per_interval * np.diff(edges), axis=1)], axis=1)
    grid = np.linspace(edges[0], edges[-1], min(bins, len(owner)) + 1)
    avg = np.diff(np.array([np.interp(grid, edges, a) for a in area]), axis=1) / np.diff(grid)
    colors = [COLORS[PREFILL], COLORS[DECODE], HOLD_COLOR, EVICT_WAIT_COLOR, QUEUED_COLOR]
    base = np.zeros(avg.shape[1])
    for row, color in zip(avg, colors):
        ax.stairs(base + row, grid, baseline=base, fill=True, color=color, linewidth=0)
        base = base + row
    ax.set_ylabel("requests (time average)")
    ax.set_ylim(0, max(1.0, float(base.max()) * 1.05))


# --------------------------------------------------------------------------- comparison bars

OPTIMAL_COLOR = "#2ca02c"
EVICTING_COLOR = "#1f77b4"
EVICTION_FREE_COLOR = "#ff7f0e"


def plot_comparison(table, out: str | Path | None = None, *, title: str | None = None):
    """Horizontal bars of each row's objective, best first, with the certified lower bound drawn.

    Bars are coloured by whether the schedule evicts; each is labelled with its value and its gap
    to the bound. Refused schedulers are listed at the bottom without a bar.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    obj = table.objective_name
    served = sorted((r for r in table.rows if r.metrics is not None), key=lambda r: (r.value(obj), r.scheduler != "optimal"))
    refused = [r for r in table.rows if r.metrics is None]
    rows = served + refused
    top = max([r.value(obj) for r in served] + [table.lower_bound or 0.0, 1e-12])
    scale, unit = _time_unit(top)
    fig = Figure(figsize=(9, 1.2 + 0.32 * max(len(rows), 2)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(rows))
    for k, r in enumerate(served):
        color = OPTIMAL_COLOR if r.scheduler == "optimal" else (EVICTING_COLOR if r.metrics.evictions else EVICTION_FREE_COLOR)
        v = r.value(obj) * scale
        ax.barh(k, v, color=color, height=0.7)
        gap = "" if r.gap_to_bound is None else f"   gap to bound {100 * r.gap_to_bound:.1f}%"
        ax.text(v, k, f" {v:.4g}{gap}", va="center", fontsize=8)
    for k, r in enumerate(refused, start=len(served)):
        ax.text(0, k, " refused: cannot serve this case", va="center", fontsize=8, color="#777777")
    labels = [r.label for r in rows]
    ax.set_yticks(y, labels, fontsize=9)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlim(0, top * scale * 1.4)  # room for the labels
    handles = [Patch(color=EVICTING_COLOR, label="evicts"), Patch(color=EVICTION_FREE_COLOR, label="no evictions")]
    if any(r.scheduler == "optimal" for r in served):
        handles.insert(0, Patch(color=OPTIMAL_COLOR, label="solver"))
    if table.lower_bound is not None:
        lb = table.lower_bound * scale
        ax.axvline(lb, color="black", linestyle="--", linewidth=1)
        handles.append(ax.plot([], [], color="black", linestyle="--", linewidth=1,
                               label=f"{'certified ' if table.bound_certified else ''}lower bound {lb:.4g} {unit}")[0])
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles), frameon=False, fontsize=8)
    ax.set_xlabel(f"{obj.replace('_', ' ')} ({unit}); gap = (value - bound) / value")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"{obj.replace('_', ' ')} by scheduler", loc="left", fontsize=10, pad=20)
    save(fig, out)
    return fig


# --------------------------------------------------------------------------- sweeps

AXIS_LABELS = {"prompt": "prompt length I (tokens)", "output": "output length O (tokens)", "requests": "requests N",
               "kv_capacity": "KV capacity M (tokens)", "max_batch_tokens": "batch tokens C",
               "max_prefill_tokens": "prefill tokens P", "block_size": "block size", "preset": "cost preset",
               "case": "case"}

def _sparse_minor_label(v: float, _pos) -> str:
    """Label only the 2, 3 and 5 minor ticks of a log axis: all nine collide."""
    if v <= 0:
        return ""
    lead = round(v / 10 ** np.floor(np.log10(v)))
    return f"{v:g}" if lead in (2, 3, 5) else ""


def plot_sweep(rows: list[dict], plot, facets: list[str], out: str | Path | None = None, *, title: str = ""):
    """One panel per y column (and per combination of the other varying grid keys): a line per series
    over a numeric x, grouped bars over a categorical x (case files, presets). A filled marker means
    that schedule evicts, a hollow one that it does not; the dashed line is the certified lower bound."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    series = series_order(rows, plot.schedulers)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in facets), []).append(r)
    facet_list = list(groups)[:4]  # more panels than this are unreadable; summary.md has every number
    # one row per y column, one column per facet, x shared down each column
    fig = Figure(figsize=(6.0 * len(facet_list) + 2.0, 2.8 * len(plot.y) + 0.7), layout="constrained")
    axes = fig.subplots(len(plot.y), len(facet_list), squeeze=False, sharex="col")
    palette = ["#1f77b4", "#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
    markers = ["s", "^", "D", "v", "P", "X", "<", ">", "*"]
    heuristics = [s for s in series if s != "optimal"]
    # the optimum: a wide translucent band under everything, so heuristics that match it stay visible on it
    style = {"optimal": dict(color="black", marker="o", lw=5.0, alpha=0.3, ms=9, z=2)}
    # each later series is drawn thinner and smaller on top, so series with equal values nest visibly
    style.update({s: dict(color=palette[k % len(palette)], marker=markers[k % len(markers)], lw=max(0.8, 2.6 - 0.3 * k),
                          alpha=1.0, ms=max(3.5, 9.0 - 0.9 * k), z=3 + k) for k, s in enumerate(heuristics)})
    categorical = any(isinstance(r[plot.x], str) for r in rows)
    for fi, facet in enumerate(facet_list):
        frows = groups[facet]
        xs = list(dict.fromkeys(r[plot.x] for r in frows))
        if not categorical:
            xs.sort()
        for yi, y in enumerate(plot.y):
            ax = axes[yi][fi]
            pct = y.startswith("gap")
            scale = 100.0 if pct else 1.0
            for k, s in enumerate(series):
                by_x = {r[plot.x]: r for r in frows if r["scheduler"] == s and r.get(y) is not None}
                pos = [(xs.index(x) if categorical else x) for x in xs if x in by_x]
                vals = [by_x[x][y] * scale for x in xs if x in by_x]
                evicts = [bool(by_x[x]["evictions"]) for x in xs if x in by_x]
                st = style[s]
                if categorical:  # dodge the series within each category
                    width = 0.8 / max(len(series), 1)
                    pos = [p - 0.4 + width * (k + 0.5) for p in pos]
                    ax.bar(pos, vals, width=width * 0.95, color=st["color"], alpha=0.45 if s == "optimal" else 0.85)
                else:
                    ax.plot(pos, vals, color=st["color"], linewidth=st["lw"], alpha=st["alpha"], zorder=st["z"])
                for p, v, e in zip(pos, vals, evicts):  # filled: the schedule evicts; hollow: it does not
                    ax.plot([p], [v], marker=st["marker"], markersize=st["ms"], linestyle="none", zorder=st["z"] + 1,
                            markeredgecolor=st["color"], markerfacecolor=st["color"] if e else "white",
                            alpha=0.6 if s == "optimal" else 1.0)
            if y == plot.objective:
                bound = {r[plot.x]: r["lower_bound"] for r in frows if r.get("lower_bound") is not None}
                bx = [x for x in xs if x in bound]
                if bx:
                    if categorical:
                        for x in bx:
                            i = xs.index(x)
                            ax.hlines(bound[x], i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1, zorder=5)
                    else:
                        ax.plot(bx, [bound[x] for x in bx], color="#555555", linestyle="--", linewidth=1)
            if categorical:
                ax.set_xticks(range(len(xs)), [str(x) for x in xs], rotation=20 if len(xs) > 4 else 0, ha="right" if len(xs) > 4 else "center", fontsize=8)
            elif plot.logx:
                ax.set_xscale("log", base=2)
                if len(xs) <= 12:  # label the grid's own values, not powers of two
                    ax.set_xticks(xs, [f"{x:g}" for x in xs], fontsize=8)
                    ax.minorticks_off()
            seconds = "latency" in y or "ttft" in y or "tpot" in y
            if plot.logy and seconds:  # counts and gaps stay linear: their zeros matter
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(FuncFormatter(_sparse_minor_label))
                ax.tick_params(axis="y", which="minor", labelsize=7)
            if yi == len(plot.y) - 1:
                ax.set_xlabel(AXIS_LABELS.get(plot.x, plot.x))
            unit = " (%)" if pct else (" (s)" if seconds else "")
            if y in ("batches", "evictions", "recomputed_tokens", "peak_kv"):
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(y.replace("_", " ").replace("ttft", "TTFT").replace("tpot", "TPOT").replace("kv", "KV") + unit)
            ax.grid(alpha=0.3)
            if facets and yi == 0:
                ax.set_title(", ".join(f"{k} = {v}" for k, v in zip(facets, facet)), fontsize=9, loc="left")
    handles = [Line2D([], [], color=style[s]["color"], linewidth=style[s]["lw"], alpha=style[s]["alpha"],
                      marker=style[s]["marker"], label=s) for s in series]
    handles += [Line2D([], [], marker="o", color="gray", markerfacecolor="gray", linestyle="none", label="filled: evicts"),
                Line2D([], [], marker="o", color="gray", markerfacecolor="white", linestyle="none", label="hollow: no evictions")]
    if any(r.get("lower_bound") is not None for r in rows) and plot.objective in plot.y:
        handles.append(Line2D([], [], color="#555555" if not categorical else "black", linestyle="--",
                              label="certified lower bound"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    save(fig, out)
    return fig


# --------------------------------------------------------------------------- headroom

HEADROOM_PALETTE = ["#1f77b4", "#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
HEADROOM_MARKERS = ["s", "^", "D", "v", "P", "X", "<", ">"]


def plot_headroom(result, out: str | Path | None = None, *, title: str = ""):
    """Latency against load (a kvbound.analysis.headroom.HeadroomResult): one curve per scheduler over the
    rate factor, the best schedule found (black) and, shaded, the band between it and the certified lower
    bound (dashed), where the optimum lies. With an SLO, a second panel: each scheduler's SLO attainment
    and the certified upper bound on it."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    obj = result.objective
    pts = result.points
    with_slo = result.slo is not None
    fig = Figure(figsize=(10, 4.6 + (2.6 if with_slo else 0.0)), layout="constrained")
    axes = fig.subplots(2 if with_slo else 1, 1, squeeze=False, sharex=True)[:, 0]
    ax = axes[0]
    xs = [p.rate_factor for p in pts]
    for k, s in enumerate(result.schedulers):
        xy = [(p.rate_factor, p.value(s, obj)) for p in pts if p.value(s, obj) is not None]
        if xy:
            ax.plot(*zip(*xy), color=HEADROOM_PALETTE[k % len(HEADROOM_PALETTE)],
                    marker=HEADROOM_MARKERS[k % len(HEADROOM_MARKERS)], lw=1.6, ms=6, label=s, zorder=3)
    best = [(p.rate_factor, p.best) for p in pts if p.best is not None]
    if best:
        ax.plot(*zip(*best), color="black", marker="o", lw=2.2, ms=5, label="best found", zorder=4)
    band = [(p.rate_factor, p.lower_bound, p.best) for p in pts if p.lower_bound is not None and p.best is not None]
    if band:
        bx, lo, hi = zip(*band)
        certified = all(p.bound_certified for p in pts if p.lower_bound is not None)
        ax.fill_between(bx, lo, hi, color="#777777", alpha=0.25, lw=0, zorder=1,
                        label="the optimum lies here (best found to bound)")
        ax.plot(bx, lo, color="#333333", linestyle="--", lw=1.2, zorder=2,
                label="certified lower bound" if certified else "lower bound (not all certified)")
    values = [v for line in ax.get_lines() for v in line.get_ydata() if v is not None and v > 0]
    upper = result.capacity_upper_bound
    if upper is not None and xs and min(xs) / 2 <= upper <= max(xs) * 2:  # beyond the curve's ends it says little
        for a in axes:
            a.axvline(upper, color="#b2182b", linestyle="-.", lw=1.3, zorder=2,
                      label=f"certified: no schedule within the capacity limit from f = {upper:.3g} on")
    if values and max(values) / min(values) > 5:  # latencies that grow by orders of magnitude: a log axis
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # 1, 2, 5, 10, 20, ... labelled
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel(f"{obj.replace('_', ' ').replace('ttft', 'TTFT')} (s)")
    ax.grid(alpha=0.3, which="both")
    if with_slo:
        ax2 = axes[1]
        for k, s in enumerate(result.schedulers):
            xy = [(p.rate_factor, p.value(s, "slo_attainment")) for p in pts if p.value(s, "slo_attainment") is not None]
            if xy:
                x, y = zip(*xy)
                ax2.plot(x, [100 * v for v in y], color=HEADROOM_PALETTE[k % len(HEADROOM_PALETTE)],
                         marker=HEADROOM_MARKERS[k % len(HEADROOM_MARKERS)], lw=1.6, ms=6, label=s)
        up = [(p.rate_factor, p.slo_attainment_upper_bound) for p in pts if p.slo_attainment_upper_bound is not None]
        if up:
            x, y = zip(*up)
            ax2.plot(x, [100 * v for v in y], color="#333333", linestyle=":", lw=1.4,
                     label="certified upper bound on SLO attainment")
        ax2.set_ylabel(f"SLO attained (%)\n{result.slo}", fontsize=9)
        ax2.set_ylim(-3, 103)
        ax2.grid(alpha=0.3)
    handles, labels = {}, []
    for a in axes:
        for h, lab in zip(*a.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=8, frameon=False)
    last = axes[-1]
    last.set_xscale("log", base=2)
    if xs and len(xs) <= 12:
        last.set_xticks(xs, [f"{x:g}" for x in xs])
        last.minorticks_off()
    last.set_xlabel("rate factor (arrival times divided by it)")
    if result.base_rate:
        rate = result.base_rate
        top = ax.secondary_xaxis("top", functions=(lambda f: f * rate, lambda r: r / rate))
        top.set_xlabel("requests per second", fontsize=8)
        if xs and len(xs) <= 12:
            top.set_xticks([x * rate for x in xs], [f"{x * rate:.3g}" for x in xs], fontsize=8)
            top.minorticks_off()
    ax.set_title(title or f"{obj.replace('_', ' ')} under load", loc="left", fontsize=10)
    save(fig, out)
    return fig
