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


# ------------------------------------------------------------------------------ issue 34: nothing lost, nothing dropped

def _unchanged(paths: dict) -> None:
    for path, content in paths.items():
        assert path.read_bytes() == content, f"{path} was changed"


@pytest.fixture
def files(cli, tmp_path):
    """A case, its schedule (also named s.png), the precomputed form and a profile, in tmp_path."""
    import shutil

    case = tmp_path / "c.toml"
    shutil.copy(EXAMPLE, case)
    assert cli("simulate", case, "--scheduler", "vllm", "--out", tmp_path / "s.json")[0] == 0
    shutil.copy(tmp_path / "s.json", tmp_path / "s.png")
    assert cli("export", tmp_path / "s.json", "--case", case, "--out", tmp_path / "p.json")[0] == 0
    header = "batches,tokens,decode_kv,prefill_attention,prefill_kv,prefill_requests,seconds\n"
    (tmp_path / "prof.csv").write_text(header + "".join(f"1,{k + 1},0,0,0,1,{0.01 + 1e-4 * k}\n" for k in range(20)))
    return tmp_path


#: argv (given the folder of `files`) whose output is one of its inputs; the field and the input the error names
SAME_FILE = {
    "simulate --out CASE": (lambda d: ["simulate", d / "c.toml", "--scheduler", "vllm", "--out", d / "c.toml"],
                            "--out", "case file"),
    "solve --out CASE": (lambda d: ["solve", d / "c.toml", "--time-limit", "5", "--out", d / "c.toml"],
                         "--out", "case file"),
    "export --out SCHEDULE": (lambda d: ["export", d / "s.json", "--case", d / "c.toml", "--out", d / "s.json"],
                              "--out", "schedule"),
    "export --out CASE": (lambda d: ["export", d / "s.json", "--case", d / "c.toml", "--out", d / "c.toml"],
                          "--out", "case file"),
    "import --out PRECOMPUTED": (lambda d: ["import", d / "p.json", "--case", d / "c.toml", "--out", d / "p.json"],
                                 "--out", "precomputed schedule"),
    "plot --out SCHEDULE": (lambda d: ["plot", d / "s.png", "--case", d / "c.toml", "--out", d / "s.png"],
                            "--out", "schedule"),
    "calibrate --out PROFILE": (lambda d: ["calibrate", d / "prof.csv", "--out", d / "prof.csv"], "--out", "profile"),
    "calibrate --plot PROFILE": (lambda d: ["calibrate", d / "prof.csv", "--out", d / "x.toml", "--plot",
                                            d / "prof.csv"], "--plot", "profile"),
    "compare --plot CASE": (lambda d: ["compare", d / "c.toml", "--plot", d / "c.toml"], "--plot", "case file"),
    "replay --plot SCHEDULE": (lambda d: ["replay", d / "c.toml", d / "s.png", "--plot", d / "s.png"], "--plot",
                               "schedule"),
    "replay --plot COST": (lambda d: ["replay", d / "c.toml", d / "s.json", "--cost", d / "c.toml", "--plot",
                                      d / "c.toml"], "--plot", "case file"),
    "simulate --out LINK": (lambda d: ["simulate", d / "c.toml", "--scheduler", "vllm", "--out", d / "link.json"],
                            "--out", "case file"),
    "simulate --out HARD LINK": (lambda d: ["simulate", d / "c.toml", "--scheduler", "vllm", "--out",
                                            d / "hard.json"], "--out", "case file"),
    "simulate --out ../CASE": (lambda d: ["simulate", d / "c.toml", "--scheduler", "vllm", "--out",
                                          d / "sub" / ".." / "c.toml"], "--out", "case file"),
    "solve --export = --out": (lambda d: ["solve", d / "c.toml", "--time-limit", "5", "--export", d / "m.lp",
                                          "--out", d / "m.lp"], "--export", "--out"),
}


@pytest.mark.parametrize("name", SAME_FILE)
def test_an_output_that_is_an_input_is_refused_before_any_work(cli, files, name):
    """Issue 34: `simulate my.toml --out my.toml` (and six more) silently destroyed the input, exit 0."""
    (files / "sub").mkdir()
    (files / "link.json").symlink_to(files / "c.toml")
    os.link(files / "c.toml", files / "hard.json")
    argv, field, what = SAME_FILE[name]
    before = {p: p.read_bytes() for p in files.iterdir() if p.is_file()}
    t0 = time.monotonic()
    rc, out, err = cli(*argv(files))
    one_error(rc, out, err, field, what)
    assert out == "" and time.monotonic() - t0 < 3
    if what != "--out":
        assert "an input of this command" in err
    _unchanged(before)
    assert sorted(p.name for p in files.iterdir()) == sorted(p.name for p in before) + ["sub"]


def test_an_output_over_the_cases_trace_is_refused(cli, write_file, tmp_path):
    trace = write_file("t.json", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,3,3\n1,4,2\n")
    case = write_file("c.toml", case_text().split("[[requests]]")[0] + '[workload]\ntrace = "t.json"\n')
    before = trace.read_bytes()
    one_error(*cli("simulate", case, "--scheduler", "vllm", "--out", trace), "--out", "trace", "an input")
    assert trace.read_bytes() == before


def test_a_sweep_never_writes_over_its_spec_or_cases(cli, write_file, tmp_path):
    spec = write_file("res/results.csv", SWEEP.format(I="4", N="1"))
    before = spec.read_bytes()
    one_error(*cli("sweep", spec, "--out", tmp_path / "res", "--workers", "1"), "--out", "sweep spec")
    assert spec.read_bytes() == before and os.listdir(tmp_path / "res") == ["results.csv"]


@pytest.mark.parametrize("argv,field", [
    (["simulate", EXAMPLE, "--scheduler", "vllm", "--out", ""], "--out"),
    (["solve", EXAMPLE, "--out", ""], "--out"),
    (["solve", EXAMPLE, "--export", ""], "--export"),
    (["compare", EXAMPLE, "--plot", ""], "--plot"),
    (["calibrate", "p.csv", "--out", "c.toml", "--plot", ""], "--plot"),
    (["calibrate", "p.csv", "--out", ""], "--out"),
    (["generate", "--requests", "3", "--seed", "1", "--out", ""], "--out"),
    (["profile", "--shape", "tiny", "--out", ""], "--out"),
    (["replay", EXAMPLE, "s.json", "--plot", ""], "--plot"),
    (["sweep", "s.toml", "--out", ""], "--out"),
    (["export", "s.json", "--case", EXAMPLE, "--out", ""], "--out"),
    (["import", "p.json", "--case", EXAMPLE, "--out", " "], "--out"),
    (["plot", "s.json", "--case", EXAMPLE, "--out", ""], "--out"),
])
def test_an_empty_output_path_is_an_error(cli, tmp_path, monkeypatch, argv, field):
    """Issue 34: `--out ''` was silently ignored (the result never written, exit 0)."""
    monkeypatch.chdir(tmp_path)
    one_error(*cli(*argv), f"error: {field}: is empty")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv,suffixes", [
    (["simulate", EXAMPLE, "--scheduler", "vllm", "--out", "s.toml"], ".json"),
    (["solve", EXAMPLE, "--out", "s.csv"], ".json"),
    (["export", "s.json", "--case", EXAMPLE, "--out", "paper.toml"], ".json"),
    (["import", "p.json", "--case", EXAMPLE, "--out", "s.png"], ".json"),
    (["plot", "s.json", "--case", EXAMPLE, "--out", "chart.json"], ".png, .svg, .pdf"),
    (["generate", "--requests", "3", "--seed", "1", "--out", "case.json"], ".toml"),
    (["profile", "--shape", "tiny", "--out", "p.json"], ".csv"),
    (["calibrate", "p.csv", "--out", "cost.json"], ".toml"),
    (["replay", EXAMPLE, "s.json", "--plot", "r.gif"], ".png, .svg, .pdf"),
])
def test_an_output_suffix_must_name_what_is_written(cli, tmp_path, monkeypatch, argv, suffixes):
    monkeypatch.chdir(tmp_path)
    one_error(*cli(*argv), "--out" if "--out" in argv else "--plot", f"must end in {suffixes}")
    assert os.listdir(tmp_path) == []


# traces: arrivals as given, shifted by the earliest, in arrival order

TRACE_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _trace_requests(cli, write_file, rows: str, extra: str = ""):
    import json

    write_file("t.csv", TRACE_HEADER + rows)
    case = write_file("c.toml", case_text(M="1000").split("[[requests]]")[0] + f'[workload]\ntrace = "t.csv"\n{extra}')
    rc, out, err = cli("simulate", case, "--scheduler", "vllm", "--json")
    assert rc == 0, err
    return [(r["prompt"], r["output"], r["arrival"]) for r in json.loads(out)["schedule"]["requests"]]


def test_a_trace_whose_first_row_is_not_the_earliest_keeps_its_arrivals(cli, write_file):
    """Issue 34: every arrival came out 0.0 (each shifted by the first row's 5 s, then clamped at 0)."""
    assert _trace_requests(cli, write_file, "5,10,5\n1,12,5\n0,3,3\n") == [(3, 3, 0.0), (12, 5, 1.0), (10, 5, 5.0)]
    # equal arrivals keep their file order; the selected rows' earliest arrival is the zero
    rows = "9,1,1\n7,2,2\n8,3,3\n7,4,4\n2,5,5\n"
    assert _trace_requests(cli, write_file, rows, "offset = 1\nlimit = 3\ntime_scale = 2.0\n") == [
        (2, 2, 0.0), (4, 4, 0.0), (3, 3, 2.0)]


def test_a_negative_arrival_is_refused(cli, write_file):
    write_file("t.csv", TRACE_HEADER + "0,10,5\n1,12,5\n-1,3,3\n")
    case = write_file("c.toml", case_text().split("[[requests]]")[0] + '[workload]\ntrace = "t.csv"\n')
    one_error(*cli("simulate", case, "--scheduler", "vllm"), "t.csv: row 4, column arrived_at: must be >= 0, got -1")


@pytest.mark.parametrize("header", ["arrived_at,num_prefill_tokens,num_decode_tokens,num_prefill_tokens",
                                    "arrived_at,arrived_at,num_prefill_tokens,num_decode_tokens"])
def test_a_trace_with_a_duplicated_column_is_refused(cli, write_file, header):
    write_file("t.csv", header + "\n0,10,5,9\n1,12,5,9\n")
    case = write_file("c.toml", case_text().split("[[requests]]")[0] + '[workload]\ntrace = "t.csv"\n')
    one_error(*cli("simulate", case, "--scheduler", "vllm"), "t.csv: header: column", "more than once")


# capacity: a cap is not a measurement

def _capacity_case(write_file):
    lines = ["[system]", "kv_capacity = 64", "max_batch_tokens = 8", "[cost]", 'preset = "unit-batches"']
    for k in range(4):
        lines += ["[[requests]]", "prompt = 4", "output = 3", f"arrival = {k}.0"]
    return write_file("four.toml", "\n".join(lines) + "\n")


def test_capacity_says_when_it_reached_its_cap(cli, write_file):
    """Issue 34: a rate factor of 2^20 was reported as if measured."""
    import json

    case = _capacity_case(write_file)
    rc, out, err = cli("capacity", case, "--scheduler", "sarathi", "--slo", "ttft=100,tbt=100")
    assert rc == 0, err
    data = json.loads(out)
    assert list(data)[:4] == ["scheduler", "rate_factor", "requests_per_second", "slo_attainment"]
    assert data["capped"] is True and data["rate_factor"] == 2 ** 20
    assert "capped: the search reached its cap" in err and "not measured" in err
    rc, out, err = cli("capacity", case, "--scheduler", "sarathi", "--slo", "ttft=0.001,tbt=0.001")
    assert rc == 0, err
    assert json.loads(out)["capped"] is True and json.loads(out)["rate_factor"] == 0 and "capped: " in err
    rc, out, err = cli("capacity", case, "--scheduler", "sarathi", "--slo", "ttft=2,tbt=1")
    assert rc == 0 and json.loads(out)["capped"] is False and "capped" not in err


@pytest.mark.parametrize("tolerance", ["1e-300", "1e6", "0", "nan", "-0.1"])
def test_capacity_tolerance_outside_its_range_is_refused(cli, write_file, tolerance):
    one_error(*cli("capacity", _capacity_case(write_file), "--scheduler", "sarathi", "--slo", "ttft=2,tbt=1",
                   "--tolerance", tolerance), "--tolerance")


# nesting and size limits, stdout and full disks: one error line, never a traceback

def test_deeply_nested_json_is_one_error_line(cli, files):
    deep = "[" * 1200 + "]" * 1200  # 2.4 KB: RecursionError in the reader
    (files / "deep.json").write_text('{"requests": [], "batches": ' + deep + "}")
    (files / "deep80.json").write_text('{"requests": [], "batches": ' + "[" * 80 + "]" * 80 + "}")
    for name in ("deep.json", "deep80.json"):
        one_error(*cli("validate", files / "c.toml", files / name), name, "nested more than 64 levels")
        one_error(*cli("import", files / name, "--case", files / "c.toml", "--out", files / "x.json"), "nested")
        one_error(*cli("plot", files / name, "--case", files / "c.toml", "--out", files / "x.png"), "nested")
    assert not (files / "x.json").exists() and not (files / "x.png").exists()


@pytest.mark.parametrize("text", [
    'name = "x"\nx' + ".a" * 100_000 + " = 1\n",  # tomllib: time and memory grow with the square of the key
    'name = "x"\n[' + ".".join(["a"] * 100_000) + "]\n",
    'name = "x"\nx = ' + "[" * 1200 + "]" * 1200 + "\n",  # RecursionError
    'name = "x"\nx = ' + "{a = " * 1200 + "1" + "}" * 1200 + "\n",
    'name = "x"\nx = ' + "[" * 70 + "]" * 70 + "\n",  # parses, but deeper than the limit
], ids=["dotted key", "table header", "arrays", "inline tables", "70 arrays"])
def test_deeply_nested_toml_is_one_error_line(cli, write_file, tmp_path, text):
    path = write_file("deep.toml", text)
    assert cli("simulate", EXAMPLE, "--scheduler", "vllm", "--out", tmp_path / "s.json")[0] == 0
    t0 = time.monotonic()
    one_error(*cli("simulate", path, "--scheduler", "vllm"), "deep.toml", "nested more than 64 levels")
    one_error(*cli("sweep", path, "--out", tmp_path / "res"), "deep.toml", "nested more than 64 levels")
    one_error(*cli("replay", EXAMPLE, tmp_path / "s.json", "--cost", path), "nested more than 64 levels")
    assert time.monotonic() - t0 < 5 and not (tmp_path / "res").exists()


def test_a_dotted_key_within_the_limit_still_reads(cli, write_file):
    path = write_file("c.toml", case_text() + "[cost2]\n")  # an unknown table: the key check, not the reader
    one_error(*cli("simulate", path, "--scheduler", "vllm"), "cost2", "unknown key")
    path = write_file("ok.toml", 'name = "x"\n' + case_text().replace('preset = "llama2-7b-a100"',
                                                                      'preset = "llama2-7b-a100" # a.b.c.d'))
    assert cli("simulate", path, "--scheduler", "vllm")[0] == 0


def _kvbound(argv, **kwargs):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "kvbound.cli", *map(str, argv)], capture_output=True, text=True,
                          timeout=60, **kwargs)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_stdout_on_a_full_disk_is_one_error_line(json_flag):
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "kvbound.cli", "simulate", str(EXAMPLE), "--scheduler", "vllm",
                               *json_flag], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "error: stdout: cannot write: No space left on device\n"


def test_text_stdout_cannot_encode_is_written_with_escapes(write_file):
    """Issue 34: PYTHONIOENCODING=ascii and a case named 'café' ended in UnicodeEncodeError."""
    path = write_file("c.toml", 'name = "caf\u00e9 \u2615"\n' + case_text())
    proc = _kvbound(["simulate", path, "--scheduler", "vllm"], env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("caf\\xe9 \\u2615: scheduler vllm")
    proc = _kvbound(["simulate", path, "--scheduler", "vllm", "--json"], env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0 and proc.stderr == ""


class _FullDisk:
    """`os` for the results table, whose write fails (ENOSPC) from the `after`-th call on; `short`: it writes
    half the bytes instead (a write cut short)."""

    def __init__(self, after: int, short: bool = False):
        self.calls, self.after, self.short = 0, after, short

    def write(self, fd, data):
        import errno

        self.calls += 1
        if self.calls < self.after:
            return os.write(fd, data)
        if self.short:
            return os.write(fd, data[:len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(os, name)


@pytest.mark.parametrize("short", [False, True])
def test_a_sweep_on_a_full_disk_is_one_error_line_and_keeps_its_points_whole(cli, write_file, tmp_path, monkeypatch,
                                                                              short):
    import kvbound.analysis.sweep.table as table

    spec = write_file("s.toml", SWEEP.format(I="[4, 5, 6]", N="1").replace("prompt = [[4, 5, 6]]", "prompt = [4, 5, 6]"))
    monkeypatch.setattr(table, "os", _FullDisk(after=2, short=short))
    rc, out, err = cli("sweep", spec, "--out", tmp_path / "res", "--workers", "1")
    one_error(rc, out, err, "results.csv", "cannot write", "is the disk full?" if short else "No space left on device")
    rows = (tmp_path / "res" / "results.csv").read_text()
    assert rows.endswith("\n") and len(rows.splitlines()) == 2  # the header and the one whole point
    monkeypatch.undo()
    rc, out, err = cli("sweep", spec, "--out", tmp_path / "res", "--workers", "1")
    assert rc == 0 and "(1 already done, 2 run)" in out, err


# silent acceptance: duplicates, degenerate fits, huge grids

def _schedule_with_first_batch(files, tokens: str, name: str = "dup.json"):
    import json

    data = json.loads((files / "s.json").read_text())
    text = json.dumps(data).replace(json.dumps(data["batches"][0]["tokens"]), tokens, 1)
    (files / name).write_text(text)
    return files / name


@pytest.mark.parametrize("tokens,fragments", [
    ('{"1": 1, "1": 3}', ("batches[0].tokens", "request id '1' given more than once")),
    ('{"01": 16, "1": 16}', ("batches[0].tokens", "request id 1 given more than once", "'01'")),
])
def test_repeated_request_ids_in_a_batch_are_refused(cli, files, tokens, fragments):
    dup = _schedule_with_first_batch(files, tokens)
    one_error(*cli("validate", files / "c.toml", dup), "dup.json", *fragments)
    one_error(*cli("export", dup, "--case", files / "c.toml", "--out", files / "x.json"), *fragments)
    assert not (files / "x.json").exists()


def test_repeated_keys_and_ids_in_other_places_are_refused(cli, files):
    import json

    text = (files / "s.json").read_text()
    (files / "top.json").write_text(text[:-2] + ', "batches": []}')
    one_error(*cli("validate", files / "c.toml", files / "top.json"), "'batches' given more than once")
    data = json.loads(text)
    data["batches"][1]["evict"] = [0, 0]
    (files / "ev.json").write_text(json.dumps(data))
    one_error(*cli("validate", files / "c.toml", files / "ev.json"), "batches[1].evict", "request id 0 listed more")
    paper = json.loads((files / "p.json").read_text())
    paper["batches"][0]["c"] = {"0": 16, "00": 16}
    (files / "p2.json").write_text(json.dumps(paper))
    one_error(*cli("import", files / "p2.json", "--case", files / "c.toml", "--out", files / "x.json"),
              "batches[0].c", "request id 0 given more than once")
    paper = json.loads((files / "p.json").read_text())
    paper["batches"][0]["e"] = [1, 1]
    (files / "p3.json").write_text(json.dumps(paper))
    one_error(*cli("import", files / "p3.json", "--case", files / "c.toml", "--out", files / "x.json"),
              "batches[0].e", "listed more than once")
    (files / "p4.json").write_text((files / "p.json").read_text()[:-2] + ', "batches": []}')
    one_error(*cli("import", files / "p4.json", "--case", files / "c.toml", "--out", files / "x.json"),
              "'batches' given more than once")
    assert not (files / "x.json").exists()


@pytest.mark.parametrize("argv,fragments", [
    (["simulate", EXAMPLE, "--scheduler", "vllm", "--slo", "ttft=1,ttft=2,tbt=1"], ("--slo", "ttft given more than once")),
    (["simulate", EXAMPLE, "--scheduler", "vllm", "--slo", "ttft=1,tbt=1,tbt=1"], ("--slo", "tbt given more than once")),
    (["capacity", EXAMPLE, "--scheduler", "vllm", "--slo", "ttft=1,ttft=2,tbt=1"], ("--slo", "ttft")),
    (["simulate", EXAMPLE, "--scheduler", "larry:alpha=1,alpha=2"], ("--scheduler", "option alpha given more than once")),
    (["simulate", EXAMPLE, "--scheduler", "vllm-v1:max_num_seqs=4,max_running=8"],
     ("--scheduler", "max_num_seqs and max_running set the same option")),
])
def test_an_option_given_twice_is_refused(cli, argv, fragments):
    one_error(*cli(*argv), *fragments)


def test_a_sweep_slo_given_twice_is_refused(cli, write_file, tmp_path):
    spec = write_file("s.toml", SWEEP.format(I="4", N="1") + 'slo = "ttft=1,tbt=1,ttft=3"\n')
    one_error(*cli("sweep", spec, "--out", tmp_path / "res"), "run.slo", "ttft given more than once")


@pytest.mark.parametrize("rows,fragment", [
    ("1,100,0,10000,0,1,0.01\n" * 50, "all 50 batches have the same features"),
    ("".join(f"1,{100 + k},0,10000,0,1,0.01\n" for k in range(50)), "all 50 batches took the same time"),
])
def test_a_degenerate_profile_is_refused(cli, write_file, tmp_path, rows, fragment):
    """Issue 34: 50 identical rows were fitted with R^2 nan and the intercept forced to 1e-9, exit 0."""
    path = write_file("prof.csv", "batches,tokens,decode_kv,prefill_attention,prefill_kv,prefill_requests,seconds\n" + rows)
    one_error(*cli("calibrate", path, "--out", tmp_path / "cost.toml"), "prof.csv", "cannot fit", fragment)
    assert not (tmp_path / "cost.toml").exists()


def test_a_profile_whose_duplicated_column_disagrees_is_refused(cli, write_file, tmp_path):
    header = "batches,tokens,decode_kv,prefill_attention,prefill_kv,prefill_requests,seconds,tokens\n"
    rows = "".join(f"1,{k + 1},0,0,0,1,{0.01 * (k + 1)},{k + 1 if k < 7 else 5}\n" for k in range(20))
    path = write_file("prof.csv", header + rows)
    one_error(*cli("calibrate", path, "--out", tmp_path / "cost.toml"), "row 9, tokens", "appears 2 times",
              "'8'", "'5'", "ambiguous")
    assert not (tmp_path / "cost.toml").exists()


def test_a_profile_in_the_executors_layout_with_agreeing_copies_is_read(cli, write_file, tmp_path):
    # kvbound's executor writes prefill_requests twice (the composition, then the feature): same values
    header = "prefill_requests,chunk,batches,tokens,decode_kv,prefill_attention,prefill_kv,prefill_requests,seconds\n"
    rows = "".join(f"{k % 3},{k},1,{k + 1},{k % 5},0,0,{k % 3},{0.01 + 0.001 * (k + 1) + 0.002 * (k % 3)}\n"
                   for k in range(20))
    code, out, err = cli("calibrate", write_file("prof.csv", header + rows), "--out", tmp_path / "cost.toml")
    assert code == 0 and "Traceback" not in err, err
    assert (tmp_path / "cost.toml").exists()


def test_a_huge_sweep_grid_is_refused_before_it_runs(cli, write_file, tmp_path):
    """Issue 34: a grid of 10^7 points ran silently while memory grew."""
    ten = "[" + ", ".join(str(k) for k in range(1, 11)) + "]"
    spec = write_file("s.toml", f"""
name = "huge"
[grid]
prompt = {ten}
output = {ten}
requests = {ten}
kv_capacity = [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]
max_batch_tokens = [64, 65, 66, 67, 68, 69, 70, 71, 72, 73]
block_size = {ten}
max_prefill_tokens = [54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
""")
    t0 = time.monotonic()
    one_error(*cli("sweep", spec, "--out", tmp_path / "res"), "grid", "10,000,000 points", "at most 100,000")
    assert time.monotonic() - t0 < 5 and not (tmp_path / "res").exists()
    spec = write_file("r.toml", SWEEP.format(I=ten, N="1000000").replace("prompt = [[", "prompt = [")
                      .replace("]]\noutput", "]\noutput") + 'objectives = ["total_latency", "mean_latency"]\n')
    t0 = time.monotonic()
    one_error(*cli("sweep", spec, "--out", tmp_path / "res"), "grid", "more than 10,000,000 requests")
    assert time.monotonic() - t0 < 10 and not (tmp_path / "res").exists()


# smaller: a byte-order mark, the progress line's width

def test_toml_and_json_with_a_byte_order_mark_are_read(cli, files):
    (files / "bom.toml").write_bytes(b"\xef\xbb\xbf" + (files / "c.toml").read_bytes())
    (files / "bom.json").write_bytes(b"\xef\xbb\xbf" + (files / "s.json").read_bytes())
    rc, out, err = cli("validate", files / "bom.toml", files / "bom.json")
    assert rc == 0 and out.startswith("valid: "), err


class _Terminal:
    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        pass

    def isatty(self):
        return True


@pytest.mark.parametrize("columns", [40, 12])
def test_the_progress_line_fits_the_terminal(monkeypatch, columns):
    """Issue 34: on a 40-column terminal the progress line wrapped, and each update added a line."""
    from kvbound import progress

    monkeypatch.setenv("COLUMNS", str(columns))
    terminal = _Terminal()
    with progress.line(stream=terminal, every=0.01):
        progress.report(phase="a rather long phase name: the search over admission orders", best=123.456789,
                        analytic=100.0)
        time.sleep(0.2)
    updates = [u.replace("\x1b[K", "") for u in terminal.text.split("\r")]
    assert len([u for u in updates if u]) >= 2
    assert all(len(u) <= columns - 1 for u in updates), updates
    assert "\n" not in terminal.text
    assert any(u.startswith("   0.") and ("a rather" in u or columns < 20) for u in updates)
