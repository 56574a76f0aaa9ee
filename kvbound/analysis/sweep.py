"""Sweeps: a grid of cases x objectives, each point compared (and optionally solved), resumable.

A spec (TOML, docs/sweeps.md) names a grid of case parameters or case files, the schedulers,
the objectives and whether to solve. Every point (one case and one objective) runs
`compare()` in a worker: a local process pool, or Ray tasks on a cluster. The parent appends
each finished point's rows to DIR/results.csv in one write followed by fsync, so an
interrupted sweep loses at most the points still running; every row carries the point's key
(a hash of everything that determines its result) and how many rows the point has, so a
re-run skips complete points and redoes a point whose rows were cut short.
"""
from __future__ import annotations

import ast
import csv
import glob
import hashlib
import io
import itertools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..costs import PRESETS
from ..costs.presets import DEFAULT_PRESET
from ..errors import InputError
from ..objective import OBJECTIVES
from ..workload import Instance, Request, SystemConfig, _check_keys, load_case, read_toml
from .compare import METRIC_COLUMNS, compare, resolve_schedulers

# grid keys in the order the product runs over them (the first varies slowest)
CASE_KEYS = ("case", "prompt", "output", "requests")
SYSTEM_KEYS = ("kv_capacity", "max_batch_tokens", "max_prefill_tokens", "block_size")
GRID_KEYS = CASE_KEYS + SYSTEM_KEYS + ("preset",)
#: expression names: what each grid key is called inside an expression (available once computed)
SYMBOLS = {"prompt": "I", "output": "O", "requests": "N", "kv_capacity": "M", "max_batch_tokens": "C",
           "max_prefill_tokens": "P", "block_size": "b"}
RUN_KEYS = {"schedulers", "objectives", "solve", "time_limit", "solver", "formulation"}
PLOT_KEYS = {"x", "y", "objective", "schedulers", "logx", "logy", "title"}
PARAM_COLUMNS = ("case",) + GRID_KEYS[1:] + ("objective",)
COLUMNS = (("point", "point_rows") + PARAM_COLUMNS + ("scheduler", "status", "note") + METRIC_COLUMNS
           + ("gap_to_bound", "gap_to_best", "lower_bound", "bound_certified", "best_known", "point_seconds"))
NUMERIC_COLUMNS = set(METRIC_COLUMNS) | {"gap_to_bound", "gap_to_best", "lower_bound", "best_known", "point_seconds",
                                         "prompt", "output", "requests", "kv_capacity", "max_batch_tokens",
                                         "max_prefill_tokens", "block_size"}


# --------------------------------------------------------------------------- the spec

@dataclass(frozen=True)
class PlotSpec:
    x: str
    y: tuple[str, ...]
    objective: str
    schedulers: tuple[str, ...] | None = None  # None: every series
    logx: bool = False
    logy: bool = False
    title: str = ""


@dataclass
class SweepSpec:
    name: str
    source: str
    grid: dict[str, list]  # grid key -> values (numbers, expressions, presets or case paths)
    schedulers: list[str]
    objectives: list[str]
    solve: bool = False
    time_limit: float = 10.0
    solver: str = "highs"
    formulation: str = "auto"
    plots: list[PlotSpec] = field(default_factory=list)
    description: str = ""

    def points(self) -> list["Point"]:
        """Every (case, objective) point, in grid order."""
        keys = [k for k in GRID_KEYS if k in self.grid]
        cases: dict[str, Instance] = {}  # each case file is read once, whatever else varies
        out = []
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            values = dict(zip(keys, combo))
            if "case" in values and values["case"] not in cases:
                cases[values["case"]] = load_case(values["case"])
            params, instance = self._instance(values, cases.get(values.get("case")))
            for objective in self.objectives:
                run = {"objective": objective, "schedulers": self.schedulers, "solve": self.solve}
                if self.solve:
                    run.update(time_limit=self.time_limit, solver=self.solver, formulation=self.formulation)
                out.append(Point(point_key(instance, run), {**params, "objective": objective}, instance, run))
        return out

    def _instance(self, values: dict, base: Instance | None) -> tuple[dict, Instance]:
        """The case of one grid combination (`base`: its case file, if any) and its parameter columns."""
        names: dict[str, float] = {}
        params = dict.fromkeys(PARAM_COLUMNS[:-1], "")
        if base is not None:
            params["case"] = base.name or Path(values["case"]).stem
            params["requests"] = names["N"] = len(base)
        else:
            for key in ("prompt", "output", "requests"):
                params[key] = names[SYMBOLS[key]] = self._value(key, values[key], names)
            params["case"] = f"I{params['prompt']}_O{params['output']}_N{params['requests']}"
        system = {}
        for key in SYSTEM_KEYS:
            if key in values:
                system[key] = self._value(key, values[key], names)
            elif base is not None:
                system[key] = getattr(base.system, key)
            elif key == "max_prefill_tokens":
                system[key] = system["max_batch_tokens"]
            else:  # block_size (M and C are required without case files)
                system[key] = 1
            names[SYMBOLS[key]] = system[key]
            params[key] = system[key]
        preset = values.get("preset")
        params["preset"] = preset or ""
        cost = PRESETS[preset] if preset else base.cost
        requests = base.requests if base is not None else (Request(params["prompt"], params["output"]),) * params["requests"]
        name = params["case"]
        try:
            return params, Instance(tuple(requests), SystemConfig(**system), cost, name, source=f"{self.source}: {name}")
        except InputError as exc:  # e.g. a grid point whose M cannot hold a request
            raise InputError(self.source, "grid", f"point {_describe(params)}: {exc.field}: {exc.problem}") from None

    def _value(self, key: str, value, names: dict) -> int:
        if isinstance(value, str):
            value = evaluate(value, names, self.source, f"grid.{key}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(self.source, f"grid.{key}", f"must be an integer >= 1, got {value!r}")
        return value


def _describe(params: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in params.items() if v != "")


@dataclass
class Point:
    key: str
    params: dict  # the parameter columns of its rows
    instance: Instance
    run: dict  # objective, schedulers and solver settings


def point_key(instance: Instance, run: dict) -> str:
    """A stable hash of everything that determines a point's rows: the case's content and the run settings.

    Case files enter by content (requests, system, costs), not by path, so editing a case
    reruns its points and moving it does not.
    """
    s = instance.system
    data = {
        "requests": [[r.prompt, r.output, r.arrival] for r in instance.requests],
        "system": [s.kv_capacity, s.max_batch_tokens, s.max_prefill_tokens, s.block_size],
        "cost": [float(v) for v in instance.cost.coefficients],
        "run": run,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def load_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    return parse_spec(read_toml(path), str(path), path.parent)


def parse_spec(data: dict, source: str = "<spec>", base_dir: Path = Path(".")) -> SweepSpec:
    _check_keys(source, "", data, {"name", "description", "grid", "run", "plot"})
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise InputError(source, key, f"must be a string, got {data[key]!r}")
    if "grid" not in data:
        raise InputError(source, "grid", "missing section [grid]")
    grid_table = data["grid"]
    _check_keys(source, "grid", grid_table, set(GRID_KEYS))
    grid = {k: (v if isinstance(v, list) else [v]) for k, v in grid_table.items()}
    for key, values in grid.items():
        if not values:
            raise InputError(source, f"grid.{key}", "an empty list gives no points")
    if "case" in grid:
        clash = [k for k in ("prompt", "output", "requests") if k in grid]
        if clash:
            raise InputError(source, f"grid.{clash[0]}", "give either case files (grid.case) or prompt/output/requests")
        grid["case"] = _case_files(source, grid["case"], base_dir)
    else:
        for key in ("prompt", "output", "requests", "kv_capacity", "max_batch_tokens"):
            if key not in grid:
                raise InputError(source, f"grid.{key}", "missing (or give case files in grid.case)")
        grid.setdefault("preset", [DEFAULT_PRESET])
    for key, values in grid.items():
        for v in values:
            if key == "preset":
                if v not in PRESETS:
                    raise InputError(source, "grid.preset", f"unknown preset {v!r}; known: {', '.join(PRESETS)}")
            elif key != "case" and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
                raise InputError(source, f"grid.{key}", f"must be a number or an expression string, got {v!r}")
    run = data.get("run", {})
    _check_keys(source, "run", run, RUN_KEYS)
    try:
        schedulers = resolve_schedulers(run.get("schedulers", "all"))
    except InputError as exc:
        raise InputError(source, "run.schedulers", f"{exc.field}: {exc.problem}" if exc.field else exc.problem) from None
    objectives = run.get("objectives", ["total_latency"])
    objectives = [objectives] if isinstance(objectives, str) else objectives
    if not isinstance(objectives, list) or not objectives or any(o not in OBJECTIVES for o in objectives):
        raise InputError(source, "run.objectives", f"must list objectives from {', '.join(OBJECTIVES)}, got {objectives!r}")
    solve = run.get("solve", False)
    if not isinstance(solve, bool):
        raise InputError(source, "run.solve", f"must be true or false, got {solve!r}")
    time_limit = run.get("time_limit", 10.0)
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not (math.isfinite(time_limit) and time_limit > 0):
        raise InputError(source, "run.time_limit", f"must be a finite number of seconds > 0, got {time_limit!r}")
    from ..solvers.api import FORMULATIONS
    from ..solvers.backends import BACKENDS

    solver = run.get("solver", "highs")
    if solver not in BACKENDS:
        raise InputError(source, "run.solver", f"unknown solver {solver!r}; choose from {', '.join(BACKENDS)}")
    formulation = run.get("formulation", "auto")
    if formulation not in FORMULATIONS:
        raise InputError(source, "run.formulation", f"unknown formulation {formulation!r}; choose from {', '.join(FORMULATIONS)}")
    spec = SweepSpec(data.get("name", Path(source).stem), source, grid, schedulers, list(objectives), solve,
                     float(time_limit), solver, formulation, description=data.get("description", ""))
    spec.plots = _plots(source, data.get("plot", []), spec)
    return spec


def _case_files(source: str, patterns: list, base_dir: Path) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise InputError(source, "grid.case", f"must be paths or glob patterns, got {pattern!r}")
        full = pattern if Path(pattern).is_absolute() else str(base_dir / pattern)
        matches = sorted(glob.glob(full))
        if not matches:
            raise InputError(source, "grid.case", f"{pattern!r} matches no file (relative to {base_dir})")
        files.extend(m for m in matches if m not in files)
    return files


def _plots(source: str, entries, spec: SweepSpec) -> list[PlotSpec]:
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list):
        raise InputError(source, "plot", "must be an array of tables ([[plot]])")
    varying = [k for k in GRID_KEYS if len(spec.grid.get(k, ())) > 1]
    if not entries:  # default: each objective over the first grid key with several values
        x = varying[0] if varying else ("case" if "case" in spec.grid else "prompt")
        return [PlotSpec(x, (o, "gap_to_best"), o, logx=_is_doubling(spec.grid.get(x, [])))
                for o in spec.objectives]
    plots = []
    y_allowed = set(METRIC_COLUMNS) | {"gap_to_bound", "gap_to_best"}
    for k, entry in enumerate(entries):
        where = f"plot[{k}]"
        _check_keys(source, where, entry, PLOT_KEYS)
        x = entry.get("x")
        if x not in GRID_KEYS or x not in spec.grid:
            raise InputError(source, f"{where}.x", f"must be a key of [grid] ({', '.join(spec.grid)}), got {x!r}")
        y = entry.get("y", [spec.objectives[0]])
        y = [y] if isinstance(y, str) else y
        if not isinstance(y, list) or not y or any(v not in y_allowed for v in y):
            raise InputError(source, f"{where}.y", f"must name columns from {', '.join(sorted(y_allowed))}, got {y!r}")
        objective = entry.get("objective", spec.objectives[0])
        if objective not in spec.objectives:
            raise InputError(source, f"{where}.objective", f"must be one of run.objectives {spec.objectives}, got {objective!r}")
        schedulers = entry.get("schedulers")
        if schedulers is not None:
            known = set(spec.schedulers) | {"optimal"}
            if not isinstance(schedulers, list) or any(s not in known for s in schedulers):
                raise InputError(source, f"{where}.schedulers", f"must list names from run.schedulers (or optimal), got {schedulers!r}")
            schedulers = tuple(schedulers)
        for flag in ("logx", "logy"):
            if not isinstance(entry.get(flag, False), bool):
                raise InputError(source, f"{where}.{flag}", "must be true or false")
        title = entry.get("title", "")
        if not isinstance(title, str):
            raise InputError(source, f"{where}.title", "must be a string")
        plots.append(PlotSpec(x, tuple(y), objective, schedulers, entry.get("logx", False), entry.get("logy", False), title))
    return plots


def _is_doubling(values) -> bool:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]
    return len(nums) >= 3 and len(nums) == len(values) and max(nums) / min(nums) >= 16


_FUNCS = {"max": max, "min": min, "ceil": math.ceil, "floor": math.floor}
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b}


def evaluate(expr: str, names: dict, source: str = "", where: str = "") -> float:
    """An arithmetic expression over the grid symbols, e.g. "max(2*I, I + O - 1)"; nothing else is evaluated."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise InputError(source, where, f"{expr!r}: unknown name {node.id!r}; available here: "
                                 f"{', '.join(names) or 'none'}")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
            return _FUNCS[node.func.id](*(ev(a) for a in node.args))
        raise InputError(source, where, f"{expr!r}: only numbers, {', '.join(SYMBOLS.values())}, + - * / // ** "
                         f"and {', '.join(_FUNCS)}() are allowed")
    try:
        return ev(ast.parse(expr, mode="eval"))
    except SyntaxError:
        raise InputError(source, where, f"{expr!r} is not an expression") from None
    except (ZeroDivisionError, OverflowError, TypeError, ValueError) as exc:
        raise InputError(source, where, f"{expr!r}: {exc}") from None


# --------------------------------------------------------------------------- one point

def evaluate_point(point: Point) -> list[dict]:
    """The rows of one point: compare() on its case, flattened into result-table rows. Runs in a worker."""
    t0 = time.perf_counter()
    run = point.run
    table = compare(point.instance, run["schedulers"], solve=run["solve"], objective=run["objective"],
                    time_limit=run.get("time_limit", 10.0), solver=run.get("solver", "highs"),
                    formulation=run.get("formulation", "auto"))
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


# --------------------------------------------------------------------------- the results table

class ResultsTable:
    """DIR/results.csv: appended one whole point at a time (one write, then fsync), read back tolerantly."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: list[dict] = []
        self.dropped = 0  # rows of a point that was cut short, removed on load
        if path.exists():
            self._load()

    @property
    def done(self) -> set[str]:
        return {r["point"] for r in self.rows}

    def _load(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is not None and tuple(reader.fieldnames) != COLUMNS:
            raise InputError(str(self.path), "header", "not a results table of this kvbound version "
                             "(other columns); use another --out folder")
        rows = list(reader)
        torn = bool(text) and not text.endswith("\n")  # the last line was cut mid-write
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["point"]] = counts.get(r["point"], 0) + 1
        bad = {r["point"] for r in rows if not r["point_rows"].isdigit() or counts[r["point"]] != int(r["point_rows"])}
        if torn and rows:
            bad.add(rows[-1]["point"])
        self.rows = [r for r in rows if r["point"] not in bad]
        self.dropped = len(rows) - len(self.rows)
        if self.dropped or torn:  # rewrite without the partial point, atomically
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(_csv_text(self.rows, header=True), encoding="utf-8")
            tmp.replace(self.path)

    def append(self, rows: list[dict]) -> None:
        new = not self.path.exists() or self.path.stat().st_size == 0
        data = _csv_text(rows, header=new).encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)  # one write: a killed process leaves whole points, at most a torn last line
            os.fsync(fd)
        finally:
            os.close(fd)
        self.rows.extend({k: _cell(row.get(k)) for k in COLUMNS} for row in rows)


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


def _csv_text(rows: list[dict], header: bool) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_cell(row.get(k)) for k in COLUMNS])
    return buf.getvalue()


def read_results(path: str | Path) -> list[dict]:
    """The rows of a results.csv with numbers parsed (empty cells are None)."""
    return [_typed(r) for r in ResultsTable(Path(path)).rows]


def _typed(row: dict) -> dict:
    out = dict(row)
    for k in NUMERIC_COLUMNS:
        v = row.get(k, "")
        out[k] = None if v == "" else (int(v) if v.lstrip("-").isdigit() else float(v))
    out["bound_certified"] = row.get("bound_certified") == "true"
    return out


# --------------------------------------------------------------------------- running

@dataclass
class SweepResult:
    spec: SweepSpec
    out_dir: Path
    rows: list[dict]  # every row of the spec's points, in grid order, numbers parsed
    ran: int  # points computed in this run
    skipped: int  # points found complete in results.csv
    seconds: float
    plots: list[Path] = field(default_factory=list)


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, backend: str = "local", workers: int | None = None,
              address: str | None = None, progress: bool | None = None, plots: bool = True) -> SweepResult:
    """Run the points of `spec` not yet in out_dir/results.csv, then write the summary and plots.

    backend "local": a process pool of `workers` (default: the CPU count; 1 runs in this
    process). backend "ray": one Ray task per point, on the cluster at `address` or on a
    local Ray instance with `workers` CPUs. `progress` None shows the bar on a terminal only.
    """
    from tqdm import tqdm

    if backend not in ("local", "ray"):
        raise InputError("--backend", backend, "must be local or ray")
    if workers is not None and workers < 1:
        raise InputError("--workers", str(workers), "must be >= 1")
    t0 = time.perf_counter()
    points = spec.points()  # every bad grid value is reported before anything is written
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = ResultsTable(out_dir / "results.csv")
    done = table.done
    todo = [p for p in points if p.key not in done]
    runner = _run_ray(todo, workers, address) if backend == "ray" else _run_local(todo, workers)
    with tqdm(total=len(points), initial=len(points) - len(todo), unit="point", desc=spec.name,
              disable=not progress if progress is not None else None) as bar:
        for rows in runner:
            table.append(rows)
            bar.update()
    by_key: dict[str, list[dict]] = {}
    for r in table.rows:
        by_key.setdefault(r["point"], []).append(r)
    rows = [_typed(r) for p in points for r in by_key.get(p.key, [])]
    result = SweepResult(spec, out_dir, rows, len(todo), len(points) - len(todo), time.perf_counter() - t0)
    if plots:
        result.plots = write_report(result)
    return result


def _run_local(points: list[Point], workers: int | None):
    if not points:
        return
    workers = min(workers or os.cpu_count() or 1, len(points))
    if workers == 1:  # no pool: cheaper, and a debugger or profiler sees the work
        for p in points:
            yield evaluate_point(p)
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=workers)
    try:
        futures = [pool.submit(evaluate_point, p) for p in points]
        for future in as_completed(futures):
            yield future.result()
    except BaseException:
        # Ctrl-C, an error, or the caller stopped: finished points are already written. Do not wait
        # for the running ones (a solver in native code can take minutes to notice a signal).
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _run_ray(points: list[Point], workers: int | None, address: str | None):
    if not points:
        return
    try:
        import ray
    except ImportError:
        raise InputError("--backend", "ray", "needs Ray: pip install 'kvbound[distributed]'") from None
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(evaluate_point)
        # points travel with their Instance, so worker nodes need kvbound installed but not the case files
        pending = [task.remote(p) for p in points]
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                yield ray.get(ready[0])
        except BaseException:
            for ref in pending:  # on a shared cluster, do not leave the rest of the sweep running
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()


# --------------------------------------------------------------------------- summary and plots

def write_report(result: SweepResult) -> list[Path]:
    """DIR/summary.md (one pivot table per plotted column) and one PNG per [[plot]] entry."""
    from .plot import plot_sweep

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
        name = f"plot_{k + 1}_{plot.objective}_vs_{plot.x}.png"
        plot_sweep(rows, plot, facets, out_dir / name,
                   title=plot.title or f"{spec.name}: {plot.objective.replace('_', ' ')} objective")
        paths.append(out_dir / name)
        lines += [f"![{plot.title or name}]({name})", ""]
        for y in plot.y:
            lines += [f"## {y} vs {plot.x} (objective {plot.objective})", "",
                      pivot_markdown(rows, plot.x, y, facets, plot.schedulers), ""]
    summary = out_dir / "summary.md"
    tmp = summary.with_name(summary.name + ".tmp")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    tmp.replace(summary)
    return paths


def series_order(rows: list[dict], only=None) -> list[str]:
    names = list(dict.fromkeys(r["scheduler"] for r in rows))
    names.sort(key=lambda s: s != "optimal")
    return [s for s in names if only is None or s in only]


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
