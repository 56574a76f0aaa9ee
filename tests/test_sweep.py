"""`kvbound sweep` (issue 6): the spec format, resuming after a crash, and the Ray backend.

The resume tests count evaluations: an interrupted sweep must keep every point it finished
(none computed twice on the re-run) and lose none, including when the process is killed
outright in the middle of a write.
"""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvbound.analysis.sweep import COLUMNS, load_spec, read_results, run_sweep
from kvbound.analysis.sweep import run as sweep_run
from kvbound.schedulers import run_scheduler

REPO = Path(__file__).resolve().parents[1]

#: 3 prompts x 2 objectives = 6 points of 2 tiny requests each; the solver proves each in well under a second
SPEC = """
name = "tiny"
[grid]
prompt = [1, 2, 4]
output = 2
requests = 2
kv_capacity = "max(2*I, I + O - 1)"
max_batch_tokens = 64
preset = "llama2-7b-a100"
[run]
schedulers = ["vllm", "vllm-ef", "sarathi"]
objectives = ["total_latency", "mean_ttft"]
solve = true
time_limit = 5
"""

CASE = """
name = "two"
[system]
kv_capacity = 8
max_batch_tokens = 16
[cost]
preset = "llama2-7b-a100"
[[requests]]
prompt = 4
output = 3
count = 2
"""


@pytest.fixture
def spec_file(write_file):
    def make(text: str = SPEC, name: str = "spec.toml"):
        return write_file(name, text)

    return make


def assert_one_error_line(rc, out, err):
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


def csv_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def comparable(rows) -> list[tuple]:
    """Rows without the timing column, in a fixed order (completion order differs between runs)."""
    return sorted(tuple(str(r[k]) for k in COLUMNS if k != "point_seconds") for r in rows)


def assert_complete(path: Path, points: int) -> None:
    rows = csv_rows(path)
    by_point: dict[str, list] = {}
    for r in rows:
        by_point.setdefault(r["point"], []).append(r)
    assert len(by_point) == points
    for key, group in by_point.items():
        assert len(group) == int(group[0]["point_rows"]), key
        assert len({r["scheduler"] for r in group}) == len(group), f"point {key} has duplicate rows"


# ------------------------------------------------------------------------------ the spec

def test_grid_points_and_expressions(spec_file):
    spec = load_spec(spec_file())
    points = spec.points()
    assert len(points) == 6
    assert [(p.params["prompt"], p.params["kv_capacity"], p.params["objective"]) for p in points] == [
        (1, 2, "total_latency"), (1, 2, "mean_ttft"), (2, 4, "total_latency"), (2, 4, "mean_ttft"),
        (4, 8, "total_latency"), (4, 8, "mean_ttft")]
    p = points[4]
    assert [(r.prompt, r.output, r.arrival) for r in p.instance.requests] == [(4, 2, 0.0)] * 2
    assert p.instance.system.kv_capacity == 8 and p.instance.system.max_prefill_tokens == 64
    assert len({p.key for p in points}) == 6
    assert [p.key for p in load_spec(spec_file()).points()] == [p.key for p in points]  # stable
    changed = load_spec(spec_file(SPEC.replace("time_limit = 5", "time_limit = 6"), "other.toml")).points()
    assert not {p.key for p in changed} & {p.key for p in points}  # a different solve, different points


def test_case_files_enter_the_key_by_content(write_file, spec_file, tmp_path):
    write_file("a/two.toml", CASE)
    write_file("b/moved.toml", CASE)
    spec_a = load_spec(spec_file('[grid]\ncase = ["a/*.toml"]\nkv_capacity = [8, 12]\n[run]\nschedulers = ["vllm"]\n', "s1.toml"))
    spec_b = load_spec(spec_file('[grid]\ncase = ["b/moved.toml"]\nkv_capacity = [8, 12]\n[run]\nschedulers = ["vllm"]\n', "s2.toml"))
    a, b = spec_a.points(), spec_b.points()
    assert [p.instance.system.kv_capacity for p in a] == [8, 12]
    assert [p.key for p in a] == [p.key for p in b]
    assert a[0].params["case"] == "two" and a[0].params["requests"] == 2 and a[0].params["prompt"] == ""


@pytest.mark.parametrize("text, field, needle", [
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\nsolve = true\n', "grid.solve",
     "unknown key"),
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\n[runn]\n', "runn", "did you mean 'run'"),
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = "2*X"\nmax_batch_tokens = 8\n', "grid.kv_capacity",
     "unknown name 'X'"),
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = "__import__(\'os\')"\nmax_batch_tokens = 8\n',
     "grid.kv_capacity", "only numbers"),
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = "I/2"\nmax_batch_tokens = 8\n', "grid.kv_capacity",
     "integer"),
    ('[grid]\nprompt = 8\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\n', "grid", "exceeds kv_capacity"),
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = 4\n', "grid.max_batch_tokens", "missing"),
    ('[grid]\nprompt = []\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\n', "grid.prompt", "empty"),
    ('[grid]\ncase = ["nope/*.toml"]\n', "grid.case", "matches no file"),
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\npreset = "h200"\n',
     "grid.preset", "unknown preset"),
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\n[run]\nschedulers = ["vlm"]\n',
     "run.schedulers", "did you mean 'vllm'"),
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\n[run]\nobjectives = ["tps"]\n',
     "run.objectives", "must list objectives"),
    ('[grid]\nprompt = 1\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\n[run]\ntime_limit = inf\n',
     "run.time_limit", "finite"),
    ('[grid]\nprompt = [1, 2]\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\n[[plot]]\nx = "block_size"\n',
     "plot[0].x", "must be a key of [grid]"),
    ('[grid]\nprompt = [1, 2]\noutput = 2\nrequests = 1\nkv_capacity = 4\nmax_batch_tokens = 8\n[[plot]]\nx = "prompt"\n'
     'y = "tps"\n', "plot[0].y", "must name columns"),
    ('grid = 3\n', "grid", "must be a table"),
    ('[grid\n', "", "malformed TOML"),
])
def test_bad_specs_are_one_error_line_naming_file_and_field(cli, spec_file, tmp_path, text, field, needle):
    path = spec_file(text)
    rc, out, err = cli("sweep", path, "--out", tmp_path / "out")
    assert_one_error_line(rc, out, err)
    assert err.startswith(f"error: {path}: {field}") and needle in err, err
    assert not (tmp_path / "out").exists()


def test_bad_sweep_options(cli, spec_file, tmp_path):
    for argv in (["--workers", "0"], ["--backend", "dask"]):
        assert_one_error_line(*cli("sweep", spec_file(), "--out", tmp_path / "o", *argv))
    assert_one_error_line(*cli("sweep", tmp_path / "missing.toml"))


# ------------------------------------------------------------------------------ running and resuming

def test_sweep_rows_are_compare_rows(cli, spec_file, tmp_path):
    out = tmp_path / "out"
    rc, stdout, err = cli("sweep", spec_file(), "--out", out, "--workers", "2")
    assert (rc, err) == (0, ""), err
    assert "6 points (0 already done, 6 run)" in stdout
    rows = read_results(out / "results.csv")
    assert_complete(out / "results.csv", 6)
    assert len(rows) == 6 * 4  # three schedulers and the optimum per point
    spec = load_spec(spec_file())
    point = spec.points()[2]
    mine = {r["scheduler"]: r for r in rows if r["point"] == point.key}
    sim = run_scheduler(point.instance, "vllm-ef").replay.metrics
    assert mine["vllm-ef"]["total_latency"] == sim.total_latency and mine["vllm-ef"]["evictions"] == sim.evictions
    best = min(r["total_latency"] for r in mine.values())
    assert mine["optimal"]["total_latency"] == best == mine["vllm"]["best_known"]
    for r in mine.values():
        assert r["gap_to_best"] == pytest.approx((r["total_latency"] - best) / r["total_latency"], abs=1e-12)
    assert (out / "summary.md").read_text().count("| 1 |") >= 2
    assert sorted(p.name for p in out.glob("*.png")) == ["plot_1_total_latency_vs_prompt.png",
                                                         "plot_2_mean_ttft_vs_prompt.png"]
    rc, stdout, err = cli("sweep", spec_file(), "--out", out)
    assert "6 points (6 already done, 0 run)" in stdout


def test_interrupted_sweep_resumes_without_recomputing_or_losing_points(spec_file, tmp_path, monkeypatch):
    spec = load_spec(spec_file())
    real = sweep_run.evaluate_point
    calls: list[str] = []

    def crash_after_three(point):
        if len(calls) == 3:
            raise KeyboardInterrupt  # as if Ctrl-C arrived while the fourth point ran
        calls.append(point.key)
        return real(point)

    monkeypatch.setattr(sweep_run, "evaluate_point", crash_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path / "out", workers=1, progress=False)
    assert_complete(tmp_path / "out" / "results.csv", 3)
    first = list(calls)

    calls.clear()
    monkeypatch.setattr(sweep_run, "evaluate_point", lambda p: (calls.append(p.key), real(p))[1])
    result = run_sweep(spec, tmp_path / "out", workers=1, progress=False)
    assert (result.ran, result.skipped) == (3, 3)
    assert not set(calls) & set(first) and len(calls) == 3  # nothing computed twice
    assert_complete(tmp_path / "out" / "results.csv", 6)
    fresh = run_sweep(spec, tmp_path / "fresh", workers=1, progress=False, plots=False)
    assert comparable(result.rows) == comparable(fresh.rows)


def test_a_torn_last_line_redoes_only_that_point(spec_file, tmp_path, monkeypatch):
    spec = load_spec(spec_file())
    run_sweep(spec, tmp_path / "out", workers=1, progress=False, plots=False)
    path = tmp_path / "out" / "results.csv"
    text = path.read_text()
    path.write_text(text[:-25])  # the machine died in the middle of the last point's last line
    torn_point = csv_rows(path)[-1]["point"]
    real, calls = sweep_run.evaluate_point, []
    monkeypatch.setattr(sweep_run, "evaluate_point", lambda p: (calls.append(p.key), real(p))[1])
    result = run_sweep(spec, tmp_path / "out", workers=1, progress=False, plots=False)
    assert calls == [torn_point] and result.skipped == 5
    assert_complete(path, 6)


def test_killed_sweep_loses_nothing(spec_file, tmp_path):
    """SIGKILL the whole process group (parent and pool) once some points are written; the re-run finishes the rest."""
    text = SPEC.replace("prompt = [1, 2, 4]", "prompt = [1, 2, 4, 8, 16, 32]").replace("solve = true", "solve = false")
    text = text.replace('objectives = ["total_latency", "mean_ttft"]', 'objectives = ["total_latency"]')
    text = text.replace("requests = 2", "requests = [2, 300]")  # 300 requests: each point takes a moment
    path, out = spec_file(text), tmp_path / "out"
    results = out / "results.csv"
    cmd = [sys.executable, "-m", "kvbound.cli", "sweep", str(path), "--out", str(out), "--workers", "2"]
    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and len({r["point"] for r in csv_rows(results)}) >= 2:
            break
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started
    proc.wait(timeout=30)
    done_before = {r["point"] for r in read_results(results)}  # complete points only
    assert 2 <= len(done_before) < 12  # killed mid-run
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"12 points ({len(done_before)} already done, {12 - len(done_before)} run)" in proc.stdout
    assert_complete(results, 12)


# ------------------------------------------------------------------------------ the Ray backend

def test_ray_backend_gives_the_local_table(spec_file, tmp_path):
    pytest.importorskip("ray")
    spec = load_spec(spec_file())
    local = run_sweep(spec, tmp_path / "local", backend="local", workers=2, progress=False, plots=False)
    ray_run = run_sweep(spec, tmp_path / "ray", backend="ray", workers=2, progress=False, plots=False)
    assert ray_run.ran == 6
    assert comparable(ray_run.rows) == comparable(local.rows)
    assert_complete(tmp_path / "ray" / "results.csv", 6)


# ------------------------------------------------------------------------------ the shipped specs

@pytest.mark.parametrize("name, points", [("fig15", 11), ("mix46", 6), ("memory", 9)])
def test_shipped_specs_run(tmp_path, name, points):
    """Each shipped spec parses and runs end to end (heuristics only here: the solver is what takes minutes)."""
    spec = load_spec(REPO / "sweeps" / f"{name}.toml")
    assert spec.solve and len(spec.points()) == points
    spec.solve = False
    result = run_sweep(spec, tmp_path, workers=2, progress=False)
    assert result.ran == points and len(result.plots) == len(spec.plots)
    assert all(r["status"] in ("ok", "refused") for r in result.rows)
