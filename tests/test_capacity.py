"""`kvbound capacity` and kvbound.analysis.capacity: effective throughput under an SLO; sweep claims."""
import json

import pytest

from kvbound import Instance, Request, SystemConfig
from kvbound.analysis.capacity import capacity, latency_capacity, scale_arrivals, slo_attainment
from kvbound.analysis.sweep.claims import check_claims
from kvbound.analysis.sweep.spec import ClaimSpec, parse_spec
from kvbound.costs import PRESETS
from kvbound.errors import InputError
from kvbound.schedule import Slo

# ten requests I = 4, O = 3, one a second; every batch takes 1 s, so at rate factor f the requests arrive
# 1 / f s apart and each needs 3 batches (prefill + 2 decodes): TTFT grows once they come faster than served
INST = Instance(tuple(Request(4, 3, float(k)) for k in range(10)), SystemConfig(64, 8), PRESETS["unit-batches"])
SLO = Slo(ttft=2.0, tbt=1.0)


def test_capacity_finds_the_largest_factor_that_attains_the_target():
    result = capacity(INST, "sarathi", SLO, 0.7, rel_tol=0.01)
    assert result.slo_attainment >= 0.7
    assert result.slo_attainment == slo_attainment(scale_arrivals(INST, result.rate_factor), "sarathi", SLO)
    assert slo_attainment(scale_arrivals(INST, result.rate_factor * 1.02), "sarathi", SLO) < 0.7
    assert result.requests_per_second == pytest.approx(result.rate_factor * 10 / 9)
    assert list(result.to_json()) == ["scheduler", "rate_factor", "requests_per_second", "slo_attainment", "capped", "status"]
    assert result.capped is False  # issue 34: a key added (a result at the search's cap says so)


def test_a_capped_search_names_what_it_keeps():
    """The note of a search that hit its cap says which target held: the SLO's attainment, or a latency limit
    (a latency capacity used to speak of an SLO that was never given)."""
    never = latency_capacity(INST, "sarathi", "mean_latency", 1e9)
    assert never.capped and never.rate_factor == 2 ** 20
    assert "mean_latency <= 1e+09 s still met" in never.cap_note and "SLO" not in never.cap_note
    always = capacity(INST, "sarathi", Slo(ttft=1e-9, tbt=1e-9), 0.7)
    assert always.capped and always.rate_factor == 0
    assert always.cap_note.startswith("the SLO attainment >= 0.7 is not met")


def test_an_interrupt_pending_before_the_search_measures_nothing():
    # one caught while the command imported raises nothing: the search used to bisect on regardless
    from kvbound import interrupt

    interrupt.request()
    try:
        result = capacity(INST, "sarathi", SLO, 0.7)
    finally:
        interrupt.reset()
    assert result.interrupted and result.evaluations == 0 and result.rate_factor == 0


def test_capacity_bad_input():
    with pytest.raises(InputError, match="same time"):
        capacity(Instance((Request(4, 3),) * 2, INST.system, INST.cost), "sarathi", SLO)
    with pytest.raises(InputError, match="attainment"):
        capacity(INST, "sarathi", SLO, 1.5)
    with pytest.raises(InputError, match="nosuch"):
        capacity(INST, "nosuch", SLO)


def test_cli_capacity(cli, write_file):
    lines = ["[system]", "kv_capacity = 64", "max_batch_tokens = 8", "[cost]", 'preset = "unit-batches"']
    for k in range(10):
        lines += ["[[requests]]", "prompt = 4", "output = 3", f"arrival = {k}.0"]
    case = write_file("ten.toml", "\n".join(lines) + "\n")
    rc, out, err = cli("capacity", case, "--scheduler", "sarathi", "--slo", "ttft=2,tbt=1")
    assert rc == 0, err
    data = json.loads(out)
    assert list(data) == ["scheduler", "rate_factor", "requests_per_second", "slo_attainment", "capped", "status"]
    assert data["slo_attainment"] >= 0.7 and "rate factor" in err
    rc, out, err = cli("capacity", case, "--scheduler", "larry:alpha=-1", "--slo", "ttft=2,tbt=1")
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and "alpha" in err


def test_claims_hold_or_fail_with_their_numbers():
    rows = [{"point": "p", "scheduler": s, "status": "ok", "rate": 1.0, "p50_ttft": v}
            for s, v in (("larry", 1.0), ("fcfs", 2.0), ("trail", 1.5))]
    keys = ("rate",)
    holds = check_claims([ClaimSpec("x", "p50_ttft", "larry", ("fcfs", "trail"), 1.5)], rows, keys)[0]
    assert holds.verdict == "holds" and holds.points[0].ratios == {"fcfs": 2.0, "trail": 1.5}
    fails = check_claims([ClaimSpec("x", "p50_ttft", "larry", ("fcfs", "trail"), 1.8)], rows, keys)[0]
    assert fails.verdict == "fails"
    higher = check_claims([ClaimSpec("x", "p50_ttft", "fcfs", ("larry",), 1.0, higher=True)], rows, keys)[0]
    assert higher.verdict == "holds"
    none = check_claims([ClaimSpec("x", "p50_ttft", "larry", ("fcfs",), where=(("rate", (2.0,)),))], rows, keys)[0]
    assert none.points == [] and none.verdict == "fails"


@pytest.mark.parametrize("claim, field", [
    ({"text": "x", "metric": "nope", "better": "vllm", "than": "sarathi"}, "claim[0].metric"),
    ({"text": "x", "metric": "mean_ttft", "better": "larry", "than": "sarathi"}, "claim[0].better"),
    ({"text": "x", "metric": "mean_ttft", "better": "vllm", "than": "sarathi", "by": -1}, "claim[0].by"),
    ({"text": "x", "metric": "mean_ttft", "better": "vllm", "than": "sarathi", "where": {"rate": [1]}}, "claim[0].where"),
    ({"metric": "mean_ttft", "better": "vllm", "than": "sarathi"}, "claim[0].text"),
])
def test_bad_claims_and_rates_are_input_errors(claim, field):
    base = {"grid": {"prompt": 4, "output": 2, "requests": 2, "kv_capacity": 64, "max_batch_tokens": 64},
            "run": {"schedulers": ["vllm", "sarathi"]}}
    with pytest.raises(InputError) as info:
        parse_spec({**base, "claim": [claim]})
    assert info.value.field == field
    with pytest.raises(InputError, match="rate"):
        parse_spec({**base, "grid": {**base["grid"], "rate": 0}})
    with pytest.raises(InputError, match="slo"):
        parse_spec({**base, "run": {**base["run"], "slo": "ttft=1"}})
