"""The synthetic workload generator (kvbound/generate.py) and `kvbound generate`."""
from __future__ import annotations

import math
import shlex
from pathlib import Path

import numpy as np
import pytest

from kvbound import load_case
from kvbound.cli import main
from kvbound.costs import PRESETS
from kvbound.fileio import write_user_file
from kvbound.generate import (
    OUTPUT_LOG_MU,
    OUTPUT_LOG_SIGMA,
    PROMPT_LOG_MU,
    PROMPT_LOG_SIGMA,
    TRACE_OUTPUT_MAX,
    TRACE_OUTPUT_MEAN,
    TRACE_PROMPT_MAX,
    TRACE_PROMPT_MEAN,
    TRACE_RATE,
    generate_case_text,
    generate_requests,
    max_output,
    max_prompt,
    shipped_cases,
)

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "cases"
TRACE = ROOT.parent / "shared" / "data" / "traces" / "splitwise_conv.csv"

# Tolerances of the statistics test (20,000 draws with no clipping in effect):
LOG_TOL = 0.03  # |sample mean / sd of ln length - the constant|; the standard error is about 0.007
MEAN_REL_TOL = 0.15  # |sample mean length / the trace's mean - 1|; the lognormal's own mean is 7% (prompt) / 4% (output) off
RATE_REL_TOL = 0.05  # |mean inter-arrival gap * rate - 1|


def _lengths(reqs):
    return np.array([r.prompt for r in reqs]), np.array([r.output for r in reqs]), np.array([r.arrival for r in reqs])


def test_same_seed_same_text_and_different_seed_differs():
    a = generate_case_text(60, 7, rate=3.0, kv_capacity=20_000)
    b = generate_case_text(60, 7, rate=3.0, kv_capacity=20_000)
    c = generate_case_text(60, 8, rate=3.0, kv_capacity=20_000)
    assert a == b
    assert a != c
    assert generate_requests(60, 7, rate=3.0, kv_capacity=20_000) == generate_requests(60, 7, rate=3.0, kv_capacity=20_000)


def test_cli_writes_a_case_that_loads(tmp_path):
    out = tmp_path / "g.toml"
    assert main(["generate", "--requests", "25", "--seed", "3", "--rate", "2.5", "--kv-capacity", "9000",
                 "--max-batch-tokens", "2048", "--preset", "llama2-7b-h100", "--out", str(out)]) == 0
    inst = load_case(out)
    assert len(inst) == 25
    assert inst.system.kv_capacity == 9000 and inst.system.max_batch_tokens == 2048
    assert inst.cost == PRESETS["llama2-7b-h100"]
    assert inst.name == "synthetic-25-seed3"
    assert "kvbound generate --requests 25 --seed 3" in inst.description
    arrivals = inst.arrivals
    assert arrivals[0] == 0.0 and (np.diff(arrivals) >= 0).all() and arrivals[-1] > 0
    assert out.read_text() == generate_case_text(25, 3, rate=2.5, kv_capacity=9000, max_batch_tokens=2048,
                                                 preset="llama2-7b-h100", out=str(out))
    # no temporary file is left beside the output
    assert [p.name for p in tmp_path.iterdir()] == ["g.toml"]


def test_offline_without_rate(tmp_path):
    out = tmp_path / "offline.toml"
    assert main(["generate", "--requests", "10", "--seed", "1", "--out", str(out)]) == 0
    inst = load_case(out)
    assert inst.offline
    assert "arrival" not in out.read_text()


@pytest.mark.parametrize("kv_capacity,context", [(100_000, 4096), (300, 4096), (100_000, 256), (5, 4096), (1, 2)])
def test_lengths_within_bounds(kv_capacity, context):
    reqs = generate_requests(2000, 11, kv_capacity=kv_capacity, context=context)
    p, o, _ = _lengths(reqs)
    top = max_prompt(kv_capacity, context)
    assert top == min(TRACE_PROMPT_MAX, context - 1, kv_capacity)
    assert p.min() >= 1 and p.max() <= top
    assert o.min() >= 1 and (o <= max_output(p, kv_capacity, context)).all() and o.max() <= TRACE_OUTPUT_MAX
    assert (p + o - 1 <= kv_capacity).all()  # peak KV fits M
    assert (p + o <= context).all()
    if kv_capacity >= 300 and context >= 256:
        assert p.max() == top  # the clip is reached: the bound is the tight one
    load_text = generate_case_text(50, 11, kv_capacity=kv_capacity, context=context)
    import tomllib

    from kvbound.io.cases import parse_case

    assert len(parse_case(tomllib.loads(load_text))) == 50  # passes the case validation (peak KV <= M)


def test_statistics_are_trace_like():
    n = 20_000
    reqs = generate_requests(n, 2024, rate=TRACE_RATE, kv_capacity=10**7, context=10**7)
    p, o, a = _lengths(reqs)
    lp, lo = np.log(p), np.log(o)
    msg = (f"ln prompt mean {lp.mean():.4f} sd {lp.std():.4f}, ln output mean {lo.mean():.4f} sd {lo.std():.4f}, "
           f"prompt mean {p.mean():.1f}, output mean {o.mean():.1f}")
    assert abs(lp.mean() - PROMPT_LOG_MU) < LOG_TOL, msg
    assert abs(lp.std() - PROMPT_LOG_SIGMA) < LOG_TOL, msg
    assert abs(lo.mean() - OUTPUT_LOG_MU) < LOG_TOL, msg
    assert abs(lo.std() - OUTPUT_LOG_SIGMA) < LOG_TOL, msg
    assert abs(p.mean() / TRACE_PROMPT_MEAN - 1) < MEAN_REL_TOL, msg
    assert abs(o.mean() / TRACE_OUTPUT_MEAN - 1) < MEAN_REL_TOL, msg
    gap = np.diff(a).mean()
    assert abs(gap * TRACE_RATE - 1) < RATE_REL_TOL, f"mean gap {gap}"


@pytest.mark.skipif(not TRACE.exists(), reason=f"trace not found at {TRACE} (../shared/data/traces is absent)")
def test_constants_match_the_trace():
    data = np.loadtxt(TRACE, delimiter=",", skiprows=1)
    t, p, o = data.T
    assert len(data) == 19_366
    assert math.isclose(np.log(p).mean(), PROMPT_LOG_MU, abs_tol=1e-3)
    assert math.isclose(np.log(p).std(), PROMPT_LOG_SIGMA, abs_tol=1e-3)
    assert math.isclose(np.log(o).mean(), OUTPUT_LOG_MU, abs_tol=1e-3)
    assert math.isclose(np.log(o).std(), OUTPUT_LOG_SIGMA, abs_tol=1e-3)
    assert math.isclose(p.mean(), TRACE_PROMPT_MEAN, abs_tol=0.1)
    assert math.isclose(o.mean(), TRACE_OUTPUT_MEAN, abs_tol=0.1)
    assert p.max() == TRACE_PROMPT_MAX and o.max() == TRACE_OUTPUT_MAX
    assert math.isclose(len(t) / (t[-1] - t[0]), TRACE_RATE, rel_tol=1e-4)


def test_sample200_is_the_generators_output_for_its_recorded_command(tmp_path, monkeypatch):
    path = CASES / "sample200.toml"
    text = path.read_text()
    inst = load_case(path)
    assert len(inst) == 200
    marker = "Written by: "
    assert marker in inst.description
    argv = shlex.split(inst.description.split(marker, 1)[1])
    assert argv[:2] == ["kvbound", "generate"]
    out = argv[argv.index("--out") + 1]
    assert out == "cases/sample200.toml"
    # run exactly the recorded command from a scratch "repository root"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cases").mkdir()
    assert main(argv[1:]) == 0
    assert (tmp_path / out).read_text() == text


def test_shipped_families_are_generated():
    """cases/fig15 and cases/mix46 are exactly what `python -m kvbound.generate --shipped cases` writes."""
    expected = shipped_cases()
    assert len(expected) == 11 + 6 + 1  # the Figure 15 family, six mixes, and the 32-request SISO + LISO mix
    on_disk = {str(p.relative_to(CASES)): p.read_text() for d in ("fig15", "mix46") for p in (CASES / d).glob("*.toml")}
    assert sorted(on_disk) == sorted(expected)
    for rel, text in expected.items():
        assert on_disk[rel] == text, f"cases/{rel} differs from the generator's output"


@pytest.mark.parametrize("argv,field", [
    (["--requests", "0", "--seed", "1"], "--requests"),
    (["--requests", "5", "--seed", "-1"], "--seed"),
    (["--requests", "5", "--seed", "1", "--rate", "0"], "--rate"),
    (["--requests", "5", "--seed", "1", "--rate", "nan"], "--rate"),
    (["--requests", "5", "--seed", "1", "--kv-capacity", "0"], "--kv-capacity"),
    (["--requests", "5", "--seed", "1", "--preset", "nope"], "--preset"),
    (["--requests", "5", "--seed", "1", "--context", "1"], "--context"),
])
def test_bad_options_are_one_error_line(tmp_path, capsys, argv, field):
    out = tmp_path / "x.toml"
    assert main(["generate", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and field in err, err
    assert not out.exists()


def test_unwritable_output_is_an_error(tmp_path, capsys):
    out = tmp_path / "missing-dir" / "x.toml"
    assert main(["generate", "--requests", "3", "--seed", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(out) in err and "Traceback" not in err


def test_write_text_atomic_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text("old\n")
    write_user_file(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.toml"]
