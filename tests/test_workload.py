"""Case files and traces: the issue's bad-input list (one test each, through the CLI), defaults,
`count` expansion, and the trace loaders on the real files in ../shared/data/traces/."""
from __future__ import annotations

import math

import pytest

from kvbound.costs import PRESETS, CostModel
from kvbound.io.cases import load_case
from kvbound.io.traces import load_trace
from kvbound.workload import Request

VALID = """\
name = "ok"
[system]
kv_capacity = 64
max_batch_tokens = 16
[cost]
intercept = 0.01
per_token = 0.001
[[requests]]
prompt = 8
output = 4
"""


@pytest.fixture
def bad_case(cli, write_file):
    """Write a case, run `kvbound simulate CASE --scheduler NAME` and check it is refused properly:
    exit 2, nothing on stdout, exactly one `error:` line on stderr naming the file and the given
    fragments (the field and what is wrong), no traceback. Returns the error line."""

    def run(content, *fragments, scheduler="sarathi", name="case.toml", names=None):
        path = write_file(name, content)
        rc, out, err = cli("simulate", path, "--scheduler", scheduler)
        assert rc == 2, (rc, out, err)
        assert out == ""
        assert err.endswith("\n") and err.count("\n") == 1, err
        assert err.startswith("error: "), err
        assert "Traceback" not in err
        assert str(names or path) in err, err
        for fragment in fragments:
            assert fragment in err, (fragment, err)
        return err

    return run


def test_valid_base_case_runs(cli, write_file):
    rc, out, err = cli("simulate", write_file("case.toml", VALID), "--scheduler", "sarathi")
    assert (rc, err) == (0, "")
    assert "ok: scheduler sarathi, 1 requests" in out


# ----------------------------------------------------------------------------- the bad-input list

def test_unknown_or_misspelt_keys(bad_case):
    bad_case(VALID.replace("kv_capacity", "kv_capcity"), "system.kv_capcity", "unknown key",
             "did you mean 'kv_capacity'")
    bad_case(VALID.replace("output = 4", "outptu = 4"), "requests[0].outptu", "did you mean 'output'")
    bad_case("colour = 1\n" + VALID, "colour: unknown key")
    bad_case(VALID.replace("per_token", "per_tokens"), "cost.per_tokens", "did you mean 'per_token'")


def test_missing_sections(bad_case):
    bad_case(VALID.replace("[system]\nkv_capacity = 64\nmax_batch_tokens = 16\n", ""), "system", "missing section [system]")
    bad_case(VALID.replace("[cost]\nintercept = 0.01\nper_token = 0.001\n", ""), "cost", "missing section [cost]")
    bad_case(VALID[:VALID.index("[[requests]]")], "requests: missing")
    bad_case(VALID.replace("max_batch_tokens = 16\n", ""), "system.max_batch_tokens: missing")
    bad_case(VALID.replace("prompt = 8\n", ""), "requests[0].prompt: missing")


def test_wrong_types(bad_case):
    bad_case(VALID.replace("kv_capacity = 64", 'kv_capacity = "64"'), "system.kv_capacity", "must be an integer")
    bad_case(VALID.replace("intercept = 0.01", 'intercept = "fast"'), "cost.intercept", "must be a number")
    bad_case(VALID.replace('name = "ok"', "name = 3"), "name: must be a string")
    bad_case(VALID.replace("output = 4", "output = 4\narrival = true"), "requests[0].arrival", "must be a number")
    bad_case('system = 5\n' + VALID[VALID.index("[cost]"):], "system: must be a table")
    bad_case(VALID[:VALID.index("[[requests]]")] + "[requests]\nprompt = 8\noutput = 4\n", "requests",
             "must be an array of tables")


def test_non_integer_or_non_positive_lengths(bad_case):
    bad_case(VALID.replace("prompt = 8", "prompt = 8.5"), "requests[0].prompt", "must be an integer, got 8.5")
    bad_case(VALID.replace("output = 4", "output = 0"), "requests[0].output", "must be >= 1, got 0")
    bad_case(VALID.replace("prompt = 8", "prompt = -3"), "requests[0].prompt", "must be >= 1, got -3")
    bad_case(VALID.replace("output = 4", "output = 4\ncount = 0"), "requests[0].count", "must be >= 1")
    bad_case(VALID.replace("max_batch_tokens = 16", "max_batch_tokens = 0"), "system.max_batch_tokens", ">= 1")


def test_negative_numbers(bad_case):
    bad_case(VALID.replace("output = 4", "output = 4\narrival = -1.0"), "requests[0].arrival", "must be >= 0")
    bad_case(VALID.replace("per_token = 0.001", "per_token = -0.001"), "cost.per_token", "must be >= 0")


def test_non_finite_numbers(bad_case):
    bad_case(VALID.replace("output = 4", "output = 4\narrival = inf"), "requests[0].arrival", "must be finite")
    bad_case(VALID.replace("intercept = 0.01", "intercept = nan"), "cost.intercept", "must be finite")
    bad_case(VALID.replace("kv_capacity = 64", "kv_capacity = inf"), "system.kv_capacity", "must be an integer")


def test_intercept_must_be_positive(bad_case):
    bad_case(VALID.replace("intercept = 0.01\n", ""), "cost.intercept", "must be > 0")
    bad_case(VALID.replace("intercept = 0.01", 'preset = "unit-batches"\nintercept = 0.0'), "cost.intercept", "> 0")


def test_unknown_preset(bad_case):
    bad_case(VALID.replace("intercept = 0.01", 'preset = "llama-9000"'), "cost.preset", "unknown preset 'llama-9000'")


def test_p_greater_than_c(bad_case):
    bad_case(VALID.replace("max_batch_tokens = 16", "max_batch_tokens = 16\nmax_prefill_tokens = 17"),
             "system.max_prefill_tokens", "P = 17 exceeds max_batch_tokens C = 16")


def test_peak_kv_over_m_names_the_request(bad_case):
    # the fourth request after expansion (id 3) needs 60 + 6 - 1 = 65 > 64
    content = VALID.replace("output = 4", "output = 4\ncount = 3") + "[[requests]]\nprompt = 60\noutput = 6\n"
    bad_case(content, "request 3", "peak KV 65", "exceeds kv_capacity 64")


def test_peak_kv_over_m_with_block_rounding(bad_case, cli, write_file):
    # 8 + 4 - 1 = 11 tokens fit in M = 12 token by token, but blocks of 8 make it 16
    content = VALID.replace("kv_capacity = 64", "kv_capacity = 12")
    rc, _, err = cli("simulate", write_file("fits.toml", content), "--scheduler", "sarathi")
    assert (rc, err) == (0, "")
    bad_case(content.replace("max_batch_tokens = 16", "max_batch_tokens = 16\nblock_size = 8"),
             "request 0", "peak KV 16", "blocks of 8", "exceeds kv_capacity 12")


def test_prompt_that_never_fits_a_non_chunking_scheduler(bad_case, cli, write_file):
    # request 1's prompt is longer than C = 16: chunked prefill serves it ...
    content = VALID + "[[requests]]\nprompt = 20\noutput = 2\n"
    rc, _, err = cli("simulate", write_file("long.toml", content), "--scheduler", "sarathi")
    assert (rc, err) == (0, "")
    # ... but vLLM does not chunk, so it refuses the case up front, naming the request
    err = bad_case(content, "scheduler vllm cannot serve", "request 1", "prompt of 20 tokens", "P = 16",
                   scheduler="vllm", name="long.toml")
    assert "does not chunk" in err


def test_empty_request_list(bad_case):
    bad_case("requests = []\n" + VALID[:VALID.index("[[requests]]")], "requests", "the request list is empty")


def test_unreadable_files(bad_case, cli, tmp_path):
    missing = tmp_path / "nope.toml"
    rc, out, err = cli("simulate", missing, "--scheduler", "sarathi")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: {missing}: cannot read file")
    rc, out, err = cli("simulate", tmp_path, "--scheduler", "sarathi")  # a directory
    assert rc == 2 and err.startswith(f"error: {tmp_path}: cannot read file") and err.count("\n") == 1
    bad_case(b"\xff\xfe[system]\n", "cannot read file", "not UTF-8")


def test_malformed_toml(bad_case):
    bad_case(VALID.replace("kv_capacity = 64", "kv_capacity = = 64"), "malformed TOML")
    bad_case(VALID + "[system]\n", "malformed TOML")  # a table defined twice


def _trace_case(trace: str, extra: str = "") -> str:
    return VALID[:VALID.index("[[requests]]")] + f'[workload]\ntrace = "{trace}"\n{extra}'


def test_malformed_csv_traces(bad_case, write_file, tmp_path):
    cases = [
        ("header.csv", "time,prompt,output\n0,1,1\n", "header", "unknown trace format"),
        ("fields.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,2\n1.0,5\n", "row 3",
         "expected 3 fields, got 2"),
        ("notnum.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,five,2\n", "row 2",
         "column num_prefill_tokens", "not a number"),
        ("frac.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,2.5\n", "column num_decode_tokens",
         "must be an integer"),
        ("zero.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,0\n", "must be >= 1"),
        ("time.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,2\n", "column TIMESTAMP", "not a time"),
        ("inf.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\ninf,5,2\n", "column arrived_at", "must be finite"),
        ("empty.csv", "", "empty trace file"),
        ("quote.csv", 'arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,"5\n', "row 2", "expected 3 fields"),
        ("huge.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0," + "9" * 200_000 + ",2\n",
         "malformed CSV", "field larger than field limit"),
        ("binary.csv", b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,\xff,2\n", "not UTF-8"),
    ]
    for name, content, *fragments in cases:
        trace = write_file(name, content)
        bad_case(_trace_case(name), *fragments, name=f"case_{name}.toml", names=trace)


def test_workload_table_errors(bad_case, write_file, tmp_path):
    write_file("t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,5,2\n")
    bad_case(_trace_case("t.csv", "limit = 0\n"), "workload.limit", ">= 1")
    bad_case(_trace_case("t.csv", "offset = -1\n"), "workload.offset", ">= 0")
    bad_case(_trace_case("t.csv", "time_scale = -2.0\n"), "workload.time_scale", ">= 0")
    bad_case(_trace_case("t.csv", "time_scale = nan\n"), "workload.time_scale", "finite")
    bad_case(_trace_case("t.csv", "offset = 5\n"), "no requests selected", names=tmp_path / "t.csv")
    bad_case(_trace_case("missing.csv"), "cannot read trace", names=tmp_path / "missing.csv")
    bad_case(VALID + '[workload]\ntrace = "t.csv"\n', "workload", "not both")
    bad_case(_trace_case("t.csv").replace('trace = "t.csv"', "limit = 3"), "workload.trace: missing")


# ----------------------------------------------------------------------------- defaults and expansion

def test_defaults_are_applied_silently(cli, write_file):
    path = write_file("min.toml", VALID)
    inst = load_case(path)
    assert inst.requests == (Request(8, 4, 0.0),)  # count 1, arrival 0
    assert inst.system.block_size == 1
    assert inst.system.max_prefill_tokens == inst.system.max_batch_tokens == 16
    assert inst.cost == CostModel(intercept=0.01, per_token=0.001)
    assert (inst.cost.decode_kv, inst.cost.prefill_attention, inst.cost.prefill_kv,
            inst.cost.per_prefill_request) == (0.0, 0.0, 0.0, 0.0)
    rc, out, err = cli("simulate", path, "--scheduler", "sarathi")
    assert rc == 0 and err == ""


def test_name_and_description_default_to_empty(write_file):
    inst = load_case(write_file("noname.toml", VALID.replace('name = "ok"\n', "")))
    assert (inst.name, inst.description) == ("", "")


def test_preset_with_overrides(write_file):
    text = VALID.replace("intercept = 0.01\nper_token = 0.001", 'preset = "llama2-7b-h100"\nprefill_kv = 1e-8')
    cost = load_case(write_file("preset.toml", text)).cost
    base = PRESETS["llama2-7b-h100"]
    assert cost.prefill_kv == 1e-8
    assert (cost.intercept, cost.per_token, cost.decode_kv, cost.prefill_attention) == \
        (base.intercept, base.per_token, base.decode_kv, base.prefill_attention)
    cost = load_case(write_file("preset2.toml", text.replace("prefill_kv", "intercept"))).cost
    assert cost.intercept == 1e-8 and cost.per_token == base.per_token


def test_count_expansion_order(write_file):
    text = VALID[:VALID.index("[[requests]]")] + """
[[requests]]
prompt = 4
output = 2
count = 2
arrival = 5.0
[[requests]]
prompt = 3
output = 1
[[requests]]
prompt = 2
output = 3
count = 3
arrival = 1.5
"""
    inst = load_case(write_file("count.toml", text))
    # file order, each entry's copies consecutive; ids are NOT sorted by arrival
    assert inst.requests == (Request(4, 2, 5.0), Request(4, 2, 5.0), Request(3, 1, 0.0),
                             Request(2, 3, 1.5), Request(2, 3, 1.5), Request(2, 3, 1.5))


def test_workload_trace_relative_to_the_case_file(write_file, tmp_path):
    write_file("sub/traces/t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                   "10.0,5,2\n10.5,6,3\n12.0,7,4\n13.0,8,5\n")
    case = write_file("sub/case.toml", _trace_case("traces/t.csv", "offset = 1\nlimit = 2\ntime_scale = 2.0\n"))
    inst = load_case(case)
    assert inst.requests == (Request(6, 3, 0.0), Request(7, 4, 3.0))


# ----------------------------------------------------------------------------- traces

def test_splitwise_conv_trace(shared_data):
    path = shared_data / "traces" / "splitwise_conv.csv"
    reqs = load_trace(path)
    assert len(reqs) == 19366
    assert reqs[0] == Request(374, 44, 0.0)
    assert reqs[1] == Request(396, 109, 4.314579)
    assert reqs[-1] == Request(197, 183, 3501.721937)
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals)


def test_splitwise_trace_limit_offset_time_scale(shared_data):
    path = shared_data / "traces" / "splitwise_conv.csv"
    reqs = load_trace(path, limit=3)
    assert [(r.prompt, r.output) for r in reqs] == [(374, 44), (396, 109), (879, 55)]
    assert [r.arrival for r in reqs] == pytest.approx([0.0, 4.314579, 4.541877])
    # rows 2..4 of the data: shifted so that the first selected arrives at 0, then scaled
    reqs = load_trace(path, offset=1, limit=3, time_scale=0.5)
    assert [(r.prompt, r.output) for r in reqs] == [(396, 109), (879, 55), (91, 16)]
    assert [r.arrival for r in reqs] == pytest.approx([0.0, (4.541877 - 4.314579) * 0.5, (4.710427 - 4.314579) * 0.5])
    offline = load_trace(path, limit=50, time_scale=0.0)
    assert len(offline) == 50 and all(r.arrival == 0.0 for r in offline)
    assert len(load_trace(path, offset=19360)) == 6


def test_splitwise_trace_through_a_case_file(shared_data, write_file, cli):
    trace = shared_data / "traces" / "splitwise_conv.csv"
    case = write_file("conv.toml", _trace_case(str(trace), "limit = 20\n").replace("kv_capacity = 64", "kv_capacity = 4096")
                      .replace("max_batch_tokens = 16", "max_batch_tokens = 1024"))
    inst = load_case(case)
    assert len(inst) == 20 and inst.requests[0] == Request(374, 44, 0.0)
    rc, out, err = cli("simulate", case, "--scheduler", "sarathi")
    assert (rc, err) == (0, "") and "20 requests" in out


def test_splitwise_code_trace(shared_data):
    reqs = load_trace(shared_data / "traces" / "splitwise_code.csv")
    assert len(reqs) == 8819
    assert reqs[0] == Request(4808, 10, 0.0)
    assert reqs[1].arrival == pytest.approx(0.052)


def test_arxiv_lengths_trace(shared_data):
    reqs = load_trace(shared_data / "traces" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv")
    assert len(reqs) == 28257
    assert reqs[0] == Request(3772, 54, 0.0) and reqs[1] == Request(2015, 156, 0.0)
    assert all(r.arrival == 0.0 for r in reqs)


def test_azure_trace_format(write_file):
    path = write_file("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                   "2023-11-16 18:15:46.6805900,4808,10\n"
                                   "2023-11-16 18:15:50.9951690,374,44\n"
                                   "2023-11-16 18:16:01.0000000,100,1\n"
                                   "2023-11-17 00:00:00.5000000,7,3\n")
    reqs = load_trace(path)
    assert [(r.prompt, r.output) for r in reqs] == [(4808, 10), (374, 44), (100, 1), (7, 3)]
    expected = [0.0, 4.314579, 14.31941, 5 * 3600 + 44 * 60 + 13.81941]
    assert [r.arrival for r in reqs] == pytest.approx(expected, abs=1e-5)
    scaled = load_trace(path, offset=1, limit=2, time_scale=10.0)
    assert [r.arrival for r in scaled] == pytest.approx([0.0, (14.31941 - 4.314579) * 10], abs=1e-4)
    assert all(math.isfinite(r.arrival) for r in reqs)


def test_azure_trace_with_byte_order_mark(write_file):
    path = write_file("azure_bom.csv", ("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n"
                                        "2023-11-16 18:15:46.6805900,4808,10\n"
                                        "2023-11-16 18:15:47.6805900,10,2\n").encode("utf-8"))
    assert [r.arrival for r in load_trace(path)] == pytest.approx([0.0, 1.0])


def test_azure_timestamps_do_not_depend_on_the_local_time_zone(write_file, monkeypatch):
    """Naive timestamps are read as UTC: a trace across a DST change in the machine's zone keeps its gaps."""
    import time

    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset is not available on this platform")
    path = write_file("dst.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                 "2023-11-05 01:30:00.0000000,5,2\n"
                                 "2023-11-05 02:30:00.0000000,5,2\n")
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        arrivals = [r.arrival for r in load_trace(path)]
    finally:
        monkeypatch.undo()
        time.tzset()
    assert arrivals == pytest.approx([0.0, 3600.0])
