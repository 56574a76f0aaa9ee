"""The semantics of docs/semantics.md: the worked example (numbers computed by hand in the
doc, typed in here), one test per validator rule, and `kvbound validate`."""
from __future__ import annotations

import json
import re
import tomllib

import pytest

from kvbound.costs import CostModel
from kvbound.errors import InputError
from kvbound.io.cases import parse_case
from kvbound.io.schedules import schedule_from_json
from kvbound.schedule import METRIC_KEYS, Batch, ReplayState, Schedule, ScheduleError, Slo, validate
from kvbound.workload import Instance, Request, SystemConfig

from .conftest import REPO

DOC = REPO / "docs" / "semantics.md"

# ----------------------------------------------------------------------------- the worked example

#: typed by hand from docs/semantics.md section 13
EXAMPLE_COST = CostModel(intercept=1.0, per_token=0.1, decode_kv=0.01, prefill_attention=0.001)
EXAMPLE_REQUESTS = (Request(3, 3, 0.0), Request(2, 2, 0.0), Request(2, 1, 6.0))
EXAMPLE_SYSTEM = SystemConfig(kv_capacity=6, max_batch_tokens=4)
EXAMPLE_BATCHES = [
    Batch({0: 3, 1: 1}),
    Batch({0: 1, 1: 1}),
    Batch({0: 1}, evict=(1,)),
    Batch({1: 3}),
    Batch({2: 2}, start=6.0),
]
# per batch: evicted, {request: (m before, c)}, types in id order, sum c, KV, T, start, end
EXAMPLE_TABLE = [
    ((), {0: (0, 3), 1: (0, 1)}, "PP", 4, 4, 1.41, 0.0, 1.41),
    ((), {0: (3, 1), 1: (1, 1)}, "DP", 2, 6, 1.233, 1.41, 2.643),
    ((1,), {0: (4, 1), 1: (0, 0)}, "D", 1, 5, 1.14, 2.643, 3.783),
    ((), {1: (0, 3)}, "P", 3, 3, 1.309, 3.783, 5.092),
    ((), {2: (0, 2)}, "P", 2, 2, 1.204, 6.0, 7.204),
]
# per request: arrival, first token, completion, latency, TTFT, TPOT (None: O = 1), evictions
EXAMPLE_REQUEST_TABLE = [
    (0.0, 1.41, 3.783, 3.783, 1.41, 1.1865, 0),
    (0.0, 2.643, 5.092, 5.092, 2.643, 2.449, 1),
    (6.0, 7.204, 7.204, 1.204, 1.204, None, 0),
]
EXAMPLE_METRICS = {
    "total_latency": 7.204,
    "mean_latency": 10.079 / 3,
    "mean_ttft": 5.257 / 3,
    "mean_tpot": 1.81775,
    "batches": 5,
    "evictions": 1,
    "recomputed_tokens": 2,
    "peak_kv": 6,
    "p50_latency": 3.783,
    "p99_latency": 5.06582,
    "p50_ttft": 1.41,
    "p99_ttft": 2.61834,
    "p50_tpot": 1.81775,
    "p99_tpot": 2.436375,
    # issue 16; token gaps: r0 1.41 -> 2.643 -> 3.783 (1.233, 1.14), r1 2.643 -> 5.092 (2.449), r2 none (O = 1)
    "p95_ttft": 2.5197,  # 1.41 + 0.9 * (2.643 - 1.41)
    "mean_tbt": 4.822 / 3,  # (1.233 + 1.14 + 2.449) / 3
    "p99_tbt": 2.42468,  # 1.233 + 0.98 * (2.449 - 1.233)
    "p50_normalized_latency": 1.261,  # latency / O: 3.783 / 3 = 1.261, 5.092 / 2 = 2.546, 1.204 / 1
    "p95_normalized_latency": 2.4175,  # 1.261 + 0.9 * (2.546 - 1.261)
}
#: per request: its own P99 TBT (r0: 1.14 + 0.99 * (1.233 - 1.14); r1 one gap; r2 none: 0)
EXAMPLE_REQUEST_P99_TBT = (1.23207, 2.449, 0.0)
TOL = 1e-9


def _example_section() -> str:
    text = DOC.read_text()
    start = text.index("## 13. Worked example")
    return text[start:]


def _code_block(section: str, lang: str) -> str:
    match = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert match, f"no ```{lang} block in the worked example"
    return match.group(1)


def _table(section: str, first_header: str) -> list[list[str]]:
    lines = section.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def example_instance() -> Instance:
    return Instance(EXAMPLE_REQUESTS, EXAMPLE_SYSTEM, EXAMPLE_COST, name="worked-example")


def example_schedule() -> Schedule:
    return Schedule(EXAMPLE_REQUESTS, [Batch(dict(b.tokens), b.evict, b.start) for b in EXAMPLE_BATCHES])


def test_doc_case_and_schedule_are_the_ones_typed_here():
    section = _example_section()
    inst = parse_case(tomllib.loads(_code_block(section, "toml")), "worked-example.toml")
    assert inst.requests == EXAMPLE_REQUESTS
    assert inst.system == EXAMPLE_SYSTEM
    assert inst.cost == EXAMPLE_COST
    sched = schedule_from_json(json.loads(_code_block(section, "json")))
    assert sched.requests == EXAMPLE_REQUESTS
    assert [(b.tokens, b.evict, b.start) for b in sched.batches] == \
        [(b.tokens, b.evict, b.start) for b in EXAMPLE_BATCHES]


def test_doc_tables_hold_the_numbers_typed_here():
    section = _example_section()
    rows = _table(section, "batch")
    assert len(rows) == len(EXAMPLE_TABLE)
    for j, (row, expected) in enumerate(zip(rows, EXAMPLE_TABLE)):
        evict, per_req, types, tok, kv, t, start, end = expected
        assert int(row[0]) == j
        assert row[1] == ("-" if not evict else ", ".join(f"r{i}" for i in evict))
        for i in range(3):
            cell = row[2 + i]
            if i in per_req:
                assert cell == f"{per_req[i][0]}→{per_req[i][1]}", (j, i)
            else:
                assert cell == "-", (j, i)
        assert row[5].replace(", ", "") == types
        assert (int(row[6]), int(row[7])) == (tok, kv)
        assert [float(x) for x in row[8:11]] == pytest.approx([t, start, end], abs=TOL)
    rows = _table(section, "request")
    assert len(rows) == len(EXAMPLE_REQUEST_TABLE)
    for i, (row, expected) in enumerate(zip(rows, EXAMPLE_REQUEST_TABLE)):
        assert int(row[0]) == i
        values = [None if cell == "-" else float(cell) for cell in row[1:8]]
        assert values == [pytest.approx(v, abs=TOL) if v is not None else None for v in expected]
    rows = _table(section, "metric")
    assert {row[0] for row in rows} == set(EXAMPLE_METRICS)
    for row in rows:
        # the doc rounds the two repeating decimals to 7 places
        assert float(row[1]) == pytest.approx(EXAMPLE_METRICS[row[0]], abs=1e-7), row[0]


def test_worked_example_batch_by_batch():
    inst = example_instance()
    st = ReplayState(inst)
    for j, (batch, expected) in enumerate(zip(example_schedule().batches, EXAMPLE_TABLE)):
        evict, per_req, types, tok, kv, t, start, end = expected
        assert tuple(batch.evict) == evict
        # m before the batch, after its evictions, and the c of every listed request
        for i, (m_before, c) in per_req.items():
            assert (0 if i in batch.evict else st.m[i]) == m_before, (j, i)
            assert batch.tokens.get(i, 0) == c, (j, i)
        got_end = st.apply(batch)
        assert st.starts[-1] == pytest.approx(start, abs=TOL)
        assert got_end == pytest.approx(end, abs=TOL)
        assert got_end - st.starts[-1] == pytest.approx(t, abs=TOL)
        assert st.kv_trace[-1] == kv
        feats = st.features[-1]
        assert feats[1] == tok
        assert feats[5] == types.count("P")  # prefill-type requests
    # after the last batch: everything finished, nothing cached
    assert st.finished == [True, True, True]
    assert st.kv_used == 0
    assert st.recomputed == 2


def test_worked_example_decode_and_prefill_types():
    """Batch 1: r1's last prompt token has S - m = 1 but n = 0, so it is prefill-type
    (c^2 + 2mc = 3) and r0 is decode-type (its m = 3 is charged to decode_kv)."""
    st = ReplayState(example_instance())
    st.apply(EXAMPLE_BATCHES[0])
    st.apply(EXAMPLE_BATCHES[1])
    one, tokens, decode_kv, attention, prefill_kv, prefill_requests = st.features[-1]
    assert (one, tokens, decode_kv, attention, prefill_kv, prefill_requests) == (1, 2, 3, 3, 1, 1)


def test_worked_example_per_request_and_metrics():
    replay = validate(example_instance(), example_schedule())
    for i, (arrival, first, completion, latency, ttft, tpot, evictions) in enumerate(EXAMPLE_REQUEST_TABLE):
        assert replay.arrivals[i] == arrival
        assert replay.first_token[i] == pytest.approx(first, abs=TOL)
        assert replay.completion[i] == pytest.approx(completion, abs=TOL)
        assert replay.latencies[i] == pytest.approx(latency, abs=TOL)
        assert replay.first_token[i] - arrival == pytest.approx(ttft, abs=TOL)
        if tpot is not None:
            assert (completion - first) / (EXAMPLE_REQUESTS[i].output - 1) == pytest.approx(tpot, abs=TOL)
        assert replay.evictions[i] == evictions
    metrics = replay.metrics.to_dict()
    for key, value in EXAMPLE_METRICS.items():
        assert metrics[key] == pytest.approx(value, abs=TOL), key
    for key in ("batches", "evictions", "recomputed_tokens", "peak_kv"):
        assert isinstance(metrics[key], int)
    # 12 tokens processed = 10 uninterrupted (I + O - 1 each) + 2 recomputed
    assert replay.batch_features[:, 1].sum() == sum(r.peak_kv for r in EXAMPLE_REQUESTS) + 2 == 12


@pytest.mark.parametrize("slo, attained", [
    ("ttft=1.5,tbt=1.5", (True, False, True)),  # r1's TTFT 2.643 > 1.5
    ("ttft=1.5,tbt=1.2", (False, False, True)),  # and r0's own P99 TBT 1.23207 > 1.2; r2 has no gaps
    ("ttft=3,tbt=2.449", (True, True, True)),  # limits are inclusive
    ("ttft=1.2,tbt=9", (False, False, False)),  # r2's TTFT 1.204 > 1.2
])
def test_worked_example_slo_attainment(slo, attained):
    replay = validate(example_instance(), example_schedule())
    assert replay.request_p99_tbt == pytest.approx(EXAMPLE_REQUEST_P99_TBT, abs=TOL)
    assert "slo_attainment" not in replay.metrics.to_dict()
    assert tuple(replay.slo_attained(Slo.parse(slo))) == attained
    assert replay.apply_slo(Slo.parse(slo)).to_dict()["slo_attainment"] == pytest.approx(sum(attained) / 3, abs=TOL)


@pytest.mark.parametrize("text", ["ttft=1", "tbt=1", "ttft=1,tbt=x", "ttft=0,tbt=1", "ttft=1,tbt=inf", "ttft=1,p99=1", "1,1"])
def test_bad_slo_is_one_input_error(text):
    with pytest.raises(InputError, match="slo"):
        Slo.parse(text, "", "slo")


def test_cli_slo_attainment_and_bad_slo(cli, write_file):
    section = _example_section()
    case = write_file("worked.toml", _code_block(section, "toml"))
    schedule = write_file("worked.json", _code_block(section, "json"))
    rc, out, err = cli("validate", case, schedule, "--json", "--slo", "ttft=1.5,tbt=1.5")
    assert rc == 0, err
    assert json.loads(out)["metrics"]["slo_attainment"] == pytest.approx(2 / 3, abs=TOL)
    rc, out, err = cli("validate", case, schedule, "--json")
    assert "slo_attainment" not in json.loads(out)["metrics"]
    rc, out, err = cli("simulate", case, "--scheduler", "sarathi", "--slo", "ttft=1")
    assert rc == 2 and err.startswith("error: ") and "--slo" in err and "tbt" in err and len(err.splitlines()) == 1


def test_worked_example_without_the_start_fails_at_the_arrival():
    """The validator never jumps to an arrival itself: the jump is the batch's `start`."""
    sched = example_schedule()
    sched.batches[-1].start = None
    with pytest.raises(ScheduleError) as err:
        validate(example_instance(), sched)
    assert (err.value.batch, err.value.request) == (4, 2)
    assert "before its arrival" in str(err.value)


# ----------------------------------------------------------------------------- timing details

def _inst(reqs, M=100, C=100, P=None, b=1, cost=None) -> Instance:
    return Instance(tuple(Request(*r) for r in reqs), SystemConfig(M, C, P, b),
                    cost or CostModel(intercept=1.0, per_token=0.1))


def test_empty_batch_takes_no_time_and_is_not_counted():
    inst = _inst([(2, 2)])
    sched = Schedule(inst.requests, [Batch({0: 2}), Batch({}), Batch({0: 1})])
    replay = validate(inst, sched)
    assert replay.batch_end[1] == replay.batch_start[1] == pytest.approx(1.2)
    assert replay.metrics.batches == 2
    assert replay.metrics.total_latency == pytest.approx(1.2 + 1.1)


def test_empty_batch_with_a_start_moves_the_clock():
    inst = _inst([(2, 1), (2, 1, 5.0)])
    sched = Schedule(inst.requests, [Batch({0: 2}), Batch({}, start=5.0), Batch({1: 2})])
    replay = validate(inst, sched)
    assert list(replay.batch_start) == pytest.approx([0.0, 5.0, 5.0])
    assert replay.metrics.total_latency == pytest.approx(6.2)
    assert replay.metrics.batches == 2


def test_start_earlier_than_previous_end_is_ignored():
    inst = _inst([(2, 1), (2, 1)])
    sched = Schedule(inst.requests, [Batch({0: 2}), Batch({1: 2}, start=0.5)])
    replay = validate(inst, sched)
    assert replay.batch_start[1] == pytest.approx(1.2)


def test_mean_tpot_is_zero_when_every_output_is_one():
    inst = _inst([(2, 1), (3, 1)])
    replay = validate(inst, Schedule(inst.requests, [Batch({0: 2, 1: 3})]))
    assert replay.metrics.mean_tpot == 0.0
    assert replay.metrics.mean_latency == pytest.approx(1.5)


def test_peak_kv_counts_a_finishing_request_during_its_last_batch():
    inst = _inst([(3, 2)])
    replay = validate(inst, Schedule(inst.requests, [Batch({0: 3}), Batch({0: 1})]))
    assert list(replay.batch_kv) == [3, 4]
    assert replay.metrics.peak_kv == 4  # = I + O - 1


# ----------------------------------------------------------------------------- validator rules

def _fails(inst: Instance, batches: list[Batch], batch: int | None, request: int | None, *words: str) -> str:
    with pytest.raises(ScheduleError) as err:
        validate(inst, Schedule(inst.requests, batches))
    exc = err.value
    assert (exc.batch, exc.request) == (batch, request), str(exc)
    message = str(exc)
    if batch is not None:
        prefix = f"batch {batch}" + (f", request {request}" if request is not None else "") + ": "
        assert message.startswith(prefix), message
    for word in words:
        assert word in message, message
    return message


def test_rule_over_C():
    inst = _inst([(3, 1), (3, 1), (2, 1)], C=4)
    _fails(inst, [Batch({0: 3}), Batch({1: 3, 2: 2})], 1, None, "processes 5 tokens", "max_batch_tokens C = 4")
    validate(inst, Schedule(inst.requests, [Batch({0: 3}), Batch({1: 3}), Batch({2: 2})]))


def test_rule_over_P_counts_only_prefill_type_tokens():
    inst = _inst([(2, 3), (3, 1), (1, 1)], C=8, P=3)
    # batch 1: r0 decodes (1 token, not counted) while r1 prefills 3 = P: valid
    validate(inst, Schedule(inst.requests, [Batch({0: 2}), Batch({0: 1, 1: 3}), Batch({0: 1, 2: 1})]))
    # batch 1: 3 + 1 prefill-type tokens > P = 3
    _fails(inst, [Batch({0: 2}), Batch({0: 1, 1: 3, 2: 1})], 1, None,
           "4 prefill-type tokens", "max_prefill_tokens P = 3")


def test_rule_over_M_counts_idle_requests():
    inst = _inst([(3, 2), (3, 1)], M=5)
    # r0 idles in batch 1 but keeps its 3 cached tokens: 3 + 3 > 5
    _fails(inst, [Batch({0: 3}), Batch({1: 3})], 1, None, "needs 6 KV tokens", "kv_capacity M = 5")


def test_rule_over_M_with_block_rounding():
    batches = [Batch({0: 3, 1: 2})]
    # 5 tokens fit in M = 7 with b = 1 ...
    validate(_inst([(3, 1), (2, 1)], M=7, b=1), Schedule((Request(3, 1), Request(2, 1)), batches))
    # ... but with b = 4 each request is charged a whole block: 4 + 4 = 8 > 7
    inst = _inst([(3, 1), (2, 1)], M=7, b=4)
    _fails(inst, [Batch({0: 3, 1: 2})], 0, None, "needs 8 KV tokens", "M = 7")


def test_rule_c_more_than_uncached_tokens():
    inst = _inst([(3, 3)])
    _fails(inst, [Batch({0: 4})], 0, 0, "processes 4 tokens but only 3 are not cached")
    # after the prompt, only the generated token is uncached: a decode is exactly 1 token
    _fails(inst, [Batch({0: 3}), Batch({0: 2})], 1, 0, "only 1 are not cached")


@pytest.mark.parametrize("c", [0, -1])
def test_rule_c_less_than_one(c):
    inst = _inst([(3, 1), (1, 1)])
    _fails(inst, [Batch({1: 1}), Batch({0: c})], 1, 0, f"processes {c} tokens", "c >= 1")


def test_rule_processing_before_arrival():
    inst = _inst([(2, 1), (2, 1, 5.0)])
    _fails(inst, [Batch({0: 2, 1: 2})], 0, 1, "before its arrival at 5 s")
    # the second batch would start at 1.2 s, still before 5 s
    _fails(inst, [Batch({0: 2}), Batch({1: 2})], 1, 1, "starting at 1.2 s", "before its arrival")
    validate(inst, Schedule(inst.requests, [Batch({0: 2}), Batch({1: 2}, start=5.0)]))


def test_rule_processing_a_finished_request():
    inst = _inst([(1, 1), (2, 1)])
    _fails(inst, [Batch({0: 1}), Batch({0: 1, 1: 2})], 1, 0, "processed after it finished")


def test_rule_evict_with_nothing_cached():
    inst = _inst([(2, 2), (2, 1)])
    _fails(inst, [Batch({0: 2}), Batch({0: 1}, evict=(1,))], 1, 1, "evicted but holds no cached KV")


def test_rule_evict_a_finished_request():
    inst = _inst([(1, 1), (2, 1)])
    _fails(inst, [Batch({0: 1}), Batch({1: 2}, evict=(0,))], 1, 0, "evicted after it finished")


def test_rule_evict_twice_in_one_batch():
    inst = _inst([(2, 2)])
    _fails(inst, [Batch({0: 1}), Batch({}, evict=(0, 0))], 1, 0, "evicted twice")


def test_rule_evict_and_process_in_the_same_batch():
    inst = _inst([(3, 2)])
    _fails(inst, [Batch({0: 2}), Batch({0: 1}, evict=(0,))], 1, 0, "both evicted and processed in the same batch")


def test_eviction_resets_m_and_counts_recomputed_tokens():
    inst = _inst([(3, 2)])
    replay = validate(inst, Schedule(inst.requests, [Batch({0: 2}), Batch({}, evict=(0,)), Batch({0: 3}),
                                                     Batch({0: 1})]))
    m = replay.metrics
    assert (m.evictions, m.recomputed_tokens, m.batches) == (1, 2, 3)
    # an empty, evict-only batch holds 0 KV; the refill is prefill-type: T = 1 + 0.3
    assert list(replay.batch_kv) == [2, 0, 3, 4]
    assert replay.batch_end[2] - replay.batch_start[2] == pytest.approx(1.3)


@pytest.mark.parametrize("field", ["tokens", "evict"])
def test_rule_unknown_request_id(field):
    inst = _inst([(2, 1), (2, 1)])
    batch = Batch({5: 1}) if field == "tokens" else Batch({0: 2}, evict=(7,))
    bad = 5 if field == "tokens" else 7
    _fails(inst, [batch], 0, bad, "unknown request id")


def test_rule_unknown_request_id_in_json_is_bad_input():
    from kvbound.errors import InputError

    with pytest.raises(InputError, match=r"batches\[0\]\.tokens: request id 'x' is not an integer"):
        schedule_from_json({"requests": [{"id": 0, "prompt": 1, "output": 1}],
                            "batches": [{"tokens": {"x": 1}}]})


def test_rule_unfinished_at_the_end():
    inst = _inst([(2, 1), (2, 3)])
    message = _fails(inst, [Batch({0: 2, 1: 2}), Batch({1: 1})], None, 1, "unfinished: 2 of 3 tokens generated")
    assert message.startswith("after the last batch, request 1: ")


def test_rule_schedule_lists_other_requests():
    inst = _inst([(2, 1), (2, 1)])
    with pytest.raises(ScheduleError) as err:
        validate(inst, Schedule((Request(2, 1),), [Batch({0: 2})]))
    assert (err.value.batch, err.value.request) == (None, None)
    assert str(err.value) == "request list: the schedule lists 1 requests, the case has 2"
    for other in (Request(3, 1), Request(2, 2), Request(2, 1, 0.5)):
        with pytest.raises(ScheduleError) as err:
            validate(inst, Schedule((Request(2, 1), other), [Batch({0: 2, 1: 2})]))
        assert (err.value.batch, err.value.request) == (None, 1)
        assert str(err.value).startswith("request list, request 1: differs from the case")


# ----------------------------------------------------------------------------- kvbound validate

EIGHT_KEYS = set(METRIC_KEYS)


def _write_example(write_file):
    section = _example_section()
    case = write_file("worked.toml", _code_block(section, "toml"))
    schedule = write_file("worked.json", _code_block(section, "json"))
    return case, schedule


def test_metric_keys_are_the_contract():
    assert EIGHT_KEYS == {"total_latency", "mean_latency", "mean_ttft", "mean_tpot", "batches", "evictions",
                          "recomputed_tokens", "peak_kv"}


def test_cli_validate_json_valid(cli, write_file):
    case, schedule = _write_example(write_file)
    rc, out, err = cli("validate", case, schedule, "--json")
    assert (rc, err) == (0, "")
    assert len(out.strip().splitlines()) == 1
    data = json.loads(out)
    assert set(data) == {"valid", "metrics"}
    assert data["valid"] is True
    assert EIGHT_KEYS <= set(data["metrics"])
    for key in EIGHT_KEYS:
        assert data["metrics"][key] == pytest.approx(EXAMPLE_METRICS[key], abs=TOL), key


def test_cli_validate_table_valid(cli, write_file):
    case, schedule = _write_example(write_file)
    rc, out, err = cli("validate", case, schedule)
    assert (rc, err) == (0, "")
    assert out.startswith("valid: ")
    assert "7.204 s" in out and "recomputed tokens" in out


def _broken_batch7_request3(write_file):
    """Eight one-token requests; request 3 arrives at 100 s but is put in batch 7 (starting at 7.7 s)."""
    lines = ["[system]", "kv_capacity = 8", "max_batch_tokens = 8", "[cost]", "intercept = 1.0", "per_token = 0.1"]
    reqs = []
    for i in range(8):
        lines += ["[[requests]]", "prompt = 1", "output = 1"] + (["arrival = 100.0"] if i == 3 else [])
        reqs.append({"id": i, "prompt": 1, "output": 1, "arrival": 100.0 if i == 3 else 0.0})
    order = [0, 1, 2, 4, 5, 6, 7, 3]
    sched = {"requests": reqs, "batches": [{"tokens": {str(i): 1}, "evict": []} for i in order]}
    return write_file("eight.toml", "\n".join(lines) + "\n"), write_file("eight.json", json.dumps(sched))


def test_cli_validate_json_invalid_names_batch_and_request(cli, write_file):
    case, schedule = _broken_batch7_request3(write_file)
    rc, out, err = cli("validate", case, schedule, "--json")
    assert (rc, err) == (1, "")
    data = json.loads(out)
    assert set(data) == {"valid", "error"}
    assert data["valid"] is False
    assert data["error"].startswith("batch 7, request 3: processed in a batch starting at 7.7 s")
    assert "before its arrival at 100 s" in data["error"]


def test_cli_validate_invalid_without_json(cli, write_file):
    case, schedule = _broken_batch7_request3(write_file)
    rc, out, err = cli("validate", case, schedule)
    assert (rc, err) == (1, "")
    assert out.startswith("invalid: batch 7, request 3: ")


def test_cli_validate_malformed_schedule_is_bad_input(cli, write_file):
    case, _ = _write_example(write_file)
    bad = write_file("bad.json", '{"requests": [], "batches": [], "extra": 1}')
    rc, out, err = cli("validate", case, bad)
    assert rc == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1
    assert str(bad) in err and "extra" in err
    notjson = write_file("notjson.json", "{")
    rc, out, err = cli("validate", case, notjson)
    assert rc == 2 and err.startswith(f"error: {notjson}: malformed JSON")
    binary = write_file("binary.json", b"\xff\xfe{}")
    rc, out, err = cli("validate", case, binary)
    assert rc == 2 and err.startswith(f"error: {binary}: cannot read file: not UTF-8") and err.count("\n") == 1
