"""The case files shipped under cases/: they load, carry the stated parameters, and every scheduler serves them."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvbound import SCHEDULERS, Instance, load_case, run_scheduler, validate
from kvbound.costs import PRESETS
from kvbound.errors import SchedulerRefused
from kvbound.generate import FIG15_PROMPTS, MIX46_GROUPS, MIX46_PAIRS
from kvbound.io.schedules import schedule_from_json

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "cases"
TRACES = ROOT.parent / "shared" / "data" / "traces"
ALL_CASES = sorted(CASES.rglob("*.toml"))
TRACE_CASES = {"splitwise_conv_full.toml"}  # read ../shared/data/traces: benchmarked in bench/, not simulated here
# every scheduler on every case but the full trace
SIMULATED_CASES = [p for p in ALL_CASES if p.name not in TRACE_CASES]
#: requests of a case the scheduler matrix serves by default: the first FIRST_REQUESTS of the 1,000- and
#: 2,000-request cases (every scheduler on all of them took ~7 of the suite's minutes; their schedules
#: are also pinned batch by batch by tests/test_simulator_identity.py); all of each with KVBOUND_SLOW=1
FIRST_REQUESTS = None if os.environ.get("KVBOUND_SLOW") else 400
A100 = PRESETS["llama2-7b-a100"]


def _rel(path: Path) -> str:
    return str(path.relative_to(CASES))


def test_the_shipped_set_is_complete():
    names = {_rel(p) for p in ALL_CASES}
    assert {f"fig15/fig15_I{i}.toml" for i in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)} <= names
    assert {f"mix46/{a}_{b}.toml" for a, b in MIX46_PAIRS} <= names
    assert len(MIX46_PAIRS) == 6
    assert {"evict_better.toml", "sample200.toml", "splitwise_conv_full.toml", "example.toml"} <= names


@pytest.mark.parametrize("path", ALL_CASES, ids=_rel)
def test_case_loads_with_name_and_description(path):
    if path.name in TRACE_CASES and not TRACES.exists():
        pytest.skip(f"{_rel(path)} reads a trace from {TRACES}, which is absent")
    inst = load_case(path)
    assert len(inst) >= 1
    assert inst.name.strip(), f"{_rel(path)} has no name"
    assert len(inst.description) > 20, f"{_rel(path)} has no real description"


@pytest.mark.skipif(not TRACES.exists(), reason="../shared/data/traces is absent")
def test_full_trace_case_reads_the_shared_trace():
    inst = load_case(CASES / "splitwise_conv_full.toml")
    assert len(inst) == 19_366
    assert not inst.offline and inst.arrivals[0] == 0.0
    assert (inst.system.kv_capacity, inst.system.max_batch_tokens) == (100_000, 4096)
    assert inst.cost == A100
    # the data is referenced, not copied into the repository
    assert not list(ROOT.rglob("splitwise_conv.csv"))


@pytest.mark.parametrize("prompt", FIG15_PROMPTS)
def test_fig15_parameters(prompt):
    assert FIG15_PROMPTS == tuple(2 ** k for k in range(11))
    inst = load_case(CASES / "fig15" / f"fig15_I{prompt}.toml")
    assert len(inst) == 4
    assert {(r.prompt, r.output, r.arrival) for r in inst.requests} == {(prompt, 4, 0.0)}
    assert inst.system.kv_capacity == max(2 * prompt, prompt + 4 - 1)
    assert inst.system.max_batch_tokens == 4096
    assert inst.system.max_prefill_tokens == 4096
    assert inst.cost == A100
    assert inst.name == f"fig15_I{prompt}"
    # two prompts fit, but only one request can reach its peak KV at a time
    M, peak = inst.system.kv_capacity, prompt + 4 - 1
    assert 2 * prompt <= M and peak <= M < 2 * peak


def _group(r) -> str:
    small = {8, 16}
    return ("s" if r.prompt in small else "l") + "i" + ("s" if r.output in small else "l") + "o"


@pytest.mark.parametrize("a,b", MIX46_PAIRS, ids=lambda x: x)
def test_mix46_parameters(a, b):
    inst = load_case(CASES / "mix46" / f"{a}_{b}.toml")
    assert len(inst) == 16 and inst.offline
    groups = [_group(r) for r in inst.requests]
    assert sorted(groups) == sorted([a] * 8 + [b] * 8)
    for r in inst.requests:
        prompts, outputs = MIX46_GROUPS[_group(r)]
        assert r.prompt in prompts and r.output in outputs
    assert groups != [a] * 8 + [b] * 8, "the requests are not shuffled"
    assert (inst.system.kv_capacity, inst.system.max_batch_tokens) == (4096, 4096)
    assert inst.cost == A100
    if "lo" in a[2:] or "lo" in b[2:]:
        # contention: the mix cannot hold all its requests at their peaks, and vLLM does evict
        assert sum(r.peak_kv for r in inst.requests) > inst.system.kv_capacity
        assert run_scheduler(inst, "vllm").replay.metrics.evictions > 0


def _scheduler_matrix():
    return [pytest.param(path, s, id=f"{_rel(path)}-{s}") for path in SIMULATED_CASES for s in SCHEDULERS]


@pytest.mark.parametrize("path,scheduler", _scheduler_matrix())
def test_every_scheduler_runs_and_validates_or_refuses(path, scheduler):
    inst = load_case(path)
    if FIRST_REQUESTS is not None and len(inst) > FIRST_REQUESTS:
        inst = Instance(inst.requests[:FIRST_REQUESTS], inst.system, inst.cost, inst.name, source=inst.source)
    try:
        result = run_scheduler(inst, scheduler)
    except SchedulerRefused as exc:
        assert scheduler in str(exc) and str(exc).strip()
        return
    data = json.loads(json.dumps(result.schedule.to_json()))  # the JSON round trip
    replay = validate(inst, schedule_from_json(data))
    m, sim = replay.metrics, result.replay.metrics
    assert m.batches == sim.batches and m.evictions == sim.evictions
    assert m.total_latency == pytest.approx(sim.total_latency, rel=1e-12)
    assert m.peak_kv <= inst.system.kv_capacity
    if scheduler.endswith("-ef") or scheduler == "mcsf":
        assert m.evictions == 0, f"{scheduler} is eviction-free but evicted {m.evictions} times"


def test_sarathi_and_vllm_serve_sample200():
    inst = load_case(CASES / "sample200.toml")
    for name in ("sarathi", "vllm"):  # neither refuses: prompt + output <= 4096 = C keeps refills within one batch
        m = run_scheduler(inst, name).replay.metrics
        assert m.batches > 0 and m.peak_kv <= inst.system.kv_capacity


# --------------------------------------------------------------------------- evictions strictly help

def _oracle():
    try:
        from tests.oracle import brute_force
    except ImportError as exc:  # pragma: no cover - only while tests/oracle.py is being written
        pytest.skip(f"tests/oracle.py is not available yet: {exc}")
    return brute_force


def test_evict_better_is_strictly_better_with_evictions():
    brute_force = _oracle()
    inst = load_case(CASES / "evict_better.toml")
    assert 2 <= len(inst) <= 4
    assert max(inst.prompts) <= 4 and max(inst.outputs) <= 3
    values = {}
    for objective in ("total_latency", "mean_latency"):
        for allow in (True, False):
            res = brute_force(inst, objective=objective, allow_evict=allow)
            replay = validate(inst, res.schedule)  # the oracle's schedule is valid and attains its value
            assert getattr(replay.metrics, objective) == pytest.approx(res.value, rel=1e-9)
            if not allow:
                assert replay.metrics.evictions == 0
            values[objective, allow] = (res.value, replay.metrics.evictions)
    msg = "; ".join(f"{obj}: with evictions {values[obj, True][0]:.7g} s ({values[obj, True][1]} evictions), "
                    f"eviction-free {values[obj, False][0]:.7g} s" for obj in ("total_latency", "mean_latency"))
    for objective in ("total_latency", "mean_latency"):
        with_evict, without = values[objective, True][0], values[objective, False][0]
        assert with_evict < without * (1 - 1e-6), msg
        assert values[objective, True][1] >= 1, msg  # the better schedule does evict
    # the eviction-free optimum is no better than the best eviction-free heuristic, and strictly worse than evicting
    best_ef = min(run_scheduler(inst, s).replay.metrics.total_latency for s in SCHEDULERS if s.endswith("-ef"))
    assert values["total_latency", False][0] <= best_ef + 1e-12, msg
    print(msg)
