"""Hostile input through the CLI (issue 13): every bad number, path or file ends in one `error:` line,
exit status 2, no traceback, nothing written; a bad output path is refused before any work."""
from __future__ import annotations

import os
import stat
import time

import pytest

from tests.conftest import FIG15_TINY, REPO

EXAMPLE = REPO / "cases" / "example.toml"
CASE = """
[system]
kv_capacity = {M}
max_batch_tokens = 64
[cost]
{cost}
[[requests]]
prompt = {I}
output = 2
count = {N}
"""


def case_text(M="64", cost='preset = "llama2-7b-a100"', I="4", N="2") -> str:
    return CASE.format(M=M, cost=cost, I=I, N=N)


def one_error(rc, out, err, *fragments):
    assert rc == 2, (rc, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.mark.parametrize("kwargs,fragments", [
    (dict(M="18446744073709551616"), ("system.kv_capacity", "2^53")),  # >= 2^63: used to crash the solvers
    (dict(M=str(2 ** 53)), ("system.kv_capacity", "2^53")),
    (dict(N="18446744073709551616"), ("requests[0].count",)),  # count = 2^64: used to eat memory
    (dict(N="2000000"), ("requests[0].count", "1,000,000")),
    (dict(I="1000000000", M="2000000000"), ("requests[0].prompt", "16,777,216")),  # 10^9 tokens
    (dict(cost="intercept = 1e308"), ("cost.intercept", "<= 1000")),
    (dict(cost="intercept = 0.01\nper_token = 1e308"), ("cost.per_token",)),
    (dict(cost="intercept = 0.01\nper_token = inf"), ("cost.per_token", "finite")),
])
@pytest.mark.parametrize("command", ["simulate", "solve", "bound", "compare", "prove"])
def test_case_numbers_beyond_the_limits_are_refused(cli, write_file, kwargs, fragments, command):
    path = write_file("c.toml", case_text(**kwargs))
    extra = {"simulate": ["--scheduler", "vllm"], "prove": ["--better-than", "vllm"]}.get(command, [])
    t0 = time.monotonic()
    one_error(*cli(command, path, *extra), str(path), *fragments)
    assert time.monotonic() - t0 < 5


def test_arrivals_beyond_the_limit_are_refused(cli, write_file):
    path = write_file("c.toml", case_text() + "arrival = 1e300\n")
    one_error(*cli("simulate", path, "--scheduler", "vllm"), "arrival", "<= 1e+09")


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_special_files_are_not_read(cli, tmp_path, special):
    if special == "fifo":
        path = tmp_path / "case.toml"
        os.mkfifo(path)
    elif special == "folder":
        path = tmp_path
    else:
        path = special
    t0 = time.monotonic()
    one_error(*cli("simulate", path, "--scheduler", "vllm"), "cannot read file")
    one_error(*cli("validate", EXAMPLE, path), "cannot read file")
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("argv,fragments", [
    (["prove", EXAMPLE, "--better-than", "vllm", "--by", "nan"], ("--by",)),
    (["prove", EXAMPLE, "--better-than", "vllm", "--by", "1e308"], ("--by", "100")),
    (["prove", EXAMPLE, "--better-than", "vllm", "--by", "100"], ("--by",)),
    (["prove", EXAMPLE, "--better-than", "vllm", "--by", "-5"], ("--by",)),
    (["solve", EXAMPLE, "--time-limit", "1e308"], ("--time-limit", "1e+06")),
    (["solve", EXAMPLE, "--time-limit", "inf"], ("--time-limit",)),
    (["solve", EXAMPLE, "--horizon", str(2 ** 64)], ("--horizon",)),
    (["solve", EXAMPLE, "--max-batch-size", "1e3"], ("--max-batch-size",)),
    (["generate", "--requests", "5", "--seed", "1", "--rate", "1e-308", "--out", "x.toml"], ("--rate",)),
    (["generate", "--requests", "5", "--seed", "1", "--rate", "1e308", "--out", "x.toml"], ("--rate",)),
    (["generate", "--requests", "5", "--seed", str(2 ** 40), "--out", "x.toml"], ("--seed",)),
    (["generate", "--requests", str(2 ** 64), "--seed", "1", "--out", "x.toml"], ("--requests",)),
    (["generate", "--requests", "5", "--seed", "1", "--kv-capacity", str(2 ** 63), "--out", "x.toml"], ("--kv-capacity",)),
    (["calibrate", "p.csv", "--out", "x.toml", "--seed", "-1"], ("--seed",)),
    (["simulate", EXAMPLE, "--scheduler", "sarathi:prefill_limit=1e308"], ("prefill_limit", "below 2^53")),
    (["simulate", EXAMPLE, "--scheduler", "fcfs-protect:alpha=nan"], ("alpha", "finite")),
])
def test_bad_flags_are_one_error_line(cli, tmp_path, monkeypatch, argv, fragments):
    monkeypatch.chdir(tmp_path)
    one_error(*cli(*argv), *fragments)
    assert not (tmp_path / "x.toml").exists()


def test_a_profile_with_huge_numbers_is_refused(cli, write_file):
    header = "batches,tokens,decode_kv,prefill_attention,prefill_kv,prefill_requests,seconds\n"
    rows = "".join(f"1,{k + 1},0,0,0,1,0.01\n" for k in range(20)) + "1,1e308,0,0,0,1,0.01\n"
    path = write_file("p.csv", header + rows)
    one_error(*cli("calibrate", path, "--out", write_file("x", "").parent / "cost.toml"), "tokens", "<=")


SWEEP = """
name = "hostile"
[grid]
prompt = [{I}]
output = [2]
requests = [{N}]
kv_capacity = ["2*I + O"]
max_batch_tokens = [64]
[run]
schedulers = ["vllm"]
"""


@pytest.mark.parametrize("I,N,fragments", [
    ('"9**9**9**9"', "1", ("grid.prompt", "too large")),
    ('"2**2**2**2**2**2"', "1", ("grid.prompt",)),
    ("18446744073709551616", "1", ("grid.prompt",)),
    ("4", "18446744073709551616", ("grid.requests",)),
    ("4", '"10**12"', ("grid.requests", "1,000,000")),
])
def test_sweep_values_are_evaluated_within_limits(cli, write_file, tmp_path, I, N, fragments):
    spec = write_file("s.toml", SWEEP.format(I=I, N=N))
    t0 = time.monotonic()
    one_error(*cli("sweep", spec, "--out", tmp_path / "res", "--workers", "1"), *fragments)
    assert time.monotonic() - t0 < 5
    assert not (tmp_path / "res").exists()


# ------------------------------------------------------------------------------ output paths

def _bad_paths(tmp_path, suffix):
    """(path, what the error says) for each kind of bad output path, with the file suffix a command needs."""
    locked = tmp_path / "locked"
    locked.mkdir(exist_ok=True)
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    folder = tmp_path / f"folder{suffix}"
    folder.mkdir(exist_ok=True)
    paths = {"missing folder": (tmp_path / "nope" / f"x{suffix}", "does not exist"),
             "a folder": (folder, "is a folder")}
    if os.geteuid() != 0:  # root writes anywhere
        paths["unwritable"] = (locked / f"x{suffix}", "cannot write")
    return paths


#: command -> (the suffix its output needs, argv given the bad path and the test folder)
COMMANDS = {
    "simulate --out": (".json", lambda bad, d: ["simulate", EXAMPLE, "--scheduler", "vllm", "--out", bad]),
    "solve --out": (".json", lambda bad, d: ["solve", EXAMPLE, "--time-limit", "5", "--out", bad]),
    "solve --export": (".mps", lambda bad, d: ["solve", EXAMPLE, "--time-limit", "5", "--export", bad]),
    "export --out": (".json", lambda bad, d: ["export", d / "s.json", "--case", EXAMPLE, "--out", bad]),
    "import --out": (".json", lambda bad, d: ["import", d / "s.json", "--case", EXAMPLE, "--out", bad]),
    "plot --out": (".png", lambda bad, d: ["plot", d / "s.json", "--case", EXAMPLE, "--out", bad]),
    "compare --plot": (".png", lambda bad, d: ["compare", EXAMPLE, "--plot", bad]),
    "calibrate --plot": (".png", lambda bad, d: ["calibrate", d / "s.json", "--out", d / "c.toml", "--plot", bad]),
    "generate --out": (".toml", lambda bad, d: ["generate", "--requests", "3", "--seed", "1", "--out", bad]),
    "sweep --out": ("", lambda bad, d: ["sweep", d / "s.toml", "--out", bad / "res" if bad.is_dir() else bad]),
}


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "sweep --out"])
def test_bad_output_paths_are_refused_before_any_work(cli, tmp_path, command):
    assert cli("simulate", EXAMPLE, "--scheduler", "vllm", "--out", tmp_path / "s.json")[0] == 0
    suffix, argv = COMMANDS[command]
    paths = _bad_paths(tmp_path, suffix)
    before = set(os.listdir(tmp_path))
    for what, (bad, fragment) in paths.items():
        t0 = time.monotonic()
        rc, out, err = cli(*argv(bad, tmp_path))
        one_error(rc, out, err, fragment)
        assert out == "", (what, out)
        assert time.monotonic() - t0 < 3, f"{command} {what}: the path was not checked before the work"
    assert set(os.listdir(tmp_path)) == before  # nothing half-written, no temporary file
    assert os.listdir(tmp_path / f"folder{suffix}") == []


def test_sweep_out_that_is_a_file_is_refused(cli, write_file, tmp_path):
    spec = write_file("s.toml", SWEEP.format(I="4", N="1"))
    one_error(*cli("sweep", spec, "--out", spec, "--workers", "1"), "not a folder")


@pytest.mark.parametrize("argv,fragment", [
    (["solve", EXAMPLE, "--export", "m.txt"], ".mps, .lp"),
    (["compare", EXAMPLE, "--plot", "f.gif"], ".png, .svg, .pdf"),
    (["calibrate", "p.csv", "--out", "c.toml", "--plot", "f.gif"], ".png, .svg, .pdf"),
])
def test_output_formats_are_named_by_suffix(cli, tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    one_error(*cli(*argv), fragment)
    assert os.listdir(tmp_path) == []


def test_solve_export_writes_lp_atomically(cli, tmp_path):
    rc, out, err = cli("solve", EXAMPLE, "--time-limit", "10", "--export", tmp_path / "m.lp", "--json")
    assert rc == 0, err
    assert (tmp_path / "m.lp").read_text().lstrip().startswith(("\\*", "Minimize", "MINIMIZE", "\\"))
    assert sorted(os.listdir(tmp_path)) == ["m.lp"]


def test_duplicate_schedulers_give_one_row(cli):
    import json

    rc, out, err = cli("compare", EXAMPLE, "--schedulers", "vllm,vllm,sarathi", "--json")
    assert rc == 0, err
    assert [r["scheduler"] for r in json.loads(out)["rows"]] == ["vllm", "sarathi"]


def test_tiny_case_still_solves(cli, write_file):
    rc, out, err = cli("solve", write_file("t.toml", FIG15_TINY), "--time-limit", "10")
    assert rc == 0 and "optimal" in out, err
