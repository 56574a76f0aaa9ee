"""The CLI contract: `kvbound simulate`, `kvbound validate`, `kvbound schedulers`."""
from __future__ import annotations

import json

import pytest

from kvbound import SCHEDULERS
from kvbound.io.cases import load_case
from kvbound.io.schedules import schedule_from_json
from kvbound.schedule import METRIC_KEYS, validate

from .conftest import REPO

EXAMPLE = REPO / "cases" / "example.toml"
EIGHT_KEYS = {"total_latency", "mean_latency", "mean_ttft", "mean_tpot", "batches", "evictions",
              "recomputed_tokens", "peak_kv"}


def _simulate_json(cli, *extra, scheduler="sarathi"):
    rc, out, err = cli("simulate", EXAMPLE, "--scheduler", scheduler, "--json", *extra)
    assert (rc, err) == (0, "")
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def _check_schedule_shape(schedule: dict, instance) -> None:
    assert set(schedule) == {"requests", "batches"}
    assert len(schedule["requests"]) == len(instance)
    for i, (entry, req) in enumerate(zip(schedule["requests"], instance.requests)):
        assert entry == {"id": i, "prompt": req.prompt, "output": req.output, "arrival": req.arrival}
    assert schedule["batches"]
    for batch in schedule["batches"]:
        assert set(batch) == {"start", "tokens", "evict"}
        assert isinstance(batch["start"], (int, float)) and batch["start"] >= 0
        assert batch["tokens"] and all(k.isdigit() and isinstance(c, int) and c >= 1
                                       for k, c in batch["tokens"].items())
        assert isinstance(batch["evict"], list)


@pytest.mark.parametrize("scheduler", ["sarathi", "vllm", "mcsf"])
def test_simulate_json(cli, scheduler):
    data = _simulate_json(cli, scheduler=scheduler)
    assert set(data) == {"scheduler", "metrics", "schedule"}
    assert data["scheduler"] == scheduler
    assert EIGHT_KEYS <= set(data["metrics"])
    assert set(METRIC_KEYS) == EIGHT_KEYS
    instance = load_case(EXAMPLE)
    _check_schedule_shape(data["schedule"], instance)
    # the metrics are the replay of the printed schedule
    replay = validate(instance, schedule_from_json(data["schedule"]))
    assert replay.metrics.to_dict() == data["metrics"]
    m = data["metrics"]
    assert m["batches"] == sum(1 for b in data["schedule"]["batches"] if b["tokens"])
    assert m["evictions"] == sum(len(b["evict"]) for b in data["schedule"]["batches"])
    assert 0 < m["peak_kv"] <= instance.system.kv_capacity
    assert m["total_latency"] >= m["mean_latency"] >= m["mean_ttft"] > 0


def test_simulate_example_case_numbers(cli):
    """cases/example.toml: four (16, 4) requests under M = 32. Every request processes at least
    I + O - 1 = 19 tokens, so at least 76 tokens in all; at most two fit in memory at once."""
    data = _simulate_json(cli)
    tokens = sum(sum(b["tokens"].values()) for b in data["schedule"]["batches"])
    assert tokens == 4 * 19 + data["metrics"]["recomputed_tokens"]
    assert data["metrics"]["peak_kv"] <= 32


def test_simulate_out_then_validate(cli, tmp_path):
    out_path = tmp_path / "schedule.json"
    data = _simulate_json(cli, "--out", out_path)
    written = json.loads(out_path.read_text())
    assert written == data["schedule"]
    assert not (tmp_path / "schedule.json.tmp").exists()
    rc, out, err = cli("validate", EXAMPLE, out_path, "--json")
    assert (rc, err) == (0, "")
    result = json.loads(out)
    assert result == {"valid": True, "metrics": data["metrics"]}


def test_simulate_table_output(cli, tmp_path):
    out_path = tmp_path / "s.json"
    rc, out, err = cli("simulate", EXAMPLE, "--scheduler", "sarathi", "--out", out_path)
    assert (rc, err) == (0, "")
    assert out.startswith("example: scheduler sarathi, 4 requests")
    for label in ("total latency", "mean latency", "mean TTFT", "mean TPOT", "batches", "evictions",
                  "recomputed tokens", "peak KV"):
        assert label in out
    assert f"schedule written to {out_path}" in out
    assert out_path.exists()


def test_schedulers_lists_every_name(cli):
    rc, out, err = cli("schedulers")
    assert (rc, err) == (0, "")
    lines = out.strip().splitlines()
    assert len(lines) == len(SCHEDULERS)
    listed = [line.split()[0] for line in lines]
    assert listed == list(SCHEDULERS)
    for line, (name, desc) in zip(lines, SCHEDULERS.items()):
        assert line.split(None, 1)[1].strip() == desc and desc


def test_every_listed_scheduler_runs_the_example(cli):
    for name in SCHEDULERS:
        data = _simulate_json(cli, scheduler=name)
        assert data["scheduler"] == name
        assert EIGHT_KEYS <= set(data["metrics"])


@pytest.mark.parametrize("name", ["sarathy", "nope", "sarathi:unknown_option=1"])
def test_unknown_scheduler(cli, name):
    rc, out, err = cli("simulate", EXAMPLE, "--scheduler", name)
    assert rc == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert name.split(":")[0] in err
    if name == "sarathy":
        assert "did you mean 'sarathi'" in err


def test_usage_errors_are_one_line(cli):
    rc, out, err = cli("simulate", EXAMPLE)  # --scheduler missing
    assert rc == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "--scheduler" in err
    rc, out, err = cli("frobnicate")
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1
