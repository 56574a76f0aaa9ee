"""`kvbound headroom` and kvbound.analysis.headroom (issue 35, item 1): the JSON contract, the order
bound <= best <= every scheduler at every point, the plot, bad input, and the library API = the CLI."""
from __future__ import annotations

import json

import pytest

from kvbound import Instance, Request, SystemConfig
from kvbound.analysis.capacity_bound import capacity_upper_bound
from kvbound.analysis.headroom import (DEFAULT_SCHEDULERS, POINT_KEYS, ROW_KEYS, TOP_KEYS, CAPACITY_KEYS, headroom,
                                       parse_rates, slo_alone_bound, unloaded_value)
from kvbound.costs import PRESETS
from kvbound.errors import InputError
from kvbound.io.cases import load_case
from kvbound.schedule import Slo
from tests.conftest import REPO

#: eight Splitwise conversation requests with their arrival times (bench/ground_truth.py)
CASE = REPO / "cases" / "ground_truth" / "gt_conv_r0_n8_s40_tight_arr.toml"
EPS = 1e-9

#: three requests, one a second, every batch 1 s: the solve proves each point within a second (deterministic)
TINY_LINES = ["[system]", "kv_capacity = 16", "max_batch_tokens = 8", "[cost]", 'preset = "unit-batches"']
for _k, (_i, _o) in enumerate(((4, 3), (6, 2), (3, 4))):
    TINY_LINES += ["[[requests]]", f"prompt = {_i}", f"output = {_o}", f"arrival = {_k}.0"]
TINY = "\n".join(TINY_LINES) + "\n"


def _check_order(data: dict) -> None:
    """At every point: bound <= best <= each scheduler's objective (the validator's values)."""
    obj = data["objective"]
    for p in data["points"]:
        assert p["lower_bound"] is not None and p["best"] is not None
        assert p["lower_bound"] <= p["best"] * (1 + EPS)
        for r in p["rows"]:
            assert r["refused"] is None, r
            assert r[obj] >= p["lower_bound"] * (1 - EPS), (p["rate_factor"], r)
            assert p["best"] <= r[obj] * (1 + EPS), (p["rate_factor"], r)


def _timeless(data: dict) -> dict:
    """A result's JSON without its seconds (the only numbers that depend on where it ran)."""
    return dict(data, seconds=None, points=[dict(p, seconds=None) for p in data["points"]])


@pytest.fixture(scope="module")
def tiny_case(tmp_path_factory):
    path = tmp_path_factory.mktemp("headroom") / "tiny.toml"
    path.write_text(TINY)
    return path


def test_cli_json_keeps_the_contract_and_the_order_and_draws_a_png(cli, tmp_path):
    png = tmp_path / "h.png"
    rc, out, err = cli("headroom", CASE, "--rates", "2,0.5", "--time-limit", "6", "--json", "--plot", png)
    assert rc == 0, err
    data = json.loads(out)
    assert tuple(data) == TOP_KEYS
    assert data["objective"] == "mean_latency" and data["status"] == "complete"
    assert [p["rate_factor"] for p in data["points"]] == [0.5, 2.0]  # ascending
    for p in data["points"]:
        assert tuple(p) == tuple(k for k in POINT_KEYS if k != "slo_attainment_upper_bound")
        assert [r["scheduler"] for r in p["rows"]] == list(DEFAULT_SCHEDULERS)
        for r in p["rows"]:
            assert tuple(r) == tuple(k for k in ROW_KEYS if k != "slo_attainment")
        # the analytic bounds and the solve's are certified ledger bounds, and say which one it is
        assert p["bound_certified"] is True and p["bound_source"]
        assert p["requests_per_second"] == pytest.approx(p["rate_factor"] * data["base_rate"])
    _check_order(data)
    assert tuple(data["capacity"]) == CAPACITY_KEYS
    caps = data["capacity"]["schedulers"]
    assert list(caps) == list(DEFAULT_SCHEDULERS) and all(c is None or c > 0 for c in caps.values())
    # the certified capacity bound: no scheduler's capacity (measured against the same limit) is above it
    upper, note = data["capacity"]["upper_bound"], data["capacity"]["upper_bound_note"]
    inst = load_case(CASE)
    expected = capacity_upper_bound(inst, "mean_latency", 2 * unloaded_value(inst, "mean_latency"))
    assert upper == expected.factor and expected.covered_by in note
    if upper is not None:
        assert all(c is None or c <= upper * (1 + 0.011) for c in caps.values())  # the capacity's 1% bracket
    assert "2 x" in data["capacity"]["definition"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_with_slo_reports_attainment_under_its_certified_upper_bound(cli):
    rc, out, err = cli("headroom", CASE, "--rates", "1,8", "--slo", "ttft=0.006,tbt=0.005", "--objective", "mean_ttft",
                       "--schedulers", "sarathi,srpt", "--time-limit", "5", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["objective"] == "mean_ttft" and data["slo"] == "ttft=0.006,tbt=0.005"
    for p in data["points"]:
        assert tuple(p) == POINT_KEYS
        assert 0 <= p["slo_attainment_upper_bound"] <= 1
        for r in p["rows"]:
            assert tuple(r) == ROW_KEYS
            assert r["slo_attainment"] <= p["slo_attainment_upper_bound"] + EPS
    _check_order(data)
    assert "attainment >= 0.7" in data["capacity"]["definition"]
    assert data["capacity"]["upper_bound"] is None and "--slo" in data["capacity"]["upper_bound_note"]


def test_the_slo_bound_counts_only_requests_that_could_attain_it_alone():
    inst = Instance(tuple(Request(4, 3, float(k)) for k in range(4)), SystemConfig(64, 8), PRESETS["unit-batches"])
    assert slo_alone_bound(inst, Slo(ttft=1.0, tbt=1.0)) == 1.0  # one batch each: a prefill, then decodes
    assert slo_alone_bound(inst, Slo(ttft=0.5, tbt=1.0)) == 0.0  # no first token within half a batch
    assert slo_alone_bound(inst, Slo(ttft=1.0, tbt=0.5)) == 0.0  # no two tokens within half a batch
    one = Instance((Request(4, 1), Request(4, 3, 1.0)), inst.system, inst.cost)
    assert slo_alone_bound(one, Slo(ttft=1.0, tbt=0.5)) == 0.5  # O = 1 has no gaps to miss
    assert unloaded_value(inst, "mean_latency") == pytest.approx(3.0)  # three batches alone


def test_library_api_returns_what_the_cli_prints(cli, tiny_case):
    from kvbound.io.cases import load_case

    rc, out, err = cli("headroom", tiny_case, "--rates", "0.5,2", "--time-limit", "8", "--json")
    assert rc == 0, err
    printed = json.loads(out)
    result = headroom(load_case(tiny_case), [0.5, 2], time_limit=8)
    assert result.status == "complete"
    assert result.seconds <= 8 + 2  # the whole call keeps its time limit within max(2 s, 10%)
    library = json.loads(json.dumps(result.to_json()))  # the same encoding (tuples, floats)

    assert _timeless(library) == _timeless(printed)
    _check_order(printed)
    assert result.points[1].best > result.points[0].best  # twice the rate: the requests wait


def test_one_process_a_pool_and_ray_give_the_same_points(tiny_case):
    """The capacity searches and the rate points are independent units (kvbound.units): in this process,
    on a pool of 2 and on a local Ray of 2 workers the JSON is the same, points in the same order (the
    tiny case's points are proven, so no number depends on a unit's share of the time)."""
    import importlib.util

    inst = load_case(tiny_case)
    where = [dict(workers=1), dict(workers=2)]
    if importlib.util.find_spec("ray") is not None:
        where.append(dict(backend="ray", workers=2))
    runs = [headroom(inst, "2,0.5,1", ["sarathi", "srpt"], time_limit=30, **kw) for kw in where]
    one = _timeless(runs[0].to_json())
    assert one["status"] == "complete" and [p["rate_factor"] for p in one["points"]] == [0.5, 1.0, 2.0]
    for kw, other in zip(where[1:], runs[1:]):
        assert _timeless(other.to_json()) == one, kw
        assert other.seconds <= 30 + 3  # a local Ray's start is within the time limit too


class _Spy:
    """Records which of kvbound.units' ways runs headroom's units (`_here`: this process; `_pool`: a
    process pool, with its worker count), then runs them that way."""

    def __init__(self, monkeypatch):
        from kvbound import units
        from kvbound.analysis import headroom as headroom_module

        self.calls = []
        for name in ("_here", "_pool"):
            real = getattr(units, name)
            monkeypatch.setattr(units, name, self._wrap(name, real, headroom_module._call))

    def _wrap(self, name, real, unit_fn):
        def spy(fn, units, *rest):
            if fn is unit_fn:  # not the units of a point's own solve
                self.calls.append((name, len(units), rest[0] if name == "_pool" else 1))
            return real(fn, units, *rest)
        return spy


def test_the_units_run_on_every_core_by_default_and_in_this_process_with_workers_1(cli, tiny_case, monkeypatch):
    import os

    spy = _Spy(monkeypatch)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    argv = ("headroom", tiny_case, "--rates", "0.5,1,2", "--schedulers", "sarathi,srpt", "--time-limit", "20", "--json")
    rc, out, err = cli(*argv)
    assert rc == 0, err
    # the capacity searches (2 units), then the points (3): as many workers at once as units, up to the cores
    assert spy.calls == [("_pool", 2, 2), ("_pool", 3, 3)]
    spy.calls.clear()
    rc, one, err = cli(*argv, "--workers", "1")
    assert rc == 0, err
    assert spy.calls == [("_here", 2, 1), ("_here", 3, 1)]
    assert _timeless(json.loads(one)) == _timeless(json.loads(out))


def test_ray_not_installed_or_no_workers_is_bad_input_before_any_work(cli, tiny_case, monkeypatch):
    import importlib.util

    rc, out, err = cli("headroom", tiny_case, "--rates", "1", "--workers", "0", "--json")
    assert rc == 2 and out == "" and "--workers" in err
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    rc, out, err = cli("headroom", tiny_case, "--rates", "1", "--backend", "ray", "--json")
    assert rc == 2 and out == "" and "pip install 'kvbound[distributed]'" in err, err


def test_a_rerun_into_the_same_folder_computes_only_the_units_not_there(cli, tiny_case, tmp_path, monkeypatch):
    """--out DIR keeps each finished unit: a rerun with more rate factors takes the finished ones from DIR
    (the same numbers, their own seconds) and computes only the new one; other settings share nothing;
    DIR/headroom.json is what the command printed."""
    from kvbound.analysis import headroom as headroom_module

    folder = tmp_path / "run"
    argv = ("headroom", tiny_case, "--schedulers", "sarathi,srpt", "--time-limit", "20", "--workers", "1", "--json",
            "--out", folder)
    rc, out, err = cli(*argv, "--rates", "0.5,1")
    assert rc == 0, err
    first = json.loads(out)
    assert first["recorded"] == 0 and json.loads((folder / "headroom.json").read_text()) == first
    computed = []
    real = headroom_module.run_point
    monkeypatch.setattr(headroom_module, "run_point", lambda inst, f, *rest: computed.append(f) or real(inst, f, *rest))
    rc, out, err = cli(*argv, "--rates", "0.5,1,2")
    assert rc == 0, err
    second = json.loads(out)
    assert computed == [2.0]
    assert second["recorded"] == 5  # the capacity bound, two capacity searches, two points
    assert second["points"][:2] == first["points"] and second["capacity"] == first["capacity"]
    _check_order(second)
    assert json.loads((folder / "headroom.json").read_text()) == second
    computed.clear()
    rc, out, err = cli(*argv, "--rates", "0.5", "--objective", "mean_ttft")
    assert rc == 0, err
    assert json.loads(out)["recorded"] == 0 and computed == [0.5]


def test_a_unit_cut_short_is_not_kept(tiny_case, tmp_path, monkeypatch):
    """A point whose schedulers were not all simulated in time is reported but not recorded: a rerun computes it."""
    from kvbound.analysis import headroom as headroom_module
    from kvbound.analysis.compare import TIME_LIMIT

    inst = load_case(tiny_case)
    real = headroom_module.run_point

    def cut_short(*args):
        point = real(*args)
        point.status = TIME_LIMIT
        return point

    monkeypatch.setattr(headroom_module, "run_point", cut_short)
    first = headroom(inst, [1], ["srpt"], time_limit=20, workers=1, out=tmp_path)
    assert first.status == TIME_LIMIT and len(first.points) == 1
    monkeypatch.setattr(headroom_module, "run_point", real)
    second = headroom(inst, [1], ["srpt"], time_limit=20, workers=1, out=tmp_path)
    assert second.recorded == 2 and second.status == "complete"  # the capacity bound and search, not the point


def test_out_naming_a_file_is_bad_input(cli, tiny_case, tmp_path):
    path = tmp_path / "taken"
    path.write_text("mine\n")
    rc, out, err = cli("headroom", tiny_case, "--rates", "1", "--out", path, "--json")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "not a folder" in err, err
    assert path.read_text() == "mine\n"  # nothing a user gave is overwritten


@pytest.mark.parametrize("argv, needle", [
    (["--rates", "0,1"], "--rates: 0: a rate factor must be"),
    (["--rates", "1,x"], "--rates: 'x' is not a number"),
    (["--rates", "1,,2"], "--rates:"),
    (["--rates", "nan"], "--rates: nan"),
    (["--rates", "1", "--objective", "total_latency"], "--objective"),
    (["--rates", "1", "--schedulers", "nosuch"], "nosuch"),
    (["--rates", "1", "--slo", "ttft=1"], "tbt is missing"),
    (["--rates", "1", "--plot", "out.txt"], "out.txt: --plot: the file name must end in"),
    (["--rates", "1", "--within", "0.5"], "--within"),
])
def test_bad_input_is_one_error_line_exit_2(cli, tmp_path, argv, needle):
    argv = [a if a != "out.txt" else str(tmp_path / "out.txt") for a in argv]
    rc, out, err = cli("headroom", CASE, *argv, "--time-limit", "2", "--json")
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert needle in err, err
    assert not (tmp_path / "out.txt").exists()


def test_a_case_without_arrival_times_is_bad_input(cli, tmp_path):
    png = tmp_path / "h.png"
    rc, out, err = cli("headroom", REPO / "cases" / "example.toml", "--rates", "1,2", "--plot", png)
    assert rc == 2 and out == "" and err.startswith("error: ") and "same time" in err, err
    assert not png.exists()  # nothing half-written
    rc, out, err = cli("headroom", tmp_path / "missing.toml", "--rates", "1")
    assert rc == 2 and err.startswith("error: ") and "missing.toml" in err and len(err.strip().splitlines()) == 1


def test_parse_rates():
    assert parse_rates("4, 1,0.25,1") == [0.25, 1.0, 4.0]
    assert parse_rates([2, 0.5]) == [0.5, 2.0]
    for bad in ("", "0", "-1", "inf", "1e7", []):
        with pytest.raises(InputError):
            parse_rates(bad)
