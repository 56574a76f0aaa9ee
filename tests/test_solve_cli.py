"""The CLI contract of `kvbound solve`, `kvbound bound` and `kvbound prove` (issue 3), on tiny cases.

Every number printed is checked against the validator (schedules) or the brute-force oracle
(optima and bounds); verdicts must agree with the evidence printed beside them.
"""
from __future__ import annotations

import json
import math

import pytest

from kvbound import load_case, run_scheduler, validate
from kvbound.io.schedules import schedule_from_json
from kvbound.objective import Objective
from tests.conftest import FIG15_TINY as FIG15
from tests.oracle import brute_force

SOLVE_KEYS = {"status", "objective_name", "objective", "lower_bound", "bound_certified", "gap", "solver",
              "formulation", "seconds", "schedule"}
VERDICTS = {"proved", "refuted", "unknown"}
TL = "30"  # seconds; the tiny cases solve in well under a second

#: two requests, round costs; offline; the optimum evicts nothing
SMALL = """
name = "small"
[system]
kv_capacity = 6
max_batch_tokens = 4
[cost]
intercept = 1.0
per_token = 0.1
decode_kv = 0.01
prefill_attention = 0.001
[[requests]]
prompt = 3
output = 2
[[requests]]
prompt = 2
output = 2
"""


#: a late arrival, block size 2, P < C
ONLINE = """
name = "online"
[system]
kv_capacity = 6
max_batch_tokens = 4
max_prefill_tokens = 3
block_size = 2
[cost]
intercept = 1.0
per_token = 0.1
decode_kv = 0.01
prefill_attention = 0.001
[[requests]]
prompt = 3
output = 2
[[requests]]
prompt = 2
output = 1
arrival = 4.0
"""


@pytest.fixture
def case(write_file):
    def make(text: str = SMALL, name: str = "case.toml"):
        return write_file(name, text)

    return make


def one_json(out: str) -> dict:
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def assert_one_error_line(rc, out, err):
    assert rc == 2, (rc, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


def solve_json(cli, path, *extra):
    rc, out, err = cli("solve", path, "--json", "--time-limit", TL, *extra)
    assert (rc, err) == (0, ""), err
    return one_json(out)


def check_schedule_json(instance, data: dict, objective: str) -> float:
    """The printed schedule validates and its objective is exactly the printed one."""
    sched = schedule_from_json(data["schedule"])
    value = Objective(objective).of(validate(instance, sched).metrics)
    assert value == data["objective"]
    return value


# ------------------------------------------------------------------------------ solve

@pytest.mark.parametrize("objective", ["total_latency", "mean_latency", "mean_ttft"])
@pytest.mark.parametrize("solver", ["highs", "cpsat", "cbc"])
def test_solve_json_contract(cli, case, solver, objective):
    path = case(FIG15)
    data = solve_json(cli, path, "--solver", solver, "--objective", objective)
    assert SOLVE_KEYS <= set(data)
    assert data["status"] == "optimal"
    assert data["objective_name"] == objective and data["solver"] == solver
    assert data["formulation"] in ("bigm", "network", "chain")
    assert isinstance(data["seconds"], float) and data["seconds"] > 0
    assert data["bound_certified"] is True
    instance = load_case(path)
    value = check_schedule_json(instance, data, objective)
    opt = brute_force(instance, objective).value
    assert value == pytest.approx(opt, rel=1e-6)
    assert isinstance(data["lower_bound"], float) and data["lower_bound"] <= opt * (1 + 1e-9)
    assert data["gap"] == pytest.approx((value - data["lower_bound"]) / value, abs=1e-12)
    assert 0 <= data["gap"] <= 1e-6


@pytest.mark.parametrize("formulation", ["bigm", "network", "chain", "auto"])
def test_solve_formulations_agree(cli, case, formulation):
    path = case(ONLINE)
    data = solve_json(cli, path, "--formulation", formulation, "--objective", "mean_latency")
    assert data["formulation"] == formulation if formulation != "auto" else data["formulation"] in ("bigm", "network", "chain")
    instance = load_case(path)
    assert data["status"] == "optimal"
    assert check_schedule_json(instance, data, "mean_latency") == pytest.approx(
        brute_force(instance, "mean_latency").value, rel=1e-6)


def test_solve_no_evict(cli, case):
    path = case(FIG15)
    instance = load_case(path)
    free = solve_json(cli, path)
    tied = solve_json(cli, path, "--no-evict")
    assert free["status"] == tied["status"] == "optimal"
    assert not any(b["evict"] for b in tied["schedule"]["batches"])
    assert check_schedule_json(instance, tied, "total_latency") == pytest.approx(
        brute_force(instance, "total_latency", allow_evict=False).value, rel=1e-6)
    assert free["objective"] < tied["objective"] * (1 - 1e-6)  # evicting pays on this case
    assert any(b["evict"] for b in free["schedule"]["batches"])


def test_solve_out_writes_a_schedule_validate_accepts(cli, case, tmp_path):
    path = case(ONLINE)
    out_file = tmp_path / "best.json"
    data = solve_json(cli, path, "--out", out_file, "--objective", "mean_ttft")
    assert out_file.is_file()
    assert json.loads(out_file.read_text()) == data["schedule"]
    rc, out, err = cli("validate", path, out_file, "--json")
    assert (rc, err) == (0, "")
    report = one_json(out)
    assert report["valid"] is True
    assert report["metrics"]["mean_ttft"] == data["objective"]


def test_solve_text_output(cli, case, tmp_path):
    out_file = tmp_path / "s.json"
    rc, out, err = cli("solve", case(), "--time-limit", TL, "--out", out_file)
    assert (rc, err) == (0, "")
    for word in ("status", "optimal", "objective", "lower bound", "certified", "horizon", "warm start"):
        assert word in out
    assert out_file.is_file()


@pytest.mark.parametrize("formulation", ["bigm", "network", "chain"])
def test_solve_export_mps_and_lp(cli, case, tmp_path, formulation):
    import highspy

    path = case()
    mps, lp = tmp_path / "model.mps", tmp_path / "model.lp"
    a = solve_json(cli, path, "--export", mps, "--formulation", formulation)
    b = solve_json(cli, path, "--export", lp, "--formulation", formulation)
    assert a["status"] == b["status"] == "optimal"
    text = mps.read_text()
    assert text.strip()
    sections = [line.split()[0] for line in text.splitlines() if line and not line[0].isspace()]
    for name in ("ROWS", "COLUMNS", "RHS", "ENDATA"):
        assert name in sections, sections
    assert "MARKER" in text  # integer columns are marked
    lp_text = lp.read_text()
    assert lp_text.strip()
    low = lp_text.lower()
    assert "minimize" in low and "subject to" in low and ("generals" in low or "binaries" in low)
    # another solver reading the exported model finds the same optimum (offline total latency: no offset)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 1e-9)
    h.readModel(str(mps))
    h.run()
    assert h.modelStatusToString(h.getModelStatus()) == "Optimal"
    assert h.getInfo().objective_function_value == pytest.approx(a["objective"], rel=1e-6)


# ------------------------------------------------------------------------------ bound

@pytest.mark.parametrize("objective", ["total_latency", "mean_latency", "mean_ttft"])
def test_bound_json(cli, case, objective):
    path = case(FIG15)
    rc, out, err = cli("bound", path, "--json", "--time-limit", TL, "--objective", objective)
    assert (rc, err) == (0, "")
    data = one_json(out)
    assert {"bounds", "best"} <= set(data)
    assert data["bounds"], data
    opt = brute_force(load_case(path), objective).value
    certified = []
    for b in data["bounds"]:
        assert {"name", "value", "seconds"} <= set(b), b
        assert isinstance(b["name"], str) and b["name"]
        assert isinstance(b["seconds"], (int, float)) and b["seconds"] >= 0
        if b.get("certified", True) and isinstance(b["value"], (int, float)) and math.isfinite(b["value"]):
            certified.append(b["value"])
            assert b["value"] <= opt * (1 + 1e-9), b  # a bound never exceeds the optimum
            if data.get("best_known") is not None:
                assert b["value"] <= data["best_known"] * (1 + 1e-9), b
    assert data["best"] == max(certified)
    assert data["best"] <= opt * (1 + 1e-9)
    # cheapest first: the analytic bounds, then the LP relaxation, then the MILP
    names = [b["name"].lower() for b in data["bounds"]]
    assert any("lp" in n for n in names) and "milp" in names[-1]
    # the MILP on this tiny case closes the gap
    assert data["best"] == pytest.approx(opt, rel=1e-6)


def test_bound_text(cli, case):
    rc, out, err = cli("bound", case(), "--time-limit", TL)
    assert (rc, err) == (0, "")
    assert "best certified bound" in out and "MILP" in out


# ------------------------------------------------------------------------------ prove

def check_better_than(data: dict, instance, objective: str, scheduler: str, by: float):
    assert data["verdict"] in VERDICTS and data["hypothesis"] and data["reason"]
    ev = data["evidence"]
    reference = Objective(objective).of(run_scheduler(instance, scheduler).replay.metrics)
    assert ev["reference"]["objective"] == pytest.approx(reference, rel=1e-12)
    target = ev["target"]
    assert target == pytest.approx(reference * (1 - by / 100), rel=1e-12)
    opt = ev["optimum"]
    if data["verdict"] == "proved":
        # a validated witness at or below the target
        sched = schedule_from_json(opt["schedule"])
        value = Objective(objective).of(validate(instance, sched).metrics)
        assert value == opt["objective"] and value <= target * (1 + 1e-9)
        if by <= 0:  # "better by 0%" means strictly better
            assert value < target
    elif data["verdict"] == "refuted":
        assert opt["bound_certified"] is True
        assert opt["lower_bound"] >= target * (1 - 1e-9) if by <= 0 else opt["lower_bound"] > target
    # and against the oracle: the verdict is the truth when the optimum is clear of the target
    best = brute_force(instance, objective).value
    if best < target * (1 - 1e-6):
        assert data["verdict"] == "proved"
    elif best > target * (1 + 1e-6) or (by <= 0 and best >= target * (1 - 1e-9)):
        assert data["verdict"] == "refuted"
    return data["verdict"]


@pytest.mark.parametrize("scheduler, by, expected", [
    ("vllm", 5, "refuted"),  # vLLM is optimal on this case
    ("vllm", 0, "refuted"),  # ... so nothing is strictly better
    ("mcsf", 5, "proved"),  # MC-SF never evicts: evicting is 23% faster
    ("mcsf", 60, "refuted"),
])
def test_prove_better_than(cli, case, scheduler, by, expected):
    path = case(FIG15)
    rc, out, err = cli("prove", path, "--better-than", scheduler, "--by", by, "--json", "--time-limit", TL)
    assert (rc, err) == (0, "")
    assert check_better_than(one_json(out), load_case(path), "total_latency", scheduler, by) == expected


@pytest.mark.parametrize("objective", ["mean_latency", "mean_ttft"])
def test_prove_better_than_other_objectives(cli, case, objective):
    path = case(ONLINE)
    rc, out, err = cli("prove", path, "--better-than", "sarathi", "--by", "0", "--objective", objective, "--json",
                       "--time-limit", TL)
    assert (rc, err) == (0, "")
    data = one_json(out)
    verdict = check_better_than(data, load_case(path), objective, "sarathi", 0)
    # "by 0" is "strictly better": proved needs a witness strictly below the reference
    if verdict == "proved":
        assert data["evidence"]["optimum"]["objective"] < data["evidence"]["target"]


@pytest.mark.parametrize("text, strictly_better", [(FIG15, True), (SMALL, False)])
def test_prove_compare_default_vs_no_evict(cli, case, text, strictly_better):
    path = case(text)
    instance = load_case(path)
    rc, out, err = cli("prove", path, "--compare", "default", "--vs", "no-evict", "--json", "--time-limit", TL)
    assert (rc, err) == (0, "")
    data = one_json(out)
    assert data["verdict"] in VERDICTS and data["hypothesis"] and data["reason"]
    a, b = data["evidence"]["default"], data["evidence"]["no-evict"]
    for side in (a, b):
        assert side["objective"] is not None
        sched = schedule_from_json(side["schedule"])
        assert validate(instance, sched).metrics.total_latency == side["objective"]
    assert b["evictions"] == 0
    if data["verdict"] == "proved":
        assert b["bound_certified"] and a["objective"] < b["lower_bound"]
    elif data["verdict"] == "refuted":
        assert a["bound_certified"] and b["objective"] <= a["lower_bound"] * (1 + 1e-9)
    # the truth, from the oracle
    free = brute_force(instance, "total_latency").value
    tied = brute_force(instance, "total_latency", allow_evict=False).value
    assert (free < tied * (1 - 1e-9)) == strictly_better
    assert data["verdict"] == ("proved" if strictly_better else "refuted")


def test_prove_text(cli, case):
    rc, out, err = cli("prove", case(FIG15), "--compare", "default", "--vs", "no-evict", "--time-limit", TL)
    assert (rc, err) == (0, "")
    assert "verdict:" in out and "PROVED" in out


# ------------------------------------------------------------------------------ bad options

def bad(*argv):
    return pytest.param(list(argv), id=" ".join(argv[:1] + argv[2:]))


@pytest.mark.parametrize("argv", [
    bad("solve", "{case}", "--solver", "gurobi"),
    bad("solve", "{case}", "--time-limit", "0"),
    bad("solve", "{case}", "--time-limit", "-3"),
    bad("solve", "{case}", "--time-limit", "nan"),
    bad("solve", "{case}", "--warm-start", "nosuch"),
    bad("solve", "{case}", "--warm-start", "vllm,nosuch"),
    bad("solve", "{case}", "--objective", "p99"),
    bad("solve", "{case}", "--formulation", "nosuch"),
    bad("solve", "{case}", "--max-batch-size", "0"),
    bad("solve", "{case}", "--horizon", "-1"),
    bad("solve", "{case}", "--time-limit", "inf"),
    bad("solve", "{missing}"),
    bad("bound", "{case}", "--solver", "gurobi"),
    bad("bound", "{case}", "--time-limit", "0"),
    bad("prove", "{case}", "--better-than", "nosuch"),
    bad("prove", "{case}", "--better-than", "vllm", "--time-limit", "0"),
    bad("prove", "{case}", "--compare", "default"),
    bad("prove", "{case}", "--compare", "default", "--vs", "no-such-set"),
    bad("prove", "{case}", "--compare", "batch<=x", "--vs", "default"),
    bad("prove", "{case}", "--compare", "batch<=0", "--vs", "default"),
    bad("prove", "{case}"),
    bad("solve", "{case}", "--formulation", "search", "--export", "{tmp}/m.mps"),
    bad("solve", "{case}", "--formulation", "lagrangian", "--export", "{tmp}/m.lp"),
])
def test_bad_options_exit_2_with_one_error_line(cli, case, tmp_path, argv):
    path = case()
    argv = [a.format(case=path, missing=tmp_path / "missing.toml", tmp=tmp_path) for a in argv]
    assert_one_error_line(*cli(*argv))
    assert not (tmp_path / "m.mps").exists() and not (tmp_path / "m.lp").exists()


def test_json_stdout_is_only_json_whatever_the_solver_prints(tmp_path):
    # in a real process, where native code writes to file descriptor 1 (highspy 1.16 prints its
    # banner when a Highs object is made): stdout must still parse as one JSON document
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    case = tmp_path / "fig15.toml"
    case.write_text(FIG15)
    for solver in ("highs", "cpsat", "cbc"):
        proc = subprocess.run([sys.executable, "-m", "kvbound.cli", "solve", str(case), "--solver", solver,
                               "--formulation", "bigm", "--time-limit", "20", "--json"], capture_output=True, text=True,
                              cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["status"] == "optimal" and data["solver"] == solver


def kvbound_process(tmp_path, *argv, timeout=120):
    """`kvbound ARGV` in a real process (native code writes to file descriptors, which capsys does not see)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    return subprocess.run([sys.executable, "-m", "kvbound.cli", *map(str, argv)], capture_output=True, text=True,
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=timeout)


def test_solver_banners_only_with_verbose(tmp_path):
    case = tmp_path / "fig15.toml"
    # one KV slot more than Figure 15 (M = 2I + 1): the heuristics and the analytic bounds do not prove
    # it, so the model HiGHS is named for is solved (at M = 2I the exclusive-holders bound proves it
    # without one; the default solve exhausts this tiny case's states instead)
    case.write_text(FIG15.replace("kv_capacity = 4", "kv_capacity = 5"))
    quiet = kvbound_process(tmp_path, "solve", case, "--solver", "highs", "--time-limit", "20")
    assert quiet.returncode == 0 and quiet.stderr == "" and "HiGHS" not in quiet.stdout
    loud = kvbound_process(tmp_path, "solve", case, "--solver", "highs", "--time-limit", "20", "--verbose")
    assert loud.returncode == 0 and "HiGHS" in loud.stderr and "HiGHS" not in loud.stdout


def test_an_export_not_written_is_said_and_fails(tmp_path):
    # the model cannot be built within 2 s here: the result is printed, then one error line, exit 1,
    # and no file (it used to say "model written to" and exit 0)
    case = tmp_path / "fig15.toml"
    case.write_text(FIG15.replace("prompt = 2", "prompt = 1024").replace("kv_capacity = 4", "kv_capacity = 2048"))
    out = tmp_path / "m.mps"
    proc = kvbound_process(tmp_path, "solve", case, "--time-limit", "2", "--export", out, "--json")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: {out}: export: not written: time limit")
    data = json.loads(proc.stdout)
    assert data["exported"] is None and data["export_problem"].startswith("time limit") and not out.exists()


def test_an_export_is_written_where_the_heuristics_prove_the_optimum(cli, case, tmp_path):
    out = tmp_path / "m.lp"
    rc, stdout, err = cli("solve", case(), "--export", str(out), "--time-limit", TL)
    assert rc == 0 and err == "" and f"model written to {out}" in stdout and out.stat().st_size > 0


def test_constraints_no_schedule_can_meet_are_proven_infeasible_with_their_cause(cli, case):
    long_prompt = SMALL.replace("max_batch_tokens = 4", "max_batch_tokens = 4\nmax_prefill_tokens = 2")
    rc, out, err = cli("solve", case(long_prompt), "--no-chunk", "--json")
    data = one_json(out)
    assert (rc, err) == (0, "") and data["status"] == "infeasible" and data["success"]
    assert "request 0's prompt of 3 tokens exceeds P = 2" in data["message"] and data["lower_bound"] == "inf"
    rc, out, err = cli("prove", case(long_prompt), "--compare", "default", "--vs", "no-chunk", "--json")
    assert (rc, err) == (0, "") and one_json(out)["verdict"] == "proved"


def test_a_solve_not_proven_keeps_improving_until_its_limit(cli, case):
    # a horizon below the certified one leaves the model's bound conditional: not a proof, so the
    # search goes on after the model until the time limit
    # (one KV slot more than FIG15: at M = 2I the analytic bounds prove the heuristics' schedule at once)
    rc, out, err = cli("solve", case(FIG15.replace("kv_capacity = 4", "kv_capacity = 5")), "--horizon", "2",
                       "--time-limit", "4", "--json")
    data = one_json(out)
    assert (rc, err) == (0, "") and data["status"] == "feasible" and not data["bound_certified"]
    assert data["seconds"] >= 3.5 and data["stats"]["search"].startswith("after the model")


def test_a_short_limit_on_a_large_case_still_returns_a_schedule(cli, shared_data):
    # the first 1,000 conversation requests: each heuristic takes over a second here, and the analytic
    # bounds almost one; until one has made a schedule each may use the whole limit (at 5 s the
    # heuristics' half-share ended before the first one finished: "objective n/a")
    from tests.conftest import REPO

    rc, out, err = cli("solve", str(REPO / "cases" / "splitwise_conv_1000.toml"), "--time-limit", "5", "--json")
    data = one_json(out)
    assert (rc, err) == (0, "") and data["status"] == "feasible" and data["objective"] is not None
    assert data["seconds"] <= 5 + 2
