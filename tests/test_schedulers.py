"""Heuristic schedulers: valid schedules, documented refusals only, never better than the optimum.

* every scheduler on random small instances: the schedule survives a JSON round trip,
  replays under `validate` to the same metrics, and refusals happen exactly where the
  scheduler's documented rule says;
* on tiny instances, no scheduler beats the brute-force optimum (tests/oracle.py) for total
  latency, mean latency or mean TTFT, and eviction-free schedulers never evict;
* fixed cases: stuck/livelock detection, option parsing, the seed paper's Figure 15.
"""
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbound import (SCHEDULERS, Batch, CostModel, InputError, Instance, Request, SystemConfig,
                     get_scheduler, run_scheduler, simulate, validate)
from kvbound.costs import PRESETS
from kvbound.errors import SchedulerRefused, SchedulerStuck
from kvbound.schedulers import REGISTRY, Policy, SptWaves, UnifiedScheduler
from kvbound.schedulers.registry import Option
from kvbound.schedulers.waves import plan_waves, wave_cost
from kvbound.io.cases import load_case
from kvbound.io.schedules import schedule_from_json
from kvbound.schedule import ReplayState, Schedule
from tests.conftest import REPO
from tests.oracle import OBJECTIVES, brute_force, tiny_instances

# ------------------------------------------------------------------ the documented refusal rules

#: no chunked prefill, may evict: a refill (up to I + O - 1 tokens) must fit P in one batch
NON_CHUNKING_EVICTING = {"vllm", "vllm-hy", "sarathi-nocp", "sarathi-nohy"}
#: no chunked prefill, never evicts: only the prompt must fit P
NON_CHUNKING_EVICTION_FREE = {name + "-ef" for name in NON_CHUNKING_EVICTING} | {"mcsf"}
NON_CHUNKING_EVICTING |= {"apt-greedy"}
#: chunked prefill: serve every valid instance
CHUNKING = {"sarathi", "sarathi-pc", "sarathi-ef", "sarathi-pc-ef", "rank-i", "rank-o", "evict-short", "mcsf-pc", "srpt",
            "sarathi-pc-mc", "sjf-mc", "spt-waves", "larry", "trail", "fcfs", "no-preempt", "vllm-v1"}
#: prompts must fit P and (1 - alpha) M; a refill that does not fit stops it loudly (SchedulerStuck)
PROTECTING = {"fcfs-protect"}
FCFS_ALPHA = 0.2

EVICTION_FREE = {name for name in SCHEDULERS if name.endswith("-ef")} | {"mcsf", "spt-waves", "no-preempt"}


def test_every_scheduler_has_a_rule():
    groups = [NON_CHUNKING_EVICTING, NON_CHUNKING_EVICTION_FREE, CHUNKING, PROTECTING]
    assert set().union(*groups) == set(SCHEDULERS)
    assert sum(len(g) for g in groups) == len(SCHEDULERS)


def blocks(inst, tokens):
    b = inst.system.block_size
    return -(-tokens // b) * b


def refusal_expected(name, inst) -> bool:
    P = inst.system.max_prefill_tokens
    reqs = inst.requests
    if name in NON_CHUNKING_EVICTING:
        return any(r.prompt + r.output - 1 > P for r in reqs)
    if name in NON_CHUNKING_EVICTION_FREE:
        return any(r.prompt > P for r in reqs)
    if name in PROTECTING:
        limit = (1 - FCFS_ALPHA) * inst.system.kv_capacity
        return any(r.prompt > P or blocks(inst, r.prompt) > limit for r in reqs)
    return False


def stuck_allowed(name, inst) -> bool:
    """fcfs-protect clears running requests; a refill (up to I + O - 1) may then never fit again."""
    if name not in PROTECTING:
        return False
    limit = (1 - FCFS_ALPHA) * inst.system.kv_capacity
    return any(r.peak_kv > inst.system.max_prefill_tokens or blocks(inst, r.peak_kv) > limit for r in inst.requests)


def run_checked(name, inst):
    """Run a scheduler; check that a refusal or a stop is allowed (and names it). None if it refused."""
    try:
        result = run_scheduler(inst, name)
    except SchedulerRefused as exc:
        assert refusal_expected(name, inst), f"{name} refused an instance its rule accepts: {exc}"
        assert f"scheduler {name} " in str(exc)
        return None
    except SchedulerStuck as exc:
        assert stuck_allowed(name, inst), f"{name} got stuck: {exc}"
        assert f"scheduler {name} " in str(exc)
        return None
    assert not refusal_expected(name, inst), f"{name} accepted an instance its rule refuses"
    return result


# ------------------------------------------------------------------ random small instances

COSTS = [PRESETS["llama2-7b-a100"], PRESETS["unit-batches"],
         CostModel(intercept=1e-3, per_token=1e-4, decode_kv=1e-6, prefill_attention=1e-6, prefill_kv=1e-6,
                   per_prefill_request=1e-3)]


@st.composite
def small_instances(draw):
    k = draw(st.integers(1, 6))
    cost = draw(st.sampled_from(COSTS))
    online = draw(st.booleans())
    requests = []
    for _ in range(k):
        arrival = draw(st.integers(0, 8)) * 0.75 * cost.intercept if online else 0.0
        requests.append(Request(draw(st.integers(1, 40)), draw(st.integers(1, 10)), arrival))
    b = draw(st.integers(1, 4))
    peaks = [-(-r.peak_kv // b) * b for r in requests]
    M = draw(st.integers(max(peaks), sum(peaks) + b))
    C = draw(st.one_of(st.integers(1, 64), st.integers(50, 128)))
    P = draw(st.one_of(st.just(C), st.integers(1, C)))
    return Instance(tuple(requests), SystemConfig(M, C, P, b), cost)


SMALL = settings(max_examples=30, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
@SMALL
@given(inst=small_instances())
def test_schedules_validate_after_a_json_round_trip(name, inst):
    result = run_checked(name, inst)
    if result is None:
        return
    text = json.dumps(result.schedule.to_json())
    assert json.dumps(result.schedule.json_form()) == text  # what the CLI writes
    assert result.schedule.json_text() == text  # `kvbound simulate --json`'s schedule
    schedule = schedule_from_json(json.loads(text))
    assert schedule.requests == inst.requests
    # what the CLI and the analyses report is the simulator's own replay: the validator's, from the file
    # form, must say the same, batch by batch
    replay = validate(inst, schedule)
    assert replay.metrics == result.replay.metrics
    for field in ("completion", "first_token", "batch_start", "batch_end", "batch_kv", "request_p99_tbt"):
        assert np.array_equal(getattr(replay, field), getattr(result.replay, field), equal_nan=True), field
    # every token of every request is processed once, plus what evictions threw away
    processed = sum(sum(b.tokens.values()) for b in schedule.batches)
    assert processed == sum(r.peak_kv for r in inst.requests) + replay.metrics.recomputed_tokens
    assert replay.metrics.peak_kv <= inst.system.kv_capacity
    if name in EVICTION_FREE:
        assert replay.metrics.evictions == 0


def test_json_text_is_json_dumps_for_every_kind_of_batch():
    """`Schedule.json_text` writes json.dumps' text itself; the batches it does not cache (a start that
    is an int or not finite, ids outside the requests) go through json.dumps: the same text each way."""
    requests = (Request(3, 2), Request(1, 1, 0.5))
    batches = [Batch({0: 3, 1: 1}), Batch({0: 1}, start=0.25), Batch({}, (0,), start=1.0), Batch({0: 2, 1: 1}, (1,)),
               Batch({1: 1, 0: 1}, start=2), Batch({7: 1, -1: 4}), Batch({0: 1}, start=float("nan")),
               Batch({0: 5}, (0, 1), start=1e-300)]
    for cut in range(len(batches) + 1):
        schedule = Schedule(requests, batches[:cut])
        assert schedule.json_text() == json.dumps(schedule.json_form()) == json.dumps(schedule.to_json())


@pytest.mark.parametrize("name", ["sarathi", "vllm-v1", "srpt", "sjf-mc", "apt-greedy"])
@SMALL
@given(inst=small_instances())
def test_token_gaps_are_the_batch_ends_between_a_requests_tokens(name, inst):
    """The replay derives every token gap at the end from the batches (`ReplayState._token_gaps`);
    counted here batch by batch instead: a request whose n grew generated a token at the batch's end."""
    result = run_checked(name, inst)
    if result is None:
        return
    state = ReplayState(inst)
    counted, owners, last = [], [], {}
    for batch in result.schedule.batches:
        before = list(state.n)
        end = state.apply(batch)
        for i in batch.tokens:  # in the batch's order, as the replay pools them
            if state.n[i] > before[i]:
                if i in last:
                    counted.append(end - last[i])
                    owners.append(i)
                last[i] = end
    gaps, gap_requests = state._token_gaps(np.array(state.ends))
    assert gaps.tolist() == counted and gap_requests.tolist() == owners
    replay = state.finish()
    assert replay.metrics.mean_tbt == (float(np.mean(counted)) if counted else 0.0)
    for i in range(len(inst.requests)):
        own = [g for g, o in zip(counted, owners) if o == i]
        # the grouped percentile interpolates in its own order of operations: equal up to rounding
        assert replay.request_p99_tbt[i] == pytest.approx(float(np.percentile(own, 99)) if own else 0.0, rel=1e-12, abs=0)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_refusals_follow_the_rule(name):
    # I = 8, O = 4: the prompt fits P = 8, a refill of up to I + O - 1 = 11 does not
    system = SystemConfig(kv_capacity=64, max_batch_tokens=16, max_prefill_tokens=8)
    fits_prompt = Instance((Request(8, 4), Request(2, 2)), system, PRESETS["unit-batches"])
    long_prompt = Instance((Request(2, 2), Request(9, 1)), system, PRESETS["unit-batches"])
    assert refusal_expected(name, fits_prompt) == (name in NON_CHUNKING_EVICTING)
    assert refusal_expected(name, long_prompt) == (name not in CHUNKING)
    for inst in (fits_prompt, long_prompt):
        if refusal_expected(name, inst):
            with pytest.raises(SchedulerRefused, match=f"scheduler {name} .*request 1" if inst is long_prompt else name):
                run_scheduler(inst, name)
        else:
            validate(inst, run_scheduler(inst, name).schedule)


def test_fcfs_protect_refuses_a_prompt_over_the_protection_threshold():
    inst = Instance((Request(9, 1),), SystemConfig(10, 64), PRESETS["unit-batches"])
    validate(inst, run_scheduler(inst, "fcfs-protect:alpha=0.1").schedule)
    with pytest.raises(SchedulerRefused, match=r"fcfs-protect:alpha=0\.2.*request 0.*protection threshold"):
        run_scheduler(inst, "fcfs-protect:alpha=0.2")


# ------------------------------------------------------------------ against the optimum

TINY = settings(max_examples=50, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@TINY
@given(inst=tiny_instances())
def test_no_heuristic_beats_the_optimum(inst):
    best = {obj: brute_force(inst, obj).value for obj in OBJECTIVES}
    best_no_evict = {obj: brute_force(inst, obj, allow_evict=False).value for obj in OBJECTIVES}
    for name in SCHEDULERS:
        result = run_checked(name, inst)
        if result is None:
            continue
        metrics = result.replay.metrics
        for obj in OBJECTIVES:
            assert getattr(metrics, obj) >= best[obj] * (1 - 1e-9), (name, obj, getattr(metrics, obj), best[obj])
        if name in EVICTION_FREE:
            assert metrics.evictions == 0, name
            for obj in OBJECTIVES:
                assert getattr(metrics, obj) >= best_no_evict[obj] * (1 - 1e-9), (name, obj)


def test_a_heuristic_can_be_optimal_and_the_oracle_knows_it():
    # one request alone: every scheduler runs prefill + (O - 1) decodes, which is optimal
    inst = Instance((Request(3, 3),), SystemConfig(5, 64), PRESETS["llama2-7b-a100"])
    best = brute_force(inst, "total_latency").value
    for name in SCHEDULERS:
        assert run_scheduler(inst, name).replay.metrics.total_latency == pytest.approx(best, rel=1e-9), name


# ------------------------------------------------------------------ stuck and livelock detection

def test_fcfs_protect_stuck_on_a_refill_over_the_threshold():
    # two requests I = 2, O = 6 in M = 10 with alpha = 0.5 (threshold 5): both are admitted
    # (2 + 2), decode together until their next decodes need 6 + 6 > 10, are cleared, and a
    # refill of 6 tokens never fits under the threshold again
    inst = Instance((Request(2, 6), Request(2, 6)), SystemConfig(10, 64), PRESETS["unit-batches"])
    with pytest.raises((SchedulerStuck, SchedulerRefused), match=r"scheduler fcfs-protect:alpha=0\.5 .*refill"):
        run_scheduler(inst, "fcfs-protect:alpha=0.5")
    # with the default alpha = 0.2 it finishes (a refill of 6 fits under 8), evicting on the way
    result = run_scheduler(inst, "fcfs-protect")
    assert result.replay.metrics.evictions > 0
    validate(inst, result.schedule)


class _Flapper(Policy):
    """Processes one token of request 0, evicts it, and again, forever."""

    name = "flapper"

    def next_batch(self, st):
        if st.m[0] > 0:
            return Batch({}, (0,))
        return Batch({0: 1}, ())


class _Idle(Policy):
    name = "idler"

    def next_batch(self, st):
        return Batch({}, ())


def test_livelock_is_detected_and_names_the_policy():
    inst = Instance((Request(3, 2),), SystemConfig(8, 64), PRESETS["unit-batches"])
    with pytest.raises(SchedulerStuck, match="scheduler flapper livelocks"):
        simulate(inst, _Flapper())


def test_a_policy_that_schedules_nothing_is_stuck():
    inst = Instance((Request(3, 2),), SystemConfig(8, 64), PRESETS["unit-batches"])
    with pytest.raises(SchedulerStuck, match="scheduler idler is stuck"):
        simulate(inst, _Idle())


# ------------------------------------------------------------------ option parsing

def test_scheduler_options_override_the_preset():
    policy = get_scheduler("sarathi:prefill_limit=256")
    assert isinstance(policy, UnifiedScheduler)
    assert policy.name == "sarathi:prefill_limit=256"
    base = get_scheduler("sarathi").params
    assert policy.params.prefill_limit == 256 and base.prefill_limit == 512
    assert (policy.params.priority, policy.params.hybrid, policy.params.chunked) == (base.priority, base.hybrid, base.chunked)
    assert get_scheduler("vllm:hybrid=true").params.hybrid is True
    assert get_scheduler("sarathi:prefill_limit=none").params.prefill_limit is None
    assert get_scheduler("fcfs-protect:alpha=0.5").alpha == 0.5
    # and the option takes effect: the first chunk of a 1000-token prompt is P tokens
    inst = Instance((Request(1000, 2),), SystemConfig(2000, 4096), PRESETS["llama2-7b-a100"])
    assert simulate(inst, policy).schedule.batches[0].tokens == {0: 256}
    assert run_scheduler(inst, "sarathi").schedule.batches[0].tokens == {0: 512}
    assert run_scheduler(inst, "sarathi-pc").schedule.batches[0].tokens == {0: 1000}


@pytest.mark.parametrize("spec, names", [
    ("nosuch", "nosuch"),
    ("sarath", "did you mean 'sarathi'"),
    ("sarathi:bogus=1", "bogus"),
    ("sarathi:prefill_limit", "not key=value"),
    ("sarathi:prefill_limit=abc", "prefill_limit"),
    ("sarathi:prefill_limit=2.5", "prefill_limit"),
    ("sarathi:prefill_limit=0", "prefill_limit"),
    ("sarathi:prefill_limit=-3", "prefill_limit"),
    ("vllm:hybrid=maybe", "hybrid"),
    ("sarathi:priority=random", "priority"),
    ("sarathi:victim=oldest", "victim"),
    ("sarathi:reserve=all", "reserve"),
    ("sarathi:decode_order=random", "decode_order"),
    ("fcfs-protect:alpha=1.5", "alpha"),
    ("fcfs-protect:alpha=-0.1", "alpha"),
    ("fcfs-protect:alpha=x", "alpha"),
    ("fcfs-protect:beta=0.1", "beta"),
    ("mcsf:alpha=0.1", "mcsf"),
    ("larry:alpha=-1", "alpha"),
    ("larry:alpha=x", "alpha"),
    ("larry:c=0.5", "c"),
    ("trail:c=1.5", "c"),
    ("trail:alpha=1", "alpha"),
    ("vllm-v1:max_num_seqs=0", "max_running"),
    ("vllm-v1:max_num_batched_tokens=abc", "max_num_batched_tokens"),
    ("sarathi:max_running=0", "max_running"),
    ("sarathi:max_num_seqs=4", "max_num_seqs"),  # vllm-v1's names only
    ("apt-greedy:beta=1", "apt-greedy"),
])
def test_bad_scheduler_options(spec, names):
    with pytest.raises(InputError) as info:
        get_scheduler(spec)
    assert names in str(info.value)


# ------------------------------------------------------------------ the registry

#: per option type: bad values and the one-line error each gives (after "scheduler: SPEC: KEY: ")
BAD_VALUES = {
    bool: [("maybe", "expected true or false, got 'maybe'")],
    int: [("abc", "expected an integer, got 'abc'"), ("2.5", "expected an integer below 2^53, got '2.5'"),
          ("9007199254740992", "expected an integer below 2^53, got '9007199254740992'")],
    float: [("x", "expected a number, got 'x'"), ("nan", "expected a finite number, got 'nan'")],
}
#: per option type: a good value and what it parses to (str options: their default)
GOOD_VALUES = {bool: ("off", False), int: ("7", 7), float: ("0.5", 0.5)}


def _option_value(policy, target):
    """The value an option set: a field of a unified policy's parameters, else a constructor argument."""
    params = getattr(policy, "params", None)
    return getattr(params, target) if hasattr(params, target) else getattr(policy, target)


def test_the_registry_lists_the_schedulers_in_order():
    assert list(SCHEDULERS) == list(REGISTRY)
    assert all(SCHEDULERS[name] == entry.description for name, entry in REGISTRY.items())


def test_options_are_typed_by_their_declarations():
    assert REGISTRY["fcfs-protect"].options == {"alpha": Option(float, 0.2, False, "alpha")}
    assert REGISTRY["sarathi"].options["prefill_limit"] == Option(int, 512, True, "prefill_limit")
    assert REGISTRY["vllm"].options["hybrid"] == Option(bool, False, False, "hybrid")
    assert REGISTRY["vllm"].options["priority"] == Option(str, "prefill", False, "priority")
    assert REGISTRY["vllm-v1"].options["max_num_seqs"] == Option(int, 256, True, "max_running")
    assert REGISTRY["larry"].options["alpha"] == Option(float, 1.0, False, "alpha")
    assert REGISTRY["vllm-ef"].options["reserve"].default == "peak"
    assert REGISTRY["mcsf"].options == {} == REGISTRY["spt-waves"].options


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_registry_entry_builds_and_parses_its_options_by_type(name):
    entry = REGISTRY[name]
    policy = get_scheduler(name)
    assert isinstance(policy, entry.cls) and policy.name == name
    allowed = ", ".join(sorted(entry.options))
    with pytest.raises(InputError) as info:
        get_scheduler(f"{name}:bogus=1")
    assert str(info.value).endswith(f"bogus: unknown option; allowed: {allowed}" if allowed else f"{name} takes no options")
    for key, option in entry.options.items():
        assert _option_value(policy, option.target) == option.default, key
        text, value = GOOD_VALUES.get(option.kind, (option.default, option.default))
        spec = f"{name}:{key}={text}"
        built = get_scheduler(spec)
        assert built.name == spec and _option_value(built, option.target) == value, spec
        if option.optional:
            assert _option_value(get_scheduler(f"{name}:{key}=none"), option.target) is None
        # a str option is checked by the policy: its error names the option
        bad_values = BAD_VALUES.get(option.kind, [("random", f"{option.target} must be")])
        for bad, message in bad_values:
            with pytest.raises(InputError) as info:
                get_scheduler(f"{name}:{key}={bad}")
            error = str(info.value)
            assert "\n" not in error
            if option.kind is str:
                assert error.startswith(f"scheduler: {name}:{key}={bad}: ") and message in error, error
            else:
                assert error == f"scheduler: {name}:{key}={bad}: {key}: {message}"


# ------------------------------------------------------------------ the seed paper's Figure 15

def test_figure_15_vllm_evicts_and_beats_its_eviction_free_variant():
    # four requests I = 16, O = 4 in M = 32 = 2I: vLLM admits all it can, evicts when decodes
    # outgrow M and recomputes; the eviction-free variant reserves I + O - 1 = 19 each and runs
    # one request at a time
    inst = Instance(tuple(Request(16, 4) for _ in range(4)), SystemConfig(32, 4096), PRESETS["llama2-7b-a100"])
    vllm = run_scheduler(inst, "vllm").replay.metrics
    vllm_ef = run_scheduler(inst, "vllm-ef").replay.metrics
    assert vllm.evictions > 0 and vllm.recomputed_tokens > 0
    assert vllm_ef.evictions == 0
    assert vllm.total_latency < vllm_ef.total_latency
    assert vllm.mean_latency < vllm_ef.mean_latency
    assert math.isfinite(vllm.total_latency)


# ------------------------------------------------------------------ MC-SF's admission test with chunked prefill

@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(["mcsf-pc", "sarathi-pc-mc", "sjf-mc"]), b=st.integers(1, 2))
def test_future_kv_admission_is_exact_when_every_prefill_fits_one_batch(data, name, b):
    # With C >= all prompts + all requests, a request's prefill ends in the batch that admits it and
    # every running request runs every batch, so the projection is the KV the schedule will hold:
    # it must never evict (M below the sum of the peaks makes memory bind).
    reqs = tuple(Request(data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))) for _ in range(data.draw(st.integers(2, 7))))
    peaks = [-(-r.peak_kv // b) * b for r in reqs]
    M = data.draw(st.integers(max(peaks), sum(peaks)))
    C = sum(r.prompt for r in reqs) + len(reqs)
    inst = Instance(reqs, SystemConfig(M, C, C, b), CostModel(intercept=1.0, per_token=0.1))
    replay = run_scheduler(inst, name).replay
    assert replay.metrics.evictions == 0
    assert replay.metrics.peak_kv <= M


# ------------------------------------------------------------------ SPT waves


def _cuts(order):
    """Every way to cut `order` into consecutive waves."""
    for mask in range(2 ** (len(order) - 1)):
        waves, start = [], 0
        for k in range(1, len(order)):
            if mask >> (k - 1) & 1:
                waves.append(order[start:k])
                start = k
        yield waves + [order[start:]]


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=small_instances())
def test_spt_waves_plan_is_the_best_cut_of_its_order(inst):
    # offline, the plan's estimate (sum over waves of S + D x later requests) is what the validator
    # measures, and no other cut of the same order into waves that fit M has a lower mean latency
    inst = Instance(tuple(Request(r.prompt, r.output) for r in inst.requests), inst.system, inst.cost)
    waves = plan_waves(inst)
    order = [i for w in waves for i in w]
    N, later, estimate = len(order), len(order), 0.0
    for w in waves:
        later -= len(w)
        D, S = wave_cost(inst, w)
        estimate += S + D * later
    mean = run_scheduler(inst, "spt-waves").replay.metrics.mean_latency
    assert mean == pytest.approx(estimate / N, rel=1e-9)
    s = inst.system
    for cut in _cuts(order):
        if all(sum(s.blocks(inst.requests[i].peak_kv) for i in w) <= s.kv_capacity for w in cut):
            other = simulate(inst, SptWaves(cut)).replay.metrics.mean_latency
            assert mean <= other * (1 + 1e-9), (cut, other, waves, mean)


def test_spt_waves_keeps_long_prompts_away_from_short_decodes():
    # 2 short and 2 long requests that all fit M at once: one wave would make the short requests'
    # decode batches wait for the long prefills; the plan runs the short ones first, alone
    reqs = (Request(1000, 4), Request(8, 4), Request(1000, 4), Request(8, 4))
    inst = Instance(reqs, SystemConfig(4096, 4096), PRESETS["llama2-7b-a100"])
    result = run_scheduler(inst, "spt-waves")
    assert plan_waves(inst)[0] == [1, 3]
    first_long = min(j for j, b in enumerate(result.schedule.batches) if 0 in b.tokens or 2 in b.tokens)
    assert max(result.replay.completion[i] for i in (1, 3)) <= result.replay.batch_start[first_long] + 1e-12
    one_wave = simulate(inst, SptWaves([[1, 3, 0, 2]])).replay.metrics.mean_latency
    assert result.replay.metrics.mean_latency < one_wave


# ------------------------------------------------------------------ issue 16: each new scheduler's defining rule

UNIT = PRESETS["unit-batches"]  # every batch takes 1 s


def test_larry_orders_waiting_requests_by_queue_length_times_memory_minus_alpha_times_wait():
    # X (I = 1, O = 3) runs alone in batch 0 (0 -> 1 s); A (I = 100) arrives at 0.25 s, B (I = 10) at 0.5 s.
    # At 1 s, q = 2: alpha = 1 gives A 2 * 100 - 0.75 = 199.25, B 2 * 10 - 0.5 = 19.5: B first;
    # alpha = 1000 gives A 200 - 750 = -550 and B 20 - 500 = -480: A first (FCFS, as the paper says).
    inst = Instance((Request(1, 3), Request(100, 2, 0.25), Request(10, 2, 0.5)), SystemConfig(200, 101), UNIT)
    first = run_scheduler(inst, "larry").schedule.batches[1].tokens
    assert first == {0: 1, 2: 10, 1: 90}  # the decode, then B whole, then A's first chunk in the room left
    assert list(first) == [0, 2, 1]
    assert list(run_scheduler(inst, "larry:alpha=1000").schedule.batches[1].tokens) == [0, 1]
    assert list(run_scheduler(inst, "fcfs").schedule.batches[1].tokens) == [0, 1]
    # dispatch stops at the first waiting request whose KV does not fit (M = 112: B's 10 fits, A's 100 does not
    # beside X's 3 + B's 10, and nothing behind A is tried)
    tight = Instance(inst.requests + (Request(1, 1, 0.75),), SystemConfig(112, 101), UNIT)
    assert list(run_scheduler(tight, "larry").schedule.batches[1].tokens) == [0, 3, 2]


def _trail_case():
    # R (I = 10, O = 10) runs from 0; W (I = 10, O = 2) arrives at 0.5 s. M = 20: W's 10 tokens of KV do
    # not fit beside R's 11 at 1 s, so W waits for R unless R is preempted (R has n / O = 0.1 then)
    return Instance((Request(10, 10), Request(10, 2, 0.5)), SystemConfig(20, 64), UNIT)


def test_trail_preempts_for_a_shorter_request_only_while_n_over_o_is_below_c():
    inst = _trail_case()
    for spec, preempts in (("trail:c=0.5", True), ("trail:c=0.1", False), ("trail", False)):
        result = run_scheduler(inst, spec)
        validate(inst, result.schedule)
        r = result.replay
        assert (r.metrics.evictions > 0) == preempts, spec
        assert (r.first_token[1] < r.completion[0]) == preempts, spec
    # at 1 s R's reservation (10) and W's 10 still fit M on paper; at 2 s (R holds 11, n / O = 0.2) it is preempted
    assert [b.evict for b in run_scheduler(inst, "trail:c=0.5").schedule.batches[:3]] == [(), (), (0,)]


def test_trail_serves_the_shortest_remaining_output_first():
    inst = Instance((Request(10, 8), Request(10, 2), Request(10, 5)), SystemConfig(64, 10), UNIT)
    assert [list(b.tokens) for b in run_scheduler(inst, "trail").schedule.batches[:2]] == [[1], [1, 2]]
    assert list(run_scheduler(inst, "fcfs").schedule.batches[0].tokens) == [0]


@pytest.mark.parametrize("preset, same_as", [("fcfs", "sarathi-pc"), ("no-preempt", "sarathi-pc-ef")])
def test_kossmann_baselines_are_the_documented_presets(preset, same_as):
    inst = load_case(REPO / "cases" / "sample200.toml")
    a, b = run_scheduler(inst, preset), run_scheduler(inst, same_as)
    assert [x.to_json() for x in a.schedule.batches] == [x.to_json() for x in b.schedule.batches]
    assert same_as in SCHEDULERS[preset]


def test_apt_greedy_picks_the_iteration_by_pending_time_and_requests_by_pending_per_memory():
    # X (I = 1, O = 3) and A (I = 8, O = 1) at 0, B (I = 2) at 0.5; C = P = 8, 1 s per batch.
    # t = 0: only waiting requests: prefill; all pending 0, so by arrival: X (1 token), A does not fit C.
    # t = 1: waiting pending A 1, B 0.5 (sum 1.5) > running X 0: prefill; B (0.5 / 2) before A (1 / 8).
    # t = 2: waiting A 2 > running X 1 + B 0: prefill A. t = 3: nothing waits: decode X and B.
    inst = Instance((Request(1, 3), Request(8, 1), Request(2, 2, 0.5)), SystemConfig(64, 8), UNIT)
    batches = run_scheduler(inst, "apt-greedy").schedule.batches
    assert [b.tokens for b in batches[:4]] == [{0: 1}, {2: 2}, {1: 8}, {0: 1, 2: 1}]
    assert list(run_scheduler(inst, "vllm").schedule.batches[1].tokens)[0] == 1  # FCFS takes A first


def test_apt_greedy_decode_iteration_preempts_the_lowest_ratio_idle_request():
    # three running requests I = 3, O = 4 fill M = 9 after one batch; the decode iteration fits two (4 + 4),
    # the third (equal ratios: the latest-arrived) is preempted, not left idle, since 4 + 4 + 3 > 9
    inst = Instance((Request(3, 4), Request(3, 4), Request(3, 4)), SystemConfig(9, 64), UNIT)
    result = run_scheduler(inst, "apt-greedy")
    assert result.schedule.batches[0].tokens == {0: 3, 1: 3, 2: 3}
    assert (result.schedule.batches[1].tokens, result.schedule.batches[1].evict) == ({0: 1, 1: 1}, (2,))


def test_vllm_v1_chunks_to_its_token_budget_and_caps_running_requests():
    inst = Instance((Request(10000, 2),), SystemConfig(20000, 16384), PRESETS["llama2-7b-a100"])
    assert run_scheduler(inst, "vllm-v1").schedule.batches[0].tokens == {0: 8192}
    assert run_scheduler(inst, "vllm-v1:max_num_batched_tokens=1000").schedule.batches[0].tokens == {0: 1000}
    three = Instance((Request(4, 3),) * 3, SystemConfig(64, 64), UNIT)
    result = run_scheduler(three, "vllm-v1:max_num_seqs=2")
    assert result.schedule.batches[0].tokens == {0: 4, 1: 4}
    assert max(len(b.tokens) for b in result.schedule.batches) == 2


def test_vllm_v1_preempts_the_latest_arrived_and_admits_nothing_in_that_step():
    # r0, r1 (I = 4, O = 4) prefill together into M = 9 (KV allocated per chunk: 4 + 4), r2 (I = 1) arrives at
    # 0.5 s. At 1 s both decodes need 10 > 9: r1, the latest-arrived running request, is preempted, and r2 waits
    # although its 1 token would fit; with admit_after_evict=true it is admitted in that step
    inst = Instance((Request(4, 4), Request(4, 4), Request(1, 1, 0.5)), SystemConfig(9, 64), UNIT)
    b = run_scheduler(inst, "vllm-v1").schedule.batches
    assert b[0].tokens == {0: 4, 1: 4}
    assert (b[1].tokens, b[1].evict) == ({0: 1}, (1,))
    b = run_scheduler(inst, "vllm-v1:admit_after_evict=true").schedule.batches
    assert (b[1].tokens, b[1].evict) == ({0: 1, 2: 1}, (1,))


def test_max_running_caps_every_unified_preset():
    inst = Instance((Request(4, 3),) * 3, SystemConfig(64, 64), UNIT)
    for spec in ("sarathi:max_running=1", "vllm:max_running=1", "larry:max_running=1", "fcfs:max_running=1"):
        result = run_scheduler(inst, spec)
        validate(inst, result.schedule)
        assert max(len(b.tokens) for b in result.schedule.batches) == 1, spec
        assert result.replay.metrics.evictions == 0


# ------------------------------------------------------------------ srpt

def _srpt_case():
    # A (I = 1, O = 2) at 0; B (I = 8, O = 1) arrives at 0.5 while A runs its first batch.
    # 1 s intercept, 0.5 s a token, C = P = 8
    return Instance((Request(1, 2), Request(8, 1, 0.5)), SystemConfig(64, 8, 8, 1), CostModel(intercept=1.0, per_token=0.5))


def test_srpt_keeps_a_long_prefill_out_of_a_short_requests_last_decode():
    # B's prefill (4 s of work) would slow A's last decode (1.5 s alone) by 4 s to save B 1.5 s of
    # waiting: srpt runs A's decode alone (A done at 3 s, B at 8 s: mean 5.25, the optimum); the
    # budget-filling presets mix B's chunk in (A done at 6.5 s: mean 7)
    inst = _srpt_case()
    res = run_scheduler(inst, "srpt")
    assert [b.tokens for b in res.schedule.batches] == [{0: 1}, {0: 1}, {1: 8}]
    assert res.replay.metrics.mean_latency == pytest.approx(5.25)
    assert brute_force(inst, "mean_latency").value == pytest.approx(5.25)
    for name in ("rank-i", "sjf-mc", "sarathi-pc"):
        assert run_scheduler(inst, name).replay.metrics.mean_latency == pytest.approx(7.0), name
    # a large enough ratio lets the chunk ride along as rank-i does
    assert run_scheduler(inst, "srpt:ratio=10").replay.metrics.mean_latency == pytest.approx(7.0)


def test_srpt_option_is_checked():
    with pytest.raises(InputError, match="ratio"):
        get_scheduler("srpt:ratio=-1")
    with pytest.raises(InputError, match="ratio"):
        get_scheduler("srpt:rate=1")


def test_ordered_srpt_takes_the_patterns_holds_and_keeps_its_own_order():
    from kvbound.schedulers.srpt import Srpt
    from kvbound.schedulers.unified import OrderedScheduler

    # C = 2: one prompt a batch. The keys put request 0 (8 tokens to generate) first; srpt the
    # shortest, request 2 (request 1 is as short but held until batch 4)
    inst = Instance((Request(2, 8), Request(2, 3), Request(2, 3)), SystemConfig(64, 2, 2, 1), CostModel(intercept=1.0))
    base = get_scheduler("srpt:ratio=2")
    ordered = OrderedScheduler(base, [0, 1, 2], [0, 4, 0])
    assert isinstance(ordered, Srpt) and ordered.ratio == 2 and not ordered.ranks_by_keys
    res = simulate(inst, ordered)
    validate(inst, res.schedule)
    first = {}
    for j, b in enumerate(res.schedule.batches):
        for i in b.tokens:
            first.setdefault(i, j)
    assert first[1] == 4  # held until batch 4
    assert first[2] == 0 and first[0] == 1
