"""The shared pieces the rest builds on: formulation and backend descriptors, Objective, Deadline,
SolveOptions, named model rows, the one atomic writer, and the module graph (no import cycles,
no library module importing the CLI)."""
from __future__ import annotations

import ast
import json
import math

import networkx as nx
import numpy as np
import pytest

from kvbound import Batch, CostModel, Instance, Request, Schedule, SystemConfig, load_case
from kvbound.deadline import Deadline
from kvbound.errors import InputError, KvboundError
from kvbound.fileio import write_atomic, write_json_atomic
from kvbound.backends import BACKENDS
from kvbound.constraints import Constraints
from kvbound.formulation import FORMULATION_KINDS
from kvbound.formulation.model import Model
from kvbound.objective import OBJECTIVES, Objective
from kvbound.schedule import validate
from kvbound.solvers import solve, solve_with
from kvbound.solvers.options import FORMULATIONS, SolveOptions
from tests.conftest import REPO

CASE = REPO / "cases" / "evict_better.toml"


# ------------------------------------------------------------------------------ Objective

def test_objective_parses_once_and_reads_its_metric():
    inst = load_case(CASE)
    res = solve(inst, "mean_latency", "highs", 30)
    assert Objective.parse("mean_latency") is Objective.MEAN_LATENCY
    assert Objective.parse(Objective.MEAN_TTFT) is Objective.MEAN_TTFT
    assert Objective.MEAN_LATENCY.of(res.metrics) == res.metrics.mean_latency
    assert [o.is_mean for o in Objective] == [False, True, True]
    assert [o.first_token for o in Objective] == [False, False, True]
    assert OBJECTIVES == ("total_latency", "mean_latency", "mean_ttft")
    # a StrEnum: JSON and string comparisons see the plain name
    assert json.dumps({"o": Objective.MEAN_TTFT}) == '{"o": "mean_ttft"}'
    assert res.to_json()["objective_name"] == "mean_latency"


def test_unknown_objective_names_its_source_and_field():
    with pytest.raises(InputError) as err:
        Objective.parse("p99_latency", "sweep.toml", "run.objectives")
    assert str(err.value).startswith("sweep.toml: run.objectives: unknown objective 'p99_latency'")


# ------------------------------------------------------------------------------ Deadline

class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_deadline_counts_down_and_shares_never_outlive_it():
    clock = FakeClock()
    d = Deadline(10, clock=clock)
    assert d.remaining() == 10 and not d.expired()
    clock.now += 4
    assert d.remaining() == pytest.approx(6) and d.elapsed() == pytest.approx(4)
    half = d.share(0.5)
    assert half.remaining() == pytest.approx(3)
    clock.now += 5
    assert half.expired() and half.remaining() == 0
    assert d.remaining() == pytest.approx(1)
    clock.now += 2
    assert d.expired() and d.remaining() == 0
    assert Deadline(None, clock=clock).remaining() == math.inf
    with pytest.raises(ValueError):
        Deadline(float("nan"))


def test_solve_spends_no_more_than_its_deadline_on_the_backend():
    inst = load_case(REPO / "tests" / "fixtures" / "fig15_I256_M513.toml")  # a model the limit binds on
    clock_limit = 3.0
    res = solve_with(inst, SolveOptions(time_limit=60.0), Deadline(clock_limit))
    # the backend gets the deadline's remainder, not options.time_limit
    assert res.backend_seconds <= clock_limit + 2.0
    assert res.seconds <= clock_limit + 2.0


# ------------------------------------------------------------------------------ descriptors and options

def test_every_formulation_kind_builds_its_model_and_estimates_its_size():
    inst = load_case(CASE)
    for name, kind in FORMULATION_KINDS.items():
        form = kind.build(inst, Objective.TOTAL_LATENCY, 6, Constraints())
        assert form.name == name
        estimate = kind.size(inst, 6)
        assert estimate > 0
        # the estimate is of the model's order (it sizes "auto" and the memory guard)
        assert form.model.n_cols / 20 <= estimate <= 20 * form.model.n_cols
    assert FORMULATIONS == ("auto", "chain", "network", "bigm", "search", "lagrangian")
    assert {k.name for k in FORMULATION_KINDS.values() if k.folds_evict_only} == {"chain", "network"}
    assert {k.name for k in FORMULATION_KINDS.values() if k.fixes_admission_order} == {"bigm"}
    # "auto" picks the first kind within its limit that can express the constraints
    assert [k.name for k in FORMULATION_KINDS.values() if k.auto_limit] == ["chain", "bigm"]
    assert not FORMULATION_KINDS["chain"].expresses(Constraints(admission_order=(1, 0)))
    assert FORMULATION_KINDS["bigm"].expresses(Constraints(admission_order=(1, 0)))


def test_batches_needed_folds_evict_only_batches_in_state_networks():
    inst = Instance((Request(2, 2), Request(2, 2)), SystemConfig(4, 64, 64, 1), CostModel(1.0, 0.1))
    sched = Schedule(inst.requests, [Batch({0: 2, 1: 2}), Batch({}, (1,)), Batch({0: 1}), Batch({1: 3})])
    validate(inst, sched)
    assert FORMULATION_KINDS["chain"].batches_needed(sched) == 3
    assert FORMULATION_KINDS["bigm"].batches_needed(sched) == 4


def test_backends_describe_themselves_and_solve_reads_the_descriptor():
    assert list(BACKENDS) == ["highs", "cpsat", "cbc"]
    assert [b.integer_ticks for b in BACKENDS.values()] == [False, True, False]
    inst = load_case(CASE)
    for name in BACKENDS:
        res = solve_with(inst, SolveOptions(Objective.TOTAL_LATENCY, backend=name, time_limit=30))
        assert res.solver == name and res.status == "optimal" and res.success
        assert (res.tick is not None) == BACKENDS[name].integer_ticks
    with pytest.raises(KvboundError, match="unknown solver 'gurobi'; choose from auto, highs, cpsat, cbc"):
        solve_with(inst, SolveOptions(backend="gurobi"))


def test_solve_options_parse_the_objective_and_copy_with_changes():
    opts = SolveOptions("mean_ttft", warm_start=["vllm"])
    assert opts.objective is Objective.MEAN_TTFT and opts.warm_start == ("vllm",)
    other = opts.but(constraints=Constraints(no_evict=True))
    assert other.constraints.no_evict and not opts.constraints.no_evict and other.objective is opts.objective
    with pytest.raises(InputError):
        SolveOptions("median_latency")


def test_result_has_typed_fields_and_the_json_keeps_every_key():
    base = load_case(CASE)  # with one KV slot more: a model proves it (at M = 4 the analytic bounds do, without one)
    inst = Instance(base.requests, SystemConfig(5, base.system.max_batch_tokens), base.cost)
    res = solve(inst, "total_latency", "highs", 30)
    assert res.horizon >= 1 and res.horizon_reason and res.warm_start is not None and res.build_seconds >= 0
    assert res.message.startswith("optimal")
    out = res.to_json()
    for key in ("status", "objective_name", "objective", "lower_bound", "bound_certified", "gap", "solver",
                "formulation", "seconds", "schedule", "best_source", "metrics", "stats", "success", "message"):
        assert key in out
    for key in ("horizon", "horizon_reason", "backend_status", "backend_seconds", "build_seconds", "warm_start",
                "warm_start_accepted", "solver_bound", "analytic_bound", "conditional_bound", "bound_discarded",
                "model", "tick", "constraints", "formulation_requested"):
        assert key in out["stats"]
    assert out["stats"]["horizon"] == res.horizon
    json.dumps(out)


# ------------------------------------------------------------------------------ named rows

def test_a_violated_row_names_its_block_and_position():
    md = Model()
    v = md.add_vars("v", (2, 3), 0, 10)
    md.add_rows("cap[i,j]", (2, 3), [(v, 1.0)], hi=5)
    md.add_rows("total[j]", 3, [(v.T, 1.0)], hi=12)
    arrays = md.finalize()
    x = np.zeros(6)
    x[v[1, 2]] = 7
    assert arrays.check(x) == ["cap[i=1, j=2]: 7.0 not in [-inf, 5.0]"]
    x[v[0, 2]] = 6
    assert arrays.check(x) == ["cap[i=0, j=2]: 6.0 not in [-inf, 5.0]", "cap[i=1, j=2]: 7.0 not in [-inf, 5.0]",
                               "total[j=2]: 13.0 not in [-inf, 12.0]"]
    x[v[0, 0]] = 11
    assert arrays.check(x)[0] == "v[0, 0] = 11.0 outside [0.0, 10.0]"


def test_a_broken_warm_start_names_the_model_row_it_violates():
    inst = Instance((Request(2, 2), Request(2, 2)), SystemConfig(6, 64, 64, 1), CostModel(1.0, 0.1))
    both = Schedule(inst.requests, [Batch({0: 2, 1: 2}), Batch({0: 1}), Batch({1: 1})])  # KV 4, 5, 3
    validate(inst, both)
    for name in ("bigm", "chain", "network"):
        form = FORMULATION_KINDS[name].build(inst, Objective.TOTAL_LATENCY, 4, Constraints())
        arrays = form.model.finalize()
        x = form.warm_start(both)
        assert arrays.check(x) == []
        # the same point against a KV capacity of 3 tokens: the first batch's KV row is broken, and says so
        kv_rows = [k for k, label in enumerate(arrays.row_names()) if label.startswith("kv_capacity[")]
        assert kv_rows, name
        arrays.row_hi[kv_rows] = np.minimum(arrays.row_hi[kv_rows], 3)
        bad = arrays.check(x)
        assert bad and bad[0].startswith("kv_capacity[j=0]: 4.0 not in"), (name, bad)


# ------------------------------------------------------------------------------ the atomic writer

def test_atomic_writer_replaces_whole_files_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "out.json"
    write_json_atomic(target, {"a": 1})
    write_atomic(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert target.read_bytes() == b"\x00\x01"
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing" / "x.txt", "text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


# ------------------------------------------------------------------------------ the module graph

#: kvbound's layers, lowest first: a module imports only from its own layer or lower ones (by prefix)
LAYERS = (
    ("kvbound.errors", "kvbound.accounting", "kvbound.objective", "kvbound.interrupt", "kvbound.deadline",
     "kvbound.fileio", "kvbound.progress", "kvbound.units"),  # foundations (units: a pool or Ray for any work)
    ("kvbound.costs", "kvbound.workload", "kvbound.alone", "kvbound.schedule", "kvbound.constraints", "kvbound.io",
     "kvbound.generate", "kvbound.cpsat_process", "kvbound.kernels"),  # the domain, its files, the CP-SAT child
    ("kvbound.schedulers",),  # heuristics, the simulator, packing, schedule rewrites
    ("kvbound.formulation", "kvbound.bounds", "kvbound.backends"),  # models, bounds, solver backends
    ("kvbound.solvers",),  # the solve driver and its phases
    ("kvbound.analysis", "kvbound.engine_bridge"),  # compare, sweeps, plots; the executor
    ("kvbound.cli", "kvbound"),  # the command line; the package's own exports
)


def _layer(module: str) -> int:
    """The layer of `module` (the longest matching prefix)."""
    best = (-1, -1)
    for k, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), k))
    assert best[1] >= 0, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def _import_graph() -> nx.DiGraph:
    """kvbound's modules and every import between them: deferred (in-function) imports and imports under
    `if TYPE_CHECKING:` included (a type is a dependency too)."""
    root = REPO / "kvbound"
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = (base + "." + node.module if node.module else base) if node.level else node.module
                # `from pkg import mod` imports the module; `from mod import name` the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                if t in modules and t != name:
                    graph.add_edge(name, t)
    return graph


def test_the_import_graph_sees_type_checking_and_deferred_imports():
    graph = _import_graph()
    assert graph.has_edge("kvbound.bounds.base", "kvbound.schedule")  # under `if TYPE_CHECKING:`
    assert graph.has_edge("kvbound.schedulers.base", "kvbound.errors")  # inside a function


def test_no_import_cycle_between_kvbound_modules():
    graph = _import_graph()
    # a package's __init__ re-exporting its own modules is not a cycle of responsibilities
    reexports = [(a, b) for a, b in graph.edges if b.startswith(a + ".")]
    graph.remove_edges_from(reexports)
    cycles = list(nx.simple_cycles(graph))
    assert cycles == [], cycles


def test_no_library_module_imports_the_cli():
    graph = _import_graph()
    offenders = [(a, b) for a, b in graph.edges
                 if (b == "kvbound.cli" or b.startswith("kvbound.cli.")) and not a.startswith("kvbound.cli")]
    assert offenders == []


def test_every_import_goes_down_the_layers():
    # e.g. bounds/ and schedulers/ never import the solve driver; accounting imports nothing of kvbound
    graph = _import_graph()
    upward = [(a, b) for a, b in graph.edges if not b.startswith(a + ".") and _layer(b) > _layer(a)]
    assert upward == []
    assert list(graph.successors("kvbound.accounting")) == []


# ------------------------------------------------------------------------------ schedule transforms

def test_completion_under_no_chunk_evicts_only_requests_it_can_refill():
    # found by hypothesis (test_warm_start_of_heuristic_schedules): after the first tokens both requests
    # hold KV and neither can decode; request 2 (S = 6 > min(P, C) = 5) can never be refilled in one
    # chunk, so request 0 must be the one evicted, or the completion fails
    from kvbound.schedulers.rewrite import complete_schedule, first_token_prefix

    inst = Instance((Request(1, 4), Request(4, 1), Request(4, 3)), SystemConfig(8, 5, 5, 1), CostModel(1.0, 0.1, 0.01, 0.001))
    batches = [Batch({0: 1, 1: 4}), Batch({0: 1, 2: 4}), Batch({2: 1, 0: 1})]
    prefix = first_token_prefix(inst, batches)
    done = complete_schedule(inst, prefix, Constraints(no_chunk=True))
    assert done is not None
    validate(inst, done)
    assert all(b.evict != (2,) for b in done.batches)
