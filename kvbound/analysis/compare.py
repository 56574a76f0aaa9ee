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
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..deadline import Deadline
from ..errors import InputError, SchedulerRefused, SchedulerStuck
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
TABLE_KEYS = ("objective_name", "lower_bound", "bound_certified", "best_known", "rows")
OPTIMAL = "optimal"  # the solver's row


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
        if self.scheduler != OPTIMAL or not self.status:
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

    def row(self, scheduler: str) -> ComparisonRow:
        for r in self.rows:
            if r.scheduler == scheduler:
                return r
        raise KeyError(scheduler)

    def to_json(self) -> dict:
        return {"objective_name": self.objective_name, "lower_bound": self.lower_bound,
                "bound_certified": self.bound_certified, "best_known": self.best_known,
                "rows": [r.to_json() for r in self.rows]}

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
        return f"objective {self.objective_name}: lower bound {bound} ({cert}{src}); best known {best}"

    def to_text(self) -> str:
        cells = self._cells()
        widths = [max(len(h), *(len(c[k]) for c in cells if not c[k].startswith("refused"))) if cells else len(h)
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
    `deadline` (default: the time limit from the start of the solve) bounds the solve.
    `slo`, where given, adds every row's `slo_attainment`.
    """
    changes = {"objective": objective, "time_limit": time_limit, "backend": solver, "formulation": formulation}
    options = (options or SolveOptions()).but(**{k: v for k, v in changes.items() if v is not None})
    objective = options.objective.value
    names = resolve_schedulers(schedulers)
    rows = [_run(instance, name, slo) for name in names]
    # analytic bounds hold for every schedule; a solver bound only when its horizon is certified
    bounds = [(b.value, b.name) for b in analytic_bounds(instance, options.objective) if b.certified and math.isfinite(b.value)]
    result = None
    if solve:
        # warm-start from the compared schedulers too, so the optimum row is never worse than any of them
        warm = list(dict.fromkeys([*FAST_HEURISTICS, *names]))
        result = solve_with(instance, options.but(warm_start=warm), deadline)
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
    return ComparisonTable(objective, lower, lower is not None, best, rows, source, result)


def _run(instance: Instance, spec: str, slo: Slo | None = None) -> ComparisonRow:
    try:
        sim = simulate(instance, get_scheduler(spec))
    except (SchedulerRefused, SchedulerStuck) as exc:
        return ComparisonRow(spec, None, refused=str(exc))
    # the table reports the validator's replay of the schedule's JSON form, not the simulator's own numbers
    replay = validate(instance, schedule_from_json(sim.schedule.to_json()))
    return ComparisonRow(spec, replay.apply_slo(slo), sim.schedule)
