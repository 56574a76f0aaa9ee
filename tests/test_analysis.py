"""`kvbound compare`, `kvbound plot` and the precomputed-schedule interop (issue 6), on tiny cases.

Every number compare prints is recomputed here independently: each scheduler is run again,
its schedule replayed by the validator from JSON, the bound taken from the analytic bounds
(and, solved, checked against the brute-force oracle), the gaps recomputed from the
definition (value - reference) / value.
"""
from __future__ import annotations

import json

import pytest

from kvbound import SCHEDULERS, load_case, run_scheduler, validate
from kvbound.analysis.compare import ROW_KEYS, TABLE_KEYS, compare
from kvbound.analysis.interop import from_precomputed, to_precomputed
from kvbound.analysis.roles import DECODE, EVICT, PREFILL, schedule_roles
from kvbound.errors import SchedulerRefused
from kvbound.objective import Objective
from kvbound.bounds.analytic import analytic_bounds
from kvbound.io.schedules import schedule_from_json
from tests.conftest import FIG15_TINY as FIG15
from tests.oracle import brute_force


#: docs/semantics.md section 13: an eviction, a refill and an idle jump to a late arrival
WORKED = """
name = "worked-example"
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
output = 3
[[requests]]
prompt = 2
output = 2
[[requests]]
prompt = 2
output = 1
arrival = 6.0
"""
WORKED_SCHEDULE = {"batches": [{"tokens": {"0": 3, "1": 1}, "evict": []}, {"tokens": {"0": 1, "1": 1}, "evict": []},
                               {"tokens": {"0": 1}, "evict": [1]}, {"tokens": {"1": 3}, "evict": []},
                               {"start": 6.0, "tokens": {"2": 2}, "evict": []}]}

#: a prompt longer than P: schedulers that do not chunk must refuse, the others serve it
LONG_PROMPT = """
name = "long-prompt"
[system]
kv_capacity = 64
max_batch_tokens = 16
max_prefill_tokens = 8
block_size = 2
[cost]
preset = "llama2-7b-a100"
[[requests]]
prompt = 12
output = 3
[[requests]]
prompt = 4
output = 5
arrival = 0.01
"""

SOME = "vllm,vllm-ef,sarathi,sarathi-ef,mcsf"


@pytest.fixture
def case(write_file):
    def make(text: str, name: str = "case.toml"):
        return write_file(name, text)

    return make


def assert_one_error_line(rc, out, err, status=2):
    assert rc == status, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


def independent_metrics(instance, scheduler: str) -> dict:
    sim = run_scheduler(instance, scheduler)
    return validate(instance, schedule_from_json(json.loads(json.dumps(sim.schedule.to_json())))).metrics.to_dict()


def gap(value, reference):
    return (value - reference) / value


# ------------------------------------------------------------------------------ compare

@pytest.mark.parametrize("objective", ["total_latency", "mean_latency", "mean_ttft"])
def test_compare_json_is_the_validators_metrics_and_gaps(cli, case, objective):
    path = case(FIG15)
    rc, out, err = cli("compare", path, "--schedulers", SOME, "--solve", "--time-limit", "5", "--objective", objective,
                       "--json")
    assert (rc, err) == (0, ""), err
    data = json.loads(out)
    assert tuple(data) == TABLE_KEYS
    assert [tuple(r) for r in data["rows"]] == [ROW_KEYS] * len(data["rows"])
    assert [r["scheduler"] for r in data["rows"]] == ["optimal"] + SOME.split(",")
    instance = load_case(path)
    rows = {r["scheduler"]: r for r in data["rows"]}
    for name in SOME.split(","):
        expected = independent_metrics(instance, name)
        for key in ROW_KEYS[1:-2]:
            assert rows[name][key] == expected.get(key), (name, key)  # slo_attainment: None without an SLO
    # the optimum: its schedule is not printed, but its value must be the oracle's and its metrics consistent
    opt = brute_force(instance, objective).value
    assert rows["optimal"][objective] == pytest.approx(opt, rel=1e-9)
    values = {name: r[objective] for name, r in rows.items()}
    assert data["objective_name"] == objective
    assert data["best_known"] == min(values.values())
    assert data["bound_certified"] is True
    analytic = max(b.value for b in analytic_bounds(instance, Objective(objective)))
    assert analytic <= data["lower_bound"] <= opt * (1 + 1e-9)
    for name, r in rows.items():
        assert r["gap_to_bound"] == pytest.approx(gap(values[name], data["lower_bound"]), abs=1e-12)
        assert r["gap_to_best"] == pytest.approx(gap(values[name], data["best_known"]), abs=1e-12)
        assert r["gap_to_bound"] >= r["gap_to_best"] - 1e-12 and r["gap_to_best"] >= 0
    assert rows["optimal"]["gap_to_best"] == 0


def test_compare_without_solve_uses_the_analytic_bound(case):
    instance = load_case(case(WORKED))
    table = compare(instance, "all")
    assert [r.scheduler for r in table.rows] == list(SCHEDULERS)
    assert table.solve_result is None
    assert table.lower_bound == max(b.value for b in analytic_bounds(instance, Objective.TOTAL_LATENCY))
    assert table.bound_certified is True
    served = [r for r in table.rows if r.metrics is not None]
    assert len(served) >= 10
    for r in table.rows:
        if r.metrics is None:  # e.g. vllm: a refill of I + O - 1 = 5 tokens would exceed P = 4 without chunking
            assert r.refused and r.gap_to_bound is None and r.gap_to_best is None
            with pytest.raises(SchedulerRefused):
                run_scheduler(instance, r.scheduler)
            continue
        assert r.metrics.to_dict() == independent_metrics(instance, r.scheduler)
        assert r.gap_to_bound == pytest.approx(gap(r.metrics.total_latency, table.lower_bound), abs=1e-12)


def test_compare_keeps_a_row_for_a_refusing_scheduler(cli, case):
    path = case(LONG_PROMPT)
    rc, out, err = cli("compare", path, "--schedulers", "vllm,sarathi-nocp-ef,sarathi,sarathi-ef", "--json")
    assert (rc, err) == (0, ""), err
    rows = {r["scheduler"]: r for r in json.loads(out)["rows"]}
    for refused in ("vllm", "sarathi-nocp-ef"):
        assert all(rows[refused][k] is None for k in ROW_KEYS[1:]), rows[refused]
    instance = load_case(path)
    assert rows["sarathi"]["total_latency"] == independent_metrics(instance, "sarathi")["total_latency"]
    assert json.loads(out)["best_known"] == min(rows[s]["total_latency"] for s in ("sarathi", "sarathi-ef"))
    rc, out, err = cli("compare", path, "--schedulers", "vllm,sarathi")
    assert rc == 0 and err == ""
    vllm_line = next(line for line in out.splitlines() if line.startswith("vllm"))
    assert "refused" in vllm_line and "does not chunk" in vllm_line
    rc, out, err = cli("compare", path, "--schedulers", "vllm,sarathi", "--markdown")
    assert rc == 0 and "| vllm | refused:" in out
    rc, out, err = cli("compare", path, "--schedulers", "vllm")  # every row refused: the table still prints
    assert (rc, err) == (0, "") and "does not chunk" in out.splitlines()[-1]


def test_compare_markdown_and_plot(cli, case, tmp_path):
    path = case(FIG15)
    png = tmp_path / "cmp.png"
    rc, out, err = cli("compare", path, "--schedulers", SOME, "--solve", "--time-limit", "5", "--markdown", "--plot", png)
    assert (rc, err) == (0, ""), err
    table_lines = [line for line in out.splitlines() if line.startswith("|")]
    assert len(table_lines) == 2 + 1 + len(SOME.split(","))  # header, rule, optimal, schedulers
    assert table_lines[2].startswith("| **optimal (proven)** |")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, needle", [
    (["--schedulers", "vlm"], "did you mean 'vllm'"),
    (["--schedulers", ","], "no scheduler"),
    (["--objective", "throughput"], "invalid choice"),
    (["--time-limit", "nan"], "time-limit"),
    (["--plot", "chart.jpg"], "--plot"),
])
def test_compare_bad_input_is_one_error_line(cli, case, argv, needle):
    rc, out, err = cli("compare", case(FIG15), *argv)
    assert_one_error_line(rc, out, err)
    assert needle in err


def test_compare_missing_case_is_one_error_line(cli, tmp_path):
    rc, out, err = cli("compare", tmp_path / "nope.toml")
    assert_one_error_line(rc, out, err)
    assert "nope.toml" in err


def test_compare_on_a_shipped_case_proves_the_paper_s_optimum(cli):
    rc, out, err = cli("compare", "cases/fig15/fig15_I4.toml", "--schedulers", "vllm,vllm-ef", "--solve",
                       "--time-limit", "20", "--json")
    assert (rc, err) == (0, ""), err
    data = json.loads(out)
    rows = {r["scheduler"]: r for r in data["rows"]}
    # README: fig15_I4 is proven optimal at 0.0544463 s with two evictions; vllm finds it, vllm-ef cannot
    assert rows["optimal"]["total_latency"] == pytest.approx(0.0544463, rel=1e-6)
    assert rows["optimal"]["gap_to_bound"] == pytest.approx(0, abs=1e-6)
    assert rows["vllm-ef"]["evictions"] == 0 and rows["vllm-ef"]["gap_to_best"] > 0.1


# ------------------------------------------------------------------------------ roles and plots

def test_roles_follow_the_semantics_worked_example(case):
    instance = load_case(case(WORKED))
    sr = schedule_roles(instance, schedule_from_json({"requests": [
        {"prompt": 3, "output": 3}, {"prompt": 2, "output": 2}, {"prompt": 2, "output": 1, "arrival": 6.0}],
        **WORKED_SCHEDULE}))
    # docs/semantics.md section 13: batch 1 is D, P (r1's last prompt token is a chunk); r1 refills in batch 3
    assert sr.roles == [{0: PREFILL, 1: PREFILL}, {0: DECODE, 1: PREFILL}, {1: EVICT, 0: DECODE}, {1: PREFILL},
                        {2: PREFILL}]
    assert sr.holding == [(), (), (), (), ()]
    assert sr.kv_after == [4, 6, 0, 0, 0]
    assert sr.replay.metrics.total_latency == pytest.approx(7.204)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_command_writes_a_chart(cli, case, tmp_path, suffix):
    path = case(LONG_PROMPT)
    sched = tmp_path / "s.json"
    assert cli("simulate", path, "--scheduler", "sarathi", "--out", sched)[0] == 0
    out = tmp_path / f"chart{suffix}"
    rc, stdout, err = cli("plot", sched, "--case", path, "--out", out)
    assert (rc, err) == (0, ""), err
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in data[:2000]


def test_plot_rejects_an_invalid_schedule_and_bad_paths(cli, case, tmp_path):
    path = case(WORKED)
    bad = tmp_path / "bad.json"
    broken = {"requests": [{"prompt": 3, "output": 3}, {"prompt": 2, "output": 2}, {"prompt": 2, "output": 1, "arrival": 6.0}],
              "batches": [{"tokens": {"0": 3, "1": 2}}]}  # 5 tokens > C = 4
    bad.write_text(json.dumps(broken))
    rc, out, err = cli("plot", bad, "--case", path, "--out", tmp_path / "x.png")
    assert_one_error_line(rc, out, err, status=1)
    assert "batch 0: processes 5 tokens" in err and not (tmp_path / "x.png").exists()
    rc, out, err = cli("plot", bad, "--case", path, "--out", tmp_path / "x.gif")
    assert_one_error_line(rc, out, err)
    rc, out, err = cli("plot", bad, "--case", path, "--out", tmp_path / "missing" / "x.png")
    assert_one_error_line(rc, out, err)


def test_schedule_chart_every_mode(case, monkeypatch):
    """Per-batch boxes, merged bars and the aggregate state counts all render (and on a schedule with evictions)."""
    from kvbound.analysis import plot

    instance = load_case(case(LONG_PROMPT))
    schedule = run_scheduler(instance, "sarathi").schedule
    detailed = plot.plot_schedule(instance, schedule)
    assert len(detailed.axes) == 2
    monkeypatch.setattr(plot, "DETAIL_BATCHES", 1)
    plot.plot_schedule(instance, schedule)
    monkeypatch.setattr(plot, "ROW_LIMIT", 1)
    aggregate = plot.plot_schedule(instance, schedule)
    assert aggregate.axes[0].get_ylabel() == "requests (time average)"


# ------------------------------------------------------------------------------ interop

def test_precomputed_form_of_the_worked_example(case):
    instance = load_case(case(WORKED))
    sched = schedule_from_json({"requests": [{"prompt": 3, "output": 3}, {"prompt": 2, "output": 2},
                                             {"prompt": 2, "output": 1, "arrival": 6.0}], **WORKED_SCHEDULE})
    data = to_precomputed(instance, sched)
    assert data["requests"] == [[3, 3], [2, 2], [2, 1]]
    assert data["arrivals"] == [0.0, 0.0, 6.0]
    assert data["batches"] == [
        {"c": [3, 1, 0], "p": [0, 1], "e": []},
        {"c": [1, 1, 0], "p": [1], "e": []},
        {"c": [1, 0, 0], "p": [], "e": [1]},
        {"c": [0, 3, 0], "p": [1], "e": []},
        {"c": [0, 0, 2], "p": [2], "e": [], "start": 6.0},
    ]


@pytest.mark.parametrize("text", [FIG15, WORKED, LONG_PROMPT])
def test_export_import_round_trip(case, text):
    """Every scheduler that serves the case: export then import gives the same batches, time line and metrics."""
    instance = load_case(case(text))
    served = 0
    for scheduler in SCHEDULERS:
        try:
            original = run_scheduler(instance, scheduler).schedule
        except SchedulerRefused:  # nothing to export
            continue
        served += 1
        data = json.loads(json.dumps(to_precomputed(instance, original)))
        back = from_precomputed(instance, data)
        assert [(b.tokens, tuple(sorted(b.evict))) for b in back.batches] == \
               [(b.tokens, tuple(sorted(b.evict))) for b in original.batches], scheduler
        a, b = validate(instance, original), validate(instance, back)
        assert a.metrics == b.metrics, scheduler
        assert list(a.batch_start) == list(b.batch_start) and list(a.batch_end) == list(b.batch_end), scheduler
        assert to_precomputed(instance, back) == data, scheduler
    assert served >= 7  # the chunking schedulers serve even LONG_PROMPT


def test_export_import_commands_round_trip(cli, case, tmp_path):
    path = case(WORKED)
    sched, paper, again = tmp_path / "s.json", tmp_path / "paper.json", tmp_path / "again.json"
    assert cli("simulate", path, "--scheduler", "evict-short", "--out", sched)[0] == 0
    rc, out, err = cli("export", sched, "--case", path, "--out", paper)
    assert (rc, err) == (0, ""), err
    rc, out, err = cli("import", paper, "--case", path, "--out", again)
    assert (rc, err) == (0, ""), err
    rc1, m1, _ = cli("validate", path, sched, "--json")
    rc2, m2, _ = cli("validate", path, again, "--json")
    assert rc1 == rc2 == 0 and json.loads(m1) == json.loads(m2)


def test_import_accepts_sparse_c_and_checks_p(cli, case, tmp_path):
    path = case(WORKED)
    instance = load_case(path)
    paper = {"requests": [[3, 3], [2, 2], [2, 1]], "batches": [
        {"c": {"0": 3, "1": 1}, "p": [0, 1]}, {"c": {"0": 1, "1": 1}, "p": [1]}, {"c": {"0": 1}, "p": [], "e": [1]},
        {"c": {"1": 3}, "p": [1]}, {"c": {"2": 2}, "p": [2]}]}
    # no start on the last batch: the case's arrival at 6.0 is before it, so the batch would start too early
    with pytest.raises(Exception, match="batch 4, request 2: processed in a batch starting at 5.092"):
        from_precomputed(instance, paper)
    paper["batches"][4]["start"] = 6.0
    assert validate(instance, from_precomputed(instance, paper)).metrics.total_latency == pytest.approx(7.204)
    paper["batches"][1]["p"] = [0, 1]  # r0 decodes in batch 1
    f = tmp_path / "paper.json"
    f.write_text(json.dumps(paper))
    rc, out, err = cli("import", f, "--case", path, "--out", tmp_path / "s.json")
    assert_one_error_line(rc, out, err, status=1)
    assert "batch 1, request 0: p says prefill, but under the semantics it is decode-type" in err
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("batches"), "batches"),
    (lambda d: d.update(requests=[[3, 3], [2, 2]]), "requests"),
    (lambda d: d["requests"].__setitem__(1, [2, 3]), "requests[1]"),
    (lambda d: d["batches"][0].update(c=[3, 1]), "batches[0].c"),
    (lambda d: d["batches"][0].update(tokens=[3, 1, 0]), "batches[0].tokens"),
    (lambda d: d.update(arrivals=[0, 0, 5.0]), "arrivals[2]"),
    (lambda d: d["batches"][0].update(e="1"), "batches[0].e"),
])
def test_import_bad_input_names_the_field(cli, case, tmp_path, mutate, field):
    path = case(WORKED)
    data = {"requests": [[3, 3], [2, 2], [2, 1]], "batches": [{"c": [3, 1, 0], "p": [0, 1], "e": []}]}
    mutate(data)
    f = tmp_path / "paper.json"
    f.write_text(json.dumps(data))
    rc, out, err = cli("import", f, "--case", path, "--out", tmp_path / "s.json")
    assert_one_error_line(rc, out, err)
    assert f"paper.json: {field}:" in err


def test_export_rejects_an_invalid_schedule(cli, case, tmp_path):
    path = case(WORKED)
    s = tmp_path / "s.json"
    s.write_text(json.dumps({"requests": [{"prompt": 3, "output": 3}, {"prompt": 2, "output": 2},
                                          {"prompt": 2, "output": 1, "arrival": 6.0}], "batches": []}))
    rc, out, err = cli("export", s, "--case", path, "--out", tmp_path / "p.json")
    assert_one_error_line(rc, out, err, status=1)
    assert "unfinished" in err and not (tmp_path / "p.json").exists()
