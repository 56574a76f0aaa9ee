"""A sweep's spec (TOML, docs/sweeps.md): the grid of case parameters or case files, the
schedulers, the objectives and whether to solve; expanded into points (one case and one
objective each), every point keyed by a hash of everything that determines its result.
"""
from __future__ import annotations

import ast
import glob
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ...costs import PRESETS
from ...costs.presets import DEFAULT_PRESET
from ...errors import InputError
from ...objective import OBJECTIVES
from ...backends import SOLVERS
from ...solvers.options import FORMULATIONS, SolveOptions
from ...io.cases import check_keys, load_case, read_toml
from ...workload import MAX_INT, MAX_REQUEST_TOKENS, MAX_REQUESTS, Instance, Request, SystemConfig
from ..compare import METRIC_COLUMNS, resolve_schedulers

# grid keys in the order the product runs over them (the first varies slowest)
CASE_KEYS = ("case", "prompt", "output", "requests")
SYSTEM_KEYS = ("kv_capacity", "max_batch_tokens", "max_prefill_tokens", "block_size")
GRID_KEYS = CASE_KEYS + SYSTEM_KEYS + ("preset", "rate")
#: expression names: what each grid key is called inside an expression (available once computed)
SYMBOLS = {"prompt": "I", "output": "O", "requests": "N", "kv_capacity": "M", "max_batch_tokens": "C",
           "max_prefill_tokens": "P", "block_size": "b"}
RUN_KEYS = {"schedulers", "objectives", "solve", "time_limit", "solver", "formulation", "slo"}
CLAIM_KEYS = {"text", "metric", "better", "than", "by", "higher", "where"}
PLOT_KEYS = {"x", "y", "objective", "schedulers", "logx", "logy", "title"}
#: the parameter columns of a point's result rows
PARAM_COLUMNS = ("case",) + GRID_KEYS[1:] + ("objective",)
#: a sweep has at most this many points (grid combinations x objectives), checked before any is made
MAX_POINTS = 100_000
#: ... and its points at most this many requests in all (each point holds its case in memory)
MAX_SWEEP_REQUESTS = 10 ** 7
#: run.time_limit, seconds per solve, when the spec names none (sweeps run many points: shorter than `kvbound solve`'s)
DEFAULT_TIME_LIMIT = 10.0
#: a sweep's solver when its spec names none: one backend per point (the points already use every
#: core; `auto`'s race would start a CP-SAT process beside each)
SWEEP_SOLVER = "highs"


@dataclass(frozen=True)
class PlotSpec:
    x: str
    y: tuple[str, ...]
    objective: str
    schedulers: tuple[str, ...] | None = None  # None: every series
    logx: bool = False
    logy: bool = False
    title: str = ""


@dataclass(frozen=True)
class ClaimSpec:
    """A paper's claim checked at every point it covers: `better`'s `metric` beats each of `than` by the
    factor `by` (lower is better: better * by <= other; with `higher`: better >= other * by)."""

    text: str
    metric: str
    better: str
    than: tuple[str, ...]
    by: float = 1.0
    higher: bool = False
    where: tuple[tuple[str, tuple], ...] = ()  # (grid key, allowed values): the points the claim covers

    def covers(self, params: dict) -> bool:
        return all(params.get(k) in values for k, values in self.where)


@dataclass
class SweepSpec:
    name: str
    source: str
    grid: dict[str, list]  # grid key -> values (numbers, expressions, presets or case paths)
    schedulers: list[str]
    objectives: list[str]
    solve: bool = False
    time_limit: float = DEFAULT_TIME_LIMIT
    solver: str = SWEEP_SOLVER
    formulation: str = SolveOptions.formulation
    plots: list[PlotSpec] = field(default_factory=list)
    description: str = ""
    slo: str | None = None  # "ttft=S,tbt=S": every row gets slo_attainment
    claims: list[ClaimSpec] = field(default_factory=list)

    def points(self) -> list["Point"]:
        """Every (case, objective) point, in grid order."""
        keys = [k for k in GRID_KEYS if k in self.grid]
        cases: dict[str, Instance] = {}  # each case file is read once, whatever else varies
        for case in self.grid.get("case", []):
            cases.setdefault(case, load_case(case))
        requests = 0  # first only counted: a grid too large is refused before any of its cases is made
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            values = dict(zip(keys, combo))
            requests += self._requests(values, cases.get(values.get("case"))) * len(self.objectives)
            if requests > MAX_SWEEP_REQUESTS:
                raise InputError(self.source, "grid", f"the points hold more than {MAX_SWEEP_REQUESTS:,} requests in "
                                                      "all; split the sweep or make its cases smaller")
        out = []
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            values = dict(zip(keys, combo))
            params, instance = self._instance(values, cases.get(values.get("case")))
            for objective in self.objectives:
                run = {"objective": objective, "schedulers": self.schedulers, "solve": self.solve}
                if self.slo:
                    run["slo"] = self.slo
                if self.solve:
                    run.update(time_limit=self.time_limit, solver=self.solver, formulation=self.formulation)
                out.append(Point(point_key(instance, run), {**params, "objective": objective}, instance, run,
                                 self.solve_options(objective)))
        return out

    def solve_options(self, objective: str) -> SolveOptions:
        """How `compare()` solves a point of `objective` (when `solve`)."""
        return SolveOptions(objective, backend=self.solver, formulation=self.formulation, time_limit=self.time_limit)

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
        rate = values.get("rate")
        params["rate"] = "" if rate is None else rate
        if rate is not None:  # the rate factor: every arrival time divided by it
            requests = tuple(Request(r.prompt, r.output, r.arrival / rate) for r in requests)
        name = params["case"]
        try:
            return params, Instance(tuple(requests), SystemConfig(**system), cost, name, source=f"{self.source}: {name}")
        except InputError as exc:  # e.g. a grid point whose M cannot hold a request
            raise InputError(self.source, "grid", f"point {_describe(params)}: {exc.field}: {exc.problem}") from None

    def _requests(self, values: dict, base: Instance | None) -> int:
        """How many requests the case of one grid combination has (without making it)."""
        if base is not None:
            return len(base)
        names: dict[str, float] = {}
        for key in ("prompt", "output", "requests"):
            names[SYMBOLS[key]] = self._value(key, values[key], names)
        return int(names["N"])

    def _value(self, key: str, value, names: dict) -> int:
        if isinstance(value, str):
            value = evaluate(value, names, self.source, f"grid.{key}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(self.source, f"grid.{key}", f"must be an integer >= 1, got {value!r}")
        most = GRID_LIMITS.get(key, MAX_INT)
        if value > most:  # refused before a case of that size is made
            raise InputError(self.source, f"grid.{key}", f"must be <= {most:,}, got {value:,}")
        return value


def _describe(params: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in params.items() if v != "")


@dataclass
class Point:
    key: str
    params: dict  # the parameter columns of its rows
    instance: Instance
    run: dict  # objective, schedulers and solver settings: what the key hashes
    options: SolveOptions  # the same solver settings, as compare() takes them


def point_key(instance: Instance, run: dict) -> str:
    """A stable hash of everything that determines a point's rows: the case's content and the run settings.

    Case files enter by content (requests, system, costs), not by path, so editing a case
    reruns its points and moving it does not.
    """
    s = instance.system
    data = {
        "requests": [[r.prompt, r.output, r.arrival] for r in instance.requests],
        "system": [s.kv_capacity, s.max_batch_tokens, s.max_prefill_tokens, s.block_size],
        "cost": [float(v) for v in instance.cost.coefficients] + _kinks(instance.cost),
        "run": run,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _kinks(cost) -> list:
    """The convex token term, when there is one (without it a point keeps the key it always had)."""
    return [list(cost.token_knees), list(cost.per_token_above)] if cost.token_knees else []


def load_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    return parse_spec(read_toml(path), str(path), path.parent)


def parse_spec(data: dict, source: str = "<spec>", base_dir: Path = Path(".")) -> SweepSpec:
    check_keys(source, "", data, {"name", "description", "grid", "run", "plot", "claim"})
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise InputError(source, key, f"must be a string, got {data[key]!r}")
    if "grid" not in data:
        raise InputError(source, "grid", "missing section [grid]")
    grid_table = data["grid"]
    check_keys(source, "grid", grid_table, set(GRID_KEYS))
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
            elif key == "rate":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                    raise InputError(source, "grid.rate", f"must be a finite number > 0 (the factor arrival rates are "
                                                          f"multiplied by), got {v!r}")
            elif key != "case" and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
                raise InputError(source, f"grid.{key}", f"must be a number or an expression string, got {v!r}")
    run = data.get("run", {})
    check_keys(source, "run", run, RUN_KEYS)
    try:
        schedulers = resolve_schedulers(run.get("schedulers", "all"))
    except InputError as exc:
        # run.schedulers is the field; a scheduler's own error keeps the name of the scheduler it is about
        detail = exc.problem if exc.field in ("", "schedulers") else f"{exc.field}: {exc.problem}"
        raise InputError(source, "run.schedulers", detail) from None
    objectives = run.get("objectives", ["total_latency"])
    objectives = [objectives] if isinstance(objectives, str) else objectives
    if not isinstance(objectives, list) or not objectives or any(o not in OBJECTIVES for o in objectives):
        raise InputError(source, "run.objectives", f"must list objectives from {', '.join(OBJECTIVES)}, got {objectives!r}")
    solve = run.get("solve", False)
    if not isinstance(solve, bool):
        raise InputError(source, "run.solve", f"must be true or false, got {solve!r}")
    time_limit = run.get("time_limit", DEFAULT_TIME_LIMIT)
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not (math.isfinite(time_limit) and time_limit > 0):
        raise InputError(source, "run.time_limit", f"must be a finite number of seconds > 0, got {time_limit!r}")
    solver = run.get("solver", SWEEP_SOLVER)
    if solver not in SOLVERS:
        raise InputError(source, "run.solver", f"unknown solver {solver!r}; choose from {', '.join(SOLVERS)}")
    formulation = run.get("formulation", SolveOptions.formulation)
    if formulation not in FORMULATIONS:
        raise InputError(source, "run.formulation", f"unknown formulation {formulation!r}; choose from {', '.join(FORMULATIONS)}")
    points = math.prod(len(values) for values in grid.values()) * len(objectives)
    if points > MAX_POINTS:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in grid.items() if len(v) > 1) or "1"
        raise InputError(source, "grid", f"{points:,} points ({sizes} x {len(objectives)} objectives); a sweep "
                                         f"has at most {MAX_POINTS:,}: split it into smaller sweeps")
    slo = run.get("slo")
    if slo is not None:
        from ...schedule import Slo

        if not isinstance(slo, str):
            raise InputError(source, "run.slo", f"must be a string like \"ttft=1,tbt=1\", got {slo!r}")
        slo = str(Slo.parse(slo, source, "run.slo"))
    spec = SweepSpec(data.get("name", Path(source).stem), source, grid, schedulers, list(objectives), solve,
                     float(time_limit), solver, formulation, description=data.get("description", ""), slo=slo)
    spec.plots = _plots(source, data.get("plot", []), spec)
    spec.claims = _claims(source, data.get("claim", []), spec)
    return spec


def _tables(source: str, key: str, entries) -> list:
    """`[key]` (one table) or `[[key]]` (an array of tables) as a list of tables."""
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list):
        raise InputError(source, key, f"must be an array of tables ([[{key}]])")
    return entries


def _claims(source: str, entries, spec: SweepSpec) -> list[ClaimSpec]:
    entries = _tables(source, "claim", entries)
    claims = []
    for k, entry in enumerate(entries):
        where = f"claim[{k}]"
        check_keys(source, where, entry, CLAIM_KEYS)
        for key in ("text", "metric", "better", "than"):
            if key not in entry:
                raise InputError(source, f"{where}.{key}", "missing")
        if not isinstance(entry["text"], str):
            raise InputError(source, f"{where}.text", "must be a string")
        if entry["metric"] not in METRIC_COLUMNS:
            raise InputError(source, f"{where}.metric", f"must be one of {', '.join(METRIC_COLUMNS)}, got {entry['metric']!r}")
        than = entry["than"] if isinstance(entry["than"], list) else [entry["than"]]
        for key, names in (("better", [entry["better"]]), ("than", than)):
            if not names or any(n not in spec.schedulers for n in names):
                raise InputError(source, f"{where}.{key}", f"must name schedulers of run.schedulers, got {entry[key]!r}")
        by = entry.get("by", 1.0)
        if isinstance(by, bool) or not isinstance(by, (int, float)) or not (math.isfinite(by) and by > 0):
            raise InputError(source, f"{where}.by", f"must be a finite number > 0, got {by!r}")
        if not isinstance(entry.get("higher", False), bool):
            raise InputError(source, f"{where}.higher", "must be true or false")
        limits = entry.get("where", {})
        if not isinstance(limits, dict) or any(g not in spec.grid for g in limits):
            raise InputError(source, f"{where}.where", f"must be a table of [grid] keys ({', '.join(spec.grid)}) to "
                                                      f"lists of their values, got {limits!r}")
        covered = tuple((g, tuple(v if isinstance(v, list) else [v])) for g, v in limits.items())
        claims.append(ClaimSpec(entry["text"], entry["metric"], entry["better"], tuple(than), float(by),
                                entry.get("higher", False), covered))
    return claims


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
    entries = _tables(source, "plot", entries)
    varying = [k for k in GRID_KEYS if len(spec.grid.get(k, ())) > 1]
    if not entries:  # default: each objective over the first grid key with several values
        x = varying[0] if varying else ("case" if "case" in spec.grid else "prompt")
        return [PlotSpec(x, (o, "gap_to_best"), o, logx=_is_doubling(spec.grid.get(x, [])))
                for o in spec.objectives]
    plots = []
    y_allowed = set(METRIC_COLUMNS) | {"gap_to_bound", "gap_to_best"}
    for k, entry in enumerate(entries):
        where = f"plot[{k}]"
        check_keys(source, where, entry, PLOT_KEYS)
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


#: the largest value a grid key may take (integers: below 2^53)
GRID_LIMITS = {"prompt": MAX_REQUEST_TOKENS, "output": MAX_REQUEST_TOKENS, "requests": MAX_REQUESTS}
#: an expression's numbers (every intermediate result) stay within this magnitude, so that `9**9**9**9`
#: is refused at once instead of being computed
MAX_EXPRESSION = 2.0 ** 63
MAX_EXPRESSION_LENGTH = 200


def _power(a, b):
    if a not in (0, 1, -1) and (abs(b) > 64 or abs(b) * math.log2(abs(a)) > 63):
        raise OverflowError(f"{a!r} ** {b!r} is too large")
    return a ** b


_FUNCS = {"max": max, "min": min, "ceil": math.ceil, "floor": math.floor}
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: _power}


def evaluate(expr: str, names: dict, source: str = "", where: str = "") -> float:
    """An arithmetic expression over the grid symbols, e.g. "max(2*I, I + O - 1)"; nothing else is evaluated."""
    def ev(node):
        value = _ev(node)
        if isinstance(value, complex) or not math.isfinite(value) or abs(value) > MAX_EXPRESSION:
            raise OverflowError(f"a value beyond {MAX_EXPRESSION:g}")
        return value

    def _ev(node):
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
    if len(expr) > MAX_EXPRESSION_LENGTH:
        raise InputError(source, where, f"expression of {len(expr)} characters; at most {MAX_EXPRESSION_LENGTH}")
    try:
        return ev(ast.parse(expr, mode="eval"))
    except SyntaxError:
        raise InputError(source, where, f"{expr!r} is not an expression") from None
    except (ZeroDivisionError, OverflowError, TypeError, ValueError, RecursionError) as exc:
        raise InputError(source, where, f"{expr!r}: {exc}") from None
