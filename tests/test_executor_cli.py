"""`kvbound profile`, `kvbound calibrate` and `kvbound replay`: outputs, the --json contract and
bad input (one `error:` line, exit status 2). Small and fast: the tiny shape with one layer."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from kvbound.costs import CostModel
from kvbound.costs.calibrate import FEATURE_COLUMNS, TIME_COLUMN, calibrate
from kvbound.io.cases import load_case, load_cost_file
from kvbound.io.schedules import dump_schedule, load_schedule
from kvbound.schedulers import run_scheduler

from .conftest import REPO

REPLAY_KEYS = ["device", "shape", "batches", "predicted_total", "measured_total", "total_relative_error",
               "mean_batch_relative_error", "max_batch_relative_error", "per_batch", "prepare_total", "paths"]
FAST = ("--layers", "1", "--repeat", "1")
try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="the executor extra (torch) is not installed")


def _profile_rows(cost: CostModel, n: int, noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.integers(0, 4, n)
    d = rng.integers(0, 16, n)
    p[(p == 0) & (d == 0)] = 1
    c, mp, md = rng.integers(1, 128, n), rng.integers(0, 256, n), rng.integers(1, 512, n)
    x = np.column_stack([np.ones(n), p * c + d, d * md, p * (c * c + 2 * mp * c), p * mp, p]).astype(float)
    y = x @ cost.coefficients * (1 + noise * rng.standard_normal(n))
    return x, y


def _write_profile(path, x, y) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow((*FEATURE_COLUMNS, TIME_COLUMN))
        writer.writerows([*row, t] for row, t in zip(x, y))


TRUE_COST = CostModel(intercept=3e-3, per_token=1.5e-4, decode_kv=2e-6, prefill_attention=5e-9, prefill_kv=1e-6,
                      per_prefill_request=8e-4)


def test_calibrate_recovers_a_known_cost_model():
    x, y = _profile_rows(TRUE_COST, 300, noise=0.0)
    cal = calibrate(x, y)
    np.testing.assert_allclose(cal.cost.coefficients, TRUE_COST.coefficients, rtol=1e-6)
    assert cal.held_out_quality.r2 == pytest.approx(1.0) and cal.held_out_quality.max_relative_error < 1e-9
    assert len(cal.held_out) == 60 and not set(cal.held_out) & set(cal.train)


def test_calibrate_keeps_coefficients_non_negative_and_reports_held_out_error():
    x, y = _profile_rows(CostModel(intercept=2e-3, per_token=1e-4), 200, noise=0.05, seed=1)
    cal = calibrate(x, y)
    assert (cal.cost.coefficients >= 0).all() and cal.cost.intercept > 0
    assert cal.cost.intercept == pytest.approx(2e-3, rel=0.1) and cal.cost.per_token == pytest.approx(1e-4, rel=0.1)
    assert 0.01 < cal.held_out_quality.mean_relative_error < 0.1  # 5% noise: neither 0 nor large


def test_calibrate_cli_writes_a_usable_cost_table(cli, tmp_path):
    x, y = _profile_rows(TRUE_COST, 120, noise=0.01)
    _write_profile(tmp_path / "p.csv", x, y)
    rc, out, err = cli("calibrate", tmp_path / "p.csv", "--out", tmp_path / "cost.toml", "--plot", tmp_path / "fit.png",
                       "--profiling", tmp_path / "absent")
    assert rc == 0, err
    assert "held-out batches: R^2 0.99" in out and "GPU operator profiles: none in" in out
    assert (tmp_path / "fit.png").read_bytes()[:4] == b"\x89PNG"
    # the table drops into a case file as is
    case = (REPO / "cases" / "evict_better.toml").read_text().replace('preset = "llama2-7b-a100"', "")
    case = case.replace("[cost]\n", (tmp_path / "cost.toml").read_text())
    (tmp_path / "case.toml").write_text(case)
    loaded = load_case(tmp_path / "case.toml").cost
    assert loaded == load_cost_file(str(tmp_path / "cost.toml"))  # what replay --cost reads
    assert loaded.intercept == pytest.approx(TRUE_COST.intercept, rel=0.05)
    assert loaded.per_token == pytest.approx(TRUE_COST.per_token, rel=0.05)


def test_calibrate_fits_the_gpu_operator_profiles(cli, tmp_path, shared_data):
    x, y = _profile_rows(TRUE_COST, 60, noise=0.01)
    _write_profile(tmp_path / "p.csv", x, y)
    rc, out, err = cli("calibrate", tmp_path / "p.csv", "--out", tmp_path / "cost.toml", "--plot", tmp_path / "fit.png",
                       "--profiling", shared_data / "profiling")
    assert rc == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if "batches: intercept" in line}
    assert "R^2 0.9986" in lines["a100/llama-2-7b"]  # the seed paper reports 0.999 for this fit
    assert "intercept 0.00371976 s, per_token 6.52783e-05 s" in lines["a100/llama-2-7b"]  # = the llama2-7b-a100 preset
    assert "h100/llama-2-7b" in lines


@pytest.mark.parametrize("content,field", [
    ("batches,tokens,decode_kv,prefill_attention,prefill_kv,seconds\n1,2,0,4,0,0.1\n", "prefill_requests: missing column"),
    ("batches,tokens,decode_kv,prefill_attention,prefill_kv,prefill_requests,seconds\n1,2,0,4,0,1,fast\n",
     "row 2, seconds: not a number"),
    ("batches,tokens,decode_kv,prefill_attention,prefill_kv,prefill_requests,seconds\n1,2,0,4,0,1,0\n",
     "row 2, seconds: must be a finite number > 0"),
    ("batches,tokens,decode_kv,prefill_attention,prefill_kv,prefill_requests,seconds\n1,-2,0,4,0,1,0.1\n",
     "row 2, tokens: must be a finite number >= 0"),
    ("batches,tokens,decode_kv,prefill_attention,prefill_kv,prefill_requests,seconds\n1,2,0,4,0,1,0.1\n",
     "1 batches; a fit of 6 coefficients with held-out batches needs at least 12"),
])
def test_calibrate_bad_profile_is_one_error_line(cli, write_file, tmp_path, content, field):
    path = write_file("p.csv", content)
    rc, out, err = cli("calibrate", path, "--out", tmp_path / "c.toml")
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"error: {path}: ") and field in err, err
    assert not (tmp_path / "c.toml").exists()


def test_calibrate_missing_file(cli, tmp_path):
    rc, _, err = cli("calibrate", tmp_path / "nope.csv", "--out", tmp_path / "c.toml")
    assert rc == 2 and err.startswith("error: ") and "cannot read file" in err and err.count("\n") == 1


# ----------------------------------------------------------------------------- profile and replay (torch)

@needs_torch
def test_profile_writes_features_and_times(cli, tmp_path):
    out = tmp_path / "p.csv"
    rc, stdout, err = cli("profile", "--device", "cpu", "--shape", "tiny", *FAST, "--points", "5", "--out", out)
    assert rc == 0, err
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 5 and not (tmp_path / "p.csv.tmp").exists()
    for r in rows:
        p, c, mp, d, md = (int(r[k]) for k in ("prefill_requests", "chunk", "prefill_cached", "decode_requests",
                                               "decode_cached"))
        assert [float(r[k]) for k in FEATURE_COLUMNS] == [1, p * c + d, d * md, p * (c * c + 2 * mp * c), p * mp, p]
        assert float(r[TIME_COLUMN]) > 0
    assert "5 batches on cpu (tiny, 1 layers" in stdout


@pytest.fixture
def schedule_file(tmp_path):
    inst = load_case(REPO / "cases" / "evict_better.toml")
    path = tmp_path / "s.json"
    dump_schedule(run_scheduler(inst, "vllm").schedule, path)
    return path


@needs_torch
def test_replay_json_contract(cli, tmp_path, schedule_file):
    case = REPO / "cases" / "evict_better.toml"
    rc, out, err = cli("replay", case, schedule_file, "--device", "cpu", "--shape", "tiny", *FAST, "--json",
                       "--plot", tmp_path / "r.png")
    assert rc == 0, err
    assert out.count("\n") == 1
    data = json.loads(out)
    assert list(data) == REPLAY_KEYS
    assert data["device"] == "cpu" and data["shape"] == "tiny" and data["batches"] == len(data["per_batch"]) > 0
    predicted = np.array([b["predicted"] for b in data["per_batch"]])
    measured = np.array([b["measured"] for b in data["per_batch"]])
    assert (measured > 0).all()
    # predictions are the case's own cost model (llama2-7b-a100 preset) on the batches' features
    replay = __import__("kvbound").validate(load_case(case), load_schedule(schedule_file))
    assert predicted.sum() == pytest.approx(replay.metrics.total_latency)
    assert data["predicted_total"] == pytest.approx(predicted.sum()) and data["measured_total"] == pytest.approx(measured.sum())
    rel = np.abs(predicted - measured) / measured
    assert data["mean_batch_relative_error"] == pytest.approx(rel.mean())
    assert data["max_batch_relative_error"] == pytest.approx(rel.max())
    assert data["total_relative_error"] == pytest.approx(abs(predicted.sum() - measured.sum()) / measured.sum())
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    # each batch's features are the semantics' (validate), and on CPU every batch runs eagerly
    nonempty = [j for j, b in enumerate(load_schedule(schedule_file).batches) if b.tokens]
    np.testing.assert_array_equal([b["features"] for b in data["per_batch"]], replay.batch_features[nonempty])
    assert data["paths"] == {"eager": len(nonempty)} and {b["path"] for b in data["per_batch"]} == {"eager"}


@needs_torch
def test_replay_reports_how_much_of_it_the_profile_covers(cli, tmp_path, schedule_file):
    case = REPO / "cases" / "evict_better.toml"
    replay = __import__("kvbound").validate(load_case(case), load_schedule(schedule_file))
    features = replay.batch_features[[j for j, b in enumerate(load_schedule(schedule_file).batches) if b.tokens]]
    # a profile spanning exactly the decode-only batches' ranges and nothing with a prefill
    decode = features[features[:, 5] == 0]
    rows = [*decode.min(axis=0), 0.01], [*decode.max(axis=0), 0.02]
    header = ",".join((*FEATURE_COLUMNS, TIME_COLUMN))
    profile = tmp_path / "p.csv"
    profile.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows * 6) + "\n")
    rc, out, err = cli("replay", case, schedule_file, "--device", "cpu", "--shape", "tiny", *FAST, "--json",
                       "--profile", profile)
    assert rc == 0, err
    coverage = json.loads(out)["profile_coverage"]
    with_prefill = int((features[:, 5] > 0).sum())
    assert 0 < with_prefill < len(features)
    assert coverage["covered"] == pytest.approx(1 - with_prefill / len(features))
    assert coverage["outside"]["prefill_requests"] == with_prefill


def _builds(monkeypatch, keyword: str) -> list:
    """What each `Executor.build` from now on is given as `keyword` (None when not given), in order."""
    from kvbound.engine_bridge.executor import Executor
    build, seen = Executor.build.__func__, []

    def spy(cls, *args, **kwargs):
        seen.append(kwargs.get(keyword))
        return build(cls, *args, **kwargs)

    monkeypatch.setattr(Executor, "build", classmethod(spy))
    return seen


@needs_torch
def test_no_graphs_reaches_the_executor(cli, tmp_path, schedule_file, monkeypatch):
    # on CUDA decode-only batches replay captured graphs unless --no-graphs; profile and replay both pass it on
    seen = _builds(monkeypatch, "graphs")
    for extra in ((), ("--no-graphs",)):
        rc, _, err = cli("replay", REPO / "cases" / "evict_better.toml", schedule_file, "--device", "cpu", "--shape",
                         "tiny", *FAST, "--json", *extra)
        assert rc == 0, err
        rc, _, err = cli("profile", "--device", "cpu", "--shape", "tiny", *FAST, "--points", "2", "--out",
                         tmp_path / "p.csv", *extra)
        assert rc == 0, err
    assert seen == [None, None, False, False]


@needs_torch
def test_prefill_split_reaches_the_executor(cli, tmp_path, schedule_file, monkeypatch):
    seen = _builds(monkeypatch, "prefill_split")
    rc, _, err = cli("replay", REPO / "cases" / "evict_better.toml", schedule_file, "--device", "cpu", "--shape",
                     "tiny", *FAST, "--json", "--prefill-split")
    assert rc == 0, err
    rc, _, err = cli("profile", "--device", "cpu", "--shape", "tiny", *FAST, "--points", "2", "--out",
                     tmp_path / "p.csv")
    assert rc == 0, err
    assert seen == [True, False]


@needs_torch
def test_replay_uses_the_cost_file(cli, tmp_path, schedule_file):
    (tmp_path / "cost.toml").write_text("# from calibrate\n[cost]\nintercept = 0.5\nper_token = 0.25\n")
    rc, out, err = cli("replay", REPO / "cases" / "evict_better.toml", schedule_file, *FAST, "--cost",
                       tmp_path / "cost.toml")
    assert rc == 0, err
    assert "predicted" in out and "total: predicted" in out
    rc, out, _ = cli("replay", REPO / "cases" / "evict_better.toml", schedule_file, *FAST, "--cost",
                     tmp_path / "cost.toml", "--json")
    tokens = [sum(b["tokens"].values()) for b in json.loads(schedule_file.read_text())["batches"] if b["tokens"]]
    assert [b["predicted"] for b in json.loads(out)["per_batch"]] == [0.5 + 0.25 * t for t in tokens]


@pytest.mark.parametrize("change,expected", [
    (lambda a: a.__setitem__(0, "missing.toml"), "missing.toml: cannot read file"),
    (lambda a: a.__setitem__(1, "missing.json"), "missing.json: cannot read file"),
    (lambda a: a.extend(["--shape", "llama-3-70b"]), "--shape: unknown shape 'llama-3-70b'; known: llama-2-7b, tiny"),
    (lambda a: a.extend(["--cost", str(REPO / "pyproject.toml")]), "pyproject.toml: cost: missing section [cost]"),
    (lambda a: a.extend(["--layers", "0"]), "--layers: must be >= 1"),
])
def test_replay_bad_input_is_one_error_line(cli, schedule_file, change, expected):
    argv = [str(REPO / "cases" / "evict_better.toml"), str(schedule_file), *FAST]
    change(argv)
    rc, out, err = cli("replay", *argv)
    assert rc == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1 and expected in err, err


def test_replay_rejects_an_invalid_schedule(cli, tmp_path, schedule_file):
    data = json.loads(schedule_file.read_text())
    data["batches"][0]["tokens"]["0"] = 99
    (tmp_path / "bad.json").write_text(json.dumps(data))
    rc, _, err = cli("replay", REPO / "cases" / "evict_better.toml", tmp_path / "bad.json", *FAST)
    assert rc == 2 and "bad.json: invalid schedule for" in err and "batch 0, request 0: processes 99 tokens" in err


@pytest.mark.skipif(HAVE_TORCH and torch.cuda.is_available(), reason="a CUDA device is present")
def test_replay_on_cuda_without_a_gpu(cli, schedule_file):
    rc, _, err = cli("replay", REPO / "cases" / "evict_better.toml", schedule_file, "--device", "cuda")
    assert rc == 2 and err.count("\n") == 1
    assert ("--device: cuda: no CUDA device is available" in err) if HAVE_TORCH else ("kvbound[executor]" in err)


def test_commands_without_torch_say_how_to_install_it(cli, schedule_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    rc, _, err = cli("replay", REPO / "cases" / "evict_better.toml", schedule_file)
    assert rc == 2 and err.startswith("error: ") and "install kvbound[executor]" in err and err.count("\n") == 1
    rc, _, err = cli("profile", "--shape", "tiny", "--out", tmp_path / "p.csv")
    assert rc == 2 and "install kvbound[executor]" in err


def test_the_cli_does_not_import_torch():
    code = "import sys, kvbound.cli; kvbound.cli.build_parser(); sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
