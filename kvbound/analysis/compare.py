"""Compare heuristic schedulers (and optionally the solver's optimum) on one instance.

`compare(instance, schedulers, solve=..., objective=...)` runs every scheduler, replays
each schedule with the validator from its JSON form (so every number in the table is the
validator's, not the simulator's), takes the best certified lower bound and reports, per
row, the gaps

    gap_to_bound = (value - lower_bound) / value
    gap_to_best  = (value - best_known)  / value

where `value` is the row's objective (e.g. total_latency). Both are fractions in [0, 1):
the share of the row's latency that a better schedule could at most (bound) or
demonstrably (best known) remove. They use the same convention as the solver's gap.

A scheduler that cannot serve the case (e.g. vLLM without chunking on a prompt longer
than P) or that gets stuck keeps its row: its metrics and gaps are None (null in JSON)
and `row.refused` says why.

Given a `deadline` (the CLI's `--time-limit`), the whole comparison keeps to it: the
schedulers' simulations run under it (with `solve`, under `SCHEDULER_SHARE` of it), and a row
not simulated in time is kept, refused with "time limit"; the solve gets the rest. An
interrupt (Ctrl-C) ends the simulations at once (rows not finished: "interrupted"), and the
table of the rows finished is returned, its `status` "interrupted".
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .. import interrupt
from ..deadline import Deadline
from ..errors import InputError, SchedulerRefused, SchedulerStuck
from ..interrupt import Stopped
from ..io.schedules import schedule_from_json
from ..bounds.analytic import analytic_bounds
from ..schedule import Metrics, Schedule, Slo, validate
from ..schedulers import FAST_HEURISTICS, SCHEDULERS, get_scheduler, simulate
from ..solvers.driver import solve_with
from ..solvers.options import SolveOptions
from ..workload import Instance

#: the keys of one row of `kvbound compare --json` (a contract), in order
ROW_KEYS = ("scheduler", "total_latency", "mean_latency", "mean_ttft", "mean_tpot", "p99_ttft", "p99_tpot",
            "batches", "evictions", "recomputed_tokens", "peak_kv",
            # the papers' metrics (slo_attainment is null unless an SLO is given)
            "p50_ttft", "p95_ttft", "mean_tbt", "p99_tbt", "p50_normalized_latency", "p95_normalized_latency",
            "slo_attainment", "gap_to_bound", "gap_to_best")
METRIC_COLUMNS = ROW_KEYS[1:-2]
#: the keys of the whole `--json` object (a contract)
TABLE_KEYS = ("objective_name", "lower_bound", "bound_certified", "best_known", "rows", "status")
OPTIMAL = "optimal"  # the solver's row
#: the table's `status`: every row done; a row not simulated within the time limit; cut short by Ctrl-C
COMPLETE, TIME_LIMIT, INTERRUPTED = "complete", "time limit", "interrupted"
#: with `solve` and a deadline: the part of the time the schedulers' simulations may use (the solve
#: gets the rest, at least half; its own warm-start heuristics take up to half of that)
SCHEDULER_SHARE = 0.5


@dataclass
class ComparisonRow:
    scheduler: str
    metrics: Metrics | None  # None: the scheduler refused the case (see `refused`)
    schedule: Schedule | None = None
    refused: str | None = None  # why there is no schedule
    gap_to_bound: float | None = None
    gap_to_best: float | None = None
    status: str = ""  # the solver's status on the optimal row (optimal: proven; feasible: best found)

    @property
    def label(self) -> str:
        """The row's name for people: the optimal row says whether the solver proved it optimal."""
        if self.scheduler != OPTIMAL or not self.status or self.metrics is None:
            return self.scheduler
        return f"{OPTIMAL} ({'proven' if self.status == 'optimal' else 'best found, not proven'})"

    def value(self, objective: str) -> float | None:
        return None if self.metrics is None else float(getattr(self.metrics, objective))

    def to_json(self) -> dict:
        m = self.metrics.to_dict() if self.metrics is not None else {}
        out = {"scheduler": self.scheduler}
        out.update({k: m.get(k) for k in METRIC_COLUMNS})
        out["gap_to_bound"] = self.gap_to_bound
        out["gap_to_best"] = self.gap_to_best
        return out


@dataclass
class ComparisonTable:
    objective_name: str
    lower_bound: float | None  # best certified lower bound on the objective (None: none known)
    bound_certified: bool
    best_known: float | None  # best objective value of any row
    rows: list[ComparisonRow]
    bound_source: str = ""  # which bound `lower_bound` is
    solve_result: object | None = field(default=None, repr=False)  # kvbound.solvers.Result when solved
    status: str = COMPLETE  # COMPLETE, TIME_LIMIT (a row not simulated in time) or INTERRUPTED

    def row(self, scheduler: str) -> ComparisonRow:
        for r in self.rows:
            if r.scheduler == scheduler:
                return r
        raise KeyError(scheduler)

    def to_json(self) -> dict:
        return {"objective_name": self.objective_name, "lower_bound": self.lower_bound,
                "bound_certified": self.bound_certified, "best_known": self.best_known,
                "rows": [r.to_json() for r in self.rows], "status": self.status}

    # ------------------------------------------------------------------ text forms
    #: the text and markdown columns: metric key -> header (slo_attainment only where an SLO was given)
    _COLUMNS = {"total_latency": "total (s)", "mean_latency": "mean lat (s)", "mean_ttft": "mean TTFT (s)",
                "mean_tpot": "mean TPOT (s)", "p99_ttft": "p99 TTFT (s)", "p99_tpot": "p99 TPOT (s)",
                "batches": "batches", "evictions": "evictions", "recomputed_tokens": "recomputed", "peak_kv": "peak KV",
                "p50_ttft": "p50 TTFT (s)", "p95_ttft": "p95 TTFT (s)", "mean_tbt": "mean TBT (s)",
                "p99_tbt": "p99 TBT (s)", "p50_normalized_latency": "p50 lat/O (s)",
                "p95_normalized_latency": "p95 lat/O (s)", "slo_attainment": "SLO attained"}

    def _metric_keys(self) -> list[str]:
        with_slo = any(r.metrics is not None and r.metrics.slo_attainment is not None for r in self.rows)
        return [k for k in METRIC_COLUMNS if k != "slo_attainment" or with_slo]

    @property
    def _HEADERS(self) -> tuple[str, ...]:
        return ("scheduler", *(self._COLUMNS[k] for k in self._metric_keys()), "gap to bound", "gap to best")

    def _cells(self) -> list[list[str]]:
        out = []
        keys = self._metric_keys()
        for r in self.rows:
            name = r.label
            if r.metrics is None:
                out.append([name, f"refused: {r.refused}"] + [""] * (len(keys) + 1))
                continue
            d = r.metrics.to_dict()
            out.append([name] + [f"{d[k]:.6g}" if isinstance(d[k], float) else str(d[k]) for k in keys]
                       + [_pct(r.gap_to_bound), _pct(r.gap_to_best)])
        return out

    def _caption(self) -> str:
        bound = "none" if self.lower_bound is None else f"{self.lower_bound:.6g} s"
        cert = "certified" if self.bound_certified else "not certified"
        best = "none" if self.best_known is None else f"{self.best_known:.6g} s"
        src = f", {self.bound_source}" if self.bound_source else ""
        cut = {COMPLETE: "", TIME_LIMIT: "; time limit: rows not simulated in time say so",
               INTERRUPTED: "; interrupted: the rows finished before it, the others say so"}.get(self.status, "")
        return f"objective {self.objective_name}: lower bound {bound} ({cert}{src}); best known {best}{cut}"

    def to_text(self) -> str:
        cells = self._cells()
        # a refused row spans the columns with its reason: it sets no width (every row may be refused)
        widths = [max([len(h), *(len(c[k]) for c in cells if k == 0 or not c[1].startswith("refused"))])
                  for k, h in enumerate(self._HEADERS)]
        lines = [self._caption(), "  ".join(h.rjust(w) if k else h.ljust(w) for k, (h, w) in enumerate(zip(self._HEADERS, widths)))]
        for c in cells:
            if c[1].startswith("refused"):
                lines.append(f"{c[0].ljust(widths[0])}  {c[1]}")
            else:
                lines.append("  ".join(v.rjust(w) if k else v.ljust(w) for k, (v, w) in enumerate(zip(c, widths))))
        return "\n".join(lines)

    def to_markdown(self) -> str:
        lines = [f"*{self._caption()}; gaps = (value - reference) / value*", "",
                 "| " + " | ".join(self._HEADERS) + " |",
                 "|---|" + "---:|" * (len(self._HEADERS) - 1)]
        for c in self._cells():
            if c[1].startswith("refused"):
                c = [c[0], c[1]] + ["-"] * (len(c) - 2)
            name = f"**{c[0]}**" if c[0].startswith(OPTIMAL) else c[0]
            lines.append("| " + " | ".join([name] + c[1:]) + " |")
        return "\n".join(lines)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.2f}%"


def relative_gap(value: float, reference: float) -> float:
    """(value - reference) / value; float noise below 1e-9 is 0, a real negative gap (a bad bound) is kept."""
    if value <= 0:
        return 0.0
    gap = (value - reference) / value
    return 0.0 if -1e-9 < gap < 0 else gap


def resolve_schedulers(schedulers) -> list[str]:
    """"all" (or None) -> every scheduler; else a list, or a comma-separated string, of specs (checked)."""
    if schedulers is None or schedulers == "all":
        return list(SCHEDULERS)
    if isinstance(schedulers, str):
        schedulers = [s.strip() for s in schedulers.split(",") if s.strip()]
    names = list(dict.fromkeys(schedulers))
    if not names:
        raise InputError("", "schedulers", "no scheduler named; give all or a comma list")
    for spec in names:
        get_scheduler(spec)  # raises InputError naming the bad one
    return names


def compare(instance: Instance, schedulers="all", *, solve: bool = False, options: SolveOptions | None = None,
            deadline: Deadline | None = None, objective: str | None = None, time_limit: float | None = None,
            solver: str | None = None, formulation: str | None = None, slo: Slo | None = None) -> ComparisonTable:
    """One row per scheduler (plus `optimal` when `solve`), gaps to the best certified bound and best schedule.

    `options` say how to solve and which objective the gaps are on (default: `SolveOptions()`);
    `objective`, `time_limit`, `solver` and `formulation`, where given, replace single options.
    `deadline`, where given, bounds the whole comparison: the simulations (with `solve`, in
    `SCHEDULER_SHARE` of it; rows not simulated in time are refused with "time limit") and the
    solve (the rest). Without it the simulations are not limited and the solve gets the time limit
    from its start. `slo`, where given, adds every row's `slo_attainment`.
    """
    changes = {"objective": objective, "time_limit": time_limit, "backend": solver, "formulation": formulation}
    options = (options or SolveOptions()).but(**{k: v for k, v in changes.items() if v is not None})
    objective = options.objective.value
    names = resolve_schedulers(schedulers)
    # analytic bounds hold for every schedule (first: once an interrupt comes, only the output is left to
    # do); a solver bound only when its horizon is certified
    try:
        with (deadline or Deadline(None)).enforced():
            bounds = [(b.value, b.name) for b in analytic_bounds(instance, options.objective, deadline)
                      if b.certified and math.isfinite(b.value)]
    except Stopped:
        bounds = []
    if deadline is None:
        rows_deadline = Deadline(None)
    else:
        rows_deadline = deadline.share(SCHEDULER_SHARE) if solve else deadline
    rows, replay_seconds = _run_all(instance, names, slo, rows_deadline)
    result = None
    if solve and interrupt.requested() is not None:  # the solve would only stop at once
        rows.insert(0, ComparisonRow(OPTIMAL, None, refused=INTERRUPTED, status=INTERRUPTED))
    elif solve:
        # warm-start from the compared schedulers too (the best rows first), so the optimum row is never
        # worse than any of them where time allows; the replay of its schedule below is kept inside the limit
        done = sorted((r for r in rows if r.metrics is not None), key=lambda r: r.value(objective))
        warm = list(dict.fromkeys([*(r.scheduler for r in done), *FAST_HEURISTICS, *names]))
        solve_deadline = deadline.shifted(-replay_seconds) if deadline is not None else None
        result = solve_with(instance, options.but(warm_start=warm), solve_deadline)
        with interrupt.deferred():  # what the solve found is reported, whatever comes now
            if result.schedule is not None:
                replay = validate(instance, schedule_from_json(result.schedule.to_json()))
                best_row = ComparisonRow(OPTIMAL, replay.apply_slo(slo), result.schedule, status=result.status)
            else:
                best_row = ComparisonRow(OPTIMAL, None, refused=f"the solver found no schedule ({result.status})",
                                         status=result.status)
        rows.insert(0, best_row)  # the reference row first
        if result.bound_certified and result.lower_bound is not None and math.isfinite(result.lower_bound):
            bounds.append((float(result.lower_bound), f"{result.solver} {result.formulation} bound"))
    lower, source = max(bounds) if bounds else (None, "")
    values = [v for v in (r.value(objective) for r in rows) if v is not None]
    best = min(values) if values else None
    for r in rows:
        v = r.value(objective)
        if v is None:
            continue
        r.gap_to_bound = relative_gap(v, lower) if lower is not None else None
        r.gap_to_best = relative_gap(v, best)
    if interrupt.requested() is not None or any(r.refused == INTERRUPTED for r in rows):
        status = INTERRUPTED
    elif any(r.refused == TIME_LIMIT for r in rows):
        status = TIME_LIMIT
    else:
        status = COMPLETE
    return ComparisonTable(objective, lower, lower is not None, best, rows, source, result, status)


def _run_all(instance: Instance, names: list[str], slo: Slo | None, deadline: Deadline) -> tuple[list[ComparisonRow], float]:
    """The rows of `names`, each simulated while `deadline` (or an interrupt) allows; the others are
    kept, refused with why ("time limit" or "interrupted"). Also the longest replay's seconds (what
    the optimum row's replay will take, about)."""
    rows, stopped, replay_seconds = [], None, 0.0
    for name in names:
        if stopped is None:
            try:
                with deadline.enforced():
                    row, seconds = _run(instance, name, slo)
                rows.append(row)
                replay_seconds = max(replay_seconds, seconds)
                continue
            except Stopped as stop:
                stopped = INTERRUPTED if interrupt.requested() is not None else stop.reason
        rows.append(ComparisonRow(name, None, refused=stopped))
    return rows, replay_seconds


def _run(instance: Instance, spec: str, slo: Slo | None = None) -> tuple[ComparisonRow, float]:
    """The row of `spec`, and the seconds its simulation took (at least those of a replay of a schedule
    like it, which the optimum row's validation will take)."""
    began = time.perf_counter()
    try:
        sim = simulate(instance, get_scheduler(spec))
    except (SchedulerRefused, SchedulerStuck) as exc:
        return ComparisonRow(spec, None, refused=str(exc)), 0.0
    # the row is the validator's replay: the simulator applied every batch with it (SimulationResult)
    return ComparisonRow(spec, sim.replay.apply_slo(slo), sim.schedule), time.perf_counter() - began
