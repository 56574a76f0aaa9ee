"""Packed schedules (kvbound.schedulers.packing): profiles from the semantics, the greedy's jumps, CP-SAT's
starts, and the search keeping a packed schedule only through the validator."""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbound.deadline import Deadline
from kvbound.constraints import Constraints
from kvbound.objective import Objective
from kvbound.schedule import Batch, Schedule, validate
from kvbound.schedulers import run_scheduler
from kvbound.solvers import solve
from kvbound.schedulers.packing import (DECODE_ROOM, FITS, SEGMENT, STALLED_MOVES, TIMED_STALLED_MOVES, Profile,
                                     batchwise_starts, chunk_size, decode_room, from_the_end, greedy_starts,
                                     justified_order, pack, packed_schedule, profiles, search_orders, timed_starts)
from kvbound.costs.presets import PRESETS
from kvbound.io.traces import load_trace
from kvbound.workload import Instance, Request, SystemConfig

from .test_formulation import instances


def prefill_tokens(profile: Profile) -> np.ndarray:
    first = np.arange(profile.batches) < profile.prefill_batches
    return np.where(first[::-1] if profile.backward else first, profile.tokens, 0)


def fits_at(profile: Profile, system: SystemConfig, t: int, kv, tokens, prefill) -> bool:
    pre = prefill_tokens(profile)
    window = slice(t, t + profile.batches)
    return bool((kv[window] + profile.kv <= system.kv_capacity).all()
                and (tokens[window] + profile.tokens <= system.max_batch_tokens).all()
                and (prefill[window] + pre <= system.max_prefill_tokens).all())


def place_at(profile: Profile, t: int, kv, tokens, prefill) -> None:
    kv[t:t + profile.batches] += profile.kv
    tokens[t:t + profile.batches] += profile.tokens
    prefill[t:t + profile.batches] += prefill_tokens(profile)


def earliest_fit(profiles: list[Profile], system: SystemConfig, order) -> np.ndarray:
    """The greedy's definition, without its jumps: for each request in order, the first start
    (scanning one batch at a time) where every batch keeps within M, C and P."""
    horizon = sum(p.batches for p in profiles)
    kv, tokens, prefill = (np.zeros(horizon, dtype=np.int64) for _ in range(3))
    starts = np.zeros(len(profiles), dtype=np.int64)
    for r in order:
        p = profiles[r]
        t = 0
        while not fits_at(p, system, t, kv, tokens, prefill):
            t += 1
        place_at(p, t, kv, tokens, prefill)
        starts[r] = t
    return starts


@settings(max_examples=150, deadline=None)
@given(instances(min_requests=1, max_requests=5, max_prompt=40, max_output=40, block_sizes=(1, 4, 16),
                 arrivals=False), st.randoms(use_true_random=False))
def test_greedy_jumps_find_the_earliest_fit_and_its_schedule_is_valid(inst, rng):
    profs = profiles(inst)
    for r, p in zip(inst.requests, profs):
        alone = Instance([r], inst.system, inst.cost)
        held = validate(alone, Schedule(alone.requests, [Batch({0: int(c)}) for c in p.tokens])).batch_kv
        assert int(p.tokens.sum()) == r.prompt + r.output - 1
        assert (p.kv >= held).all() and (np.diff(p.kv) >= 0).all()  # charged at least what it holds, nondecreasing
        assert (p.work >= 0).all()  # never below 0 by rounding (the timed fit's clock only moves on)
        assert (p.tokens[:p.prefill_batches] <= chunk_size(inst)).all()
        # within a decode segment the charge exceeds what is held by at most the segment's growth
        assert (p.kv - held <= inst.system.blocks(SEGMENT) + inst.system.block_size).all()
    order = list(range(len(inst)))
    rng.shuffle(order)
    starts = greedy_starts(profs, inst.system, order)
    assert (starts == earliest_fit(profs, inst.system, order)).all()
    schedule = packed_schedule(inst, profs, starts)
    replay = validate(inst, schedule)  # raises on any broken rule
    assert replay.evictions.sum() == 0
    assert len(schedule.batches) <= int((starts + [p.batches for p in profs]).max())


def batch_by_batch_on_a_clock(profiles: list[Profile], system: SystemConfig, order, arrivals=None,
                             intercept: float = 0.0) -> tuple[np.ndarray, float]:
    """The batch-by-batch fits' definition, without their first checks: at each batch in turn, every
    request not yet started that fits from there, in order; with `arrivals`, on a clock that adds
    each batch's time (the intercept and its requests' work alone) once the batch is passed,
    starting only the requests that have arrived by then, and waiting for the next arrival where
    nothing runs. Answers the starts and the clock at the end."""
    timed = arrivals is not None
    arrivals = np.zeros(len(profiles)) if arrivals is None else arrivals
    horizon = 2 * sum(p.batches for p in profiles)
    kv, tokens, prefill = (np.zeros(horizon, dtype=np.int64) for _ in range(3))
    work = np.zeros(horizon)
    starts: dict[int, int] = {}
    t, clock = 0, 0.0
    while len(starts) < len(profiles):
        if not tokens[t]:
            clock = max(clock, min(arrivals[r] for r in order if r not in starts))
        for r in order:
            p = profiles[r]
            if r not in starts and (not timed or arrivals[r] <= clock) and fits_at(p, system, t, kv, tokens, prefill):
                place_at(p, t, kv, tokens, prefill)
                work[t:t + p.batches] += p.work
                starts[r] = t
        if tokens[t]:
            clock += intercept + work[t]
        t += 1
    clock += intercept * np.count_nonzero(tokens[t:]) + work[t:].sum()
    return np.array([starts[r] for r in range(len(profiles))]), clock


def batch_by_batch(profiles: list[Profile], system: SystemConfig, order) -> np.ndarray:
    """`batch_by_batch_on_a_clock`'s starts with every request there from the start."""
    return batch_by_batch_on_a_clock(profiles, system, order)[0]


@settings(max_examples=150, deadline=None)
@given(instances(min_requests=1, max_requests=6, max_prompt=40, max_output=40, block_sizes=(1, 4, 16),
                 arrivals=False), st.randoms(use_true_random=False))
def test_batch_by_batch_fit_starts_what_fits_at_each_batch_and_its_schedule_is_valid(inst, rng):
    profs = profiles(inst)
    order = list(range(len(inst)))
    rng.shuffle(order)
    starts = batchwise_starts(profs, inst.system, order)
    assert (starts == batch_by_batch(profs, inst.system, order)).all()
    replay = validate(inst, packed_schedule(inst, profs, starts))  # raises on any broken rule
    assert replay.evictions.sum() == 0


@settings(max_examples=150, deadline=None)
@given(instances(min_requests=1, max_requests=6, max_prompt=40, max_output=40, block_sizes=(1, 4, 16),
                 arrivals=True), st.randoms(use_true_random=False))
def test_the_timed_fit_starts_what_has_arrived_and_fits_and_its_clock_is_the_schedules_end(inst, rng):
    profs = profiles(inst)
    order = list(range(len(inst)))
    rng.shuffle(order)
    starts, clock = timed_starts(profs, inst.arrivals, inst.system, inst.cost.intercept, order)
    expected, expected_clock = batch_by_batch_on_a_clock(profs, inst.system, order, inst.arrivals, inst.cost.intercept)
    assert (starts == expected).all()
    assert clock == pytest.approx(expected_clock, rel=1e-12)
    replay = validate(inst, packed_schedule(inst, profs, starts))  # raises on a request run before its arrival
    assert replay.evictions.sum() == 0
    # the clock adds each request's work alone: the schedule's end, or less where token knees add more
    if inst.cost.token_knees:
        assert replay.metrics.total_latency >= clock * (1 - 1e-9)
    else:
        assert replay.metrics.total_latency == pytest.approx(clock, rel=1e-9)
    # with every request there at 0 it is the batch-by-batch fit
    at_zero = Instance([Request(r.prompt, r.output) for r in inst.requests], inst.system, inst.cost)
    untimed, _ = timed_starts(profs, at_zero.arrivals, inst.system, inst.cost.intercept, order)
    assert (untimed == batchwise_starts(profs, inst.system, order)).all()


@settings(max_examples=150, deadline=None)
@given(instances(min_requests=1, max_requests=6, max_prompt=40, max_output=40, block_sizes=(1, 4, 16),
                 arrivals=False), st.randoms(use_true_random=False))
def test_the_fits_from_the_end_are_the_forward_definitions_run_backwards_in_time(inst, rng):
    profs = profiles(inst)
    backward = [p.reversed() for p in profs]
    assert all((b.reversed().kv == p.kv).all() and not b.reversed().backward for b, p in zip(backward, profs))
    lengths = np.array([p.batches for p in profs])
    order = list(range(len(inst)))
    rng.shuffle(order)
    for fit, reference in ((greedy_starts, earliest_fit), (batchwise_starts, batch_by_batch)):
        starts = from_the_end(fit)(profs, inst.system, order)
        ends = reference(backward, inst.system, order) + lengths  # batches counted from the last one
        assert (starts == ends.max() - ends).all()
        assert starts.min() == 0
        replay = validate(inst, packed_schedule(inst, profs, starts))  # raises on any broken rule
        assert replay.evictions.sum() == 0


@settings(max_examples=40, deadline=None)
@given(instances(min_requests=2, max_requests=6, max_prompt=40, max_output=40, block_sizes=(1, 4, 16),
                 arrivals=False), st.integers(0, 2**32 - 1))
def test_the_search_over_orders_answers_an_order_whose_fit_has_its_span_and_no_longer_than_its_seeds(inst, seed):
    profs = profiles(inst)
    lengths = np.array([p.batches for p in profs])
    order = np.arange(len(inst))
    seeds = {fit: (order, fit_of(profs, inst.system, order)) for fit, fit_of in FITS.items()}
    found, starts, span, fit, moves = search_orders(profs, inst.system, seeds, Deadline(0.05),
                                                    np.random.default_rng(seed))
    assert moves >= 1
    assert span <= min(int((s + lengths).max()) for _, s in seeds.values())
    assert (FITS[fit](profs, inst.system, found) == starts).all()  # the order's fit gives these starts
    assert int((starts + lengths).max()) == span
    validate(inst, packed_schedule(inst, profs, starts))


def tight_instance(n: int = 10) -> Instance:
    """Requests of the arXiv trace with M twice the largest peak KV: few run together."""
    from .conftest import SHARED_DATA, shared_data  # noqa: F401 (skips without the data)

    trace = SHARED_DATA / "traces" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
    requests = [Request(r.prompt, r.output, 0.0) for r in load_trace(trace, limit=n)]
    m = 2 * max(-(-r.peak_kv // 16) * 16 for r in requests)
    return Instance(requests, SystemConfig(m, 2048, 2048, 16), PRESETS["llama2-7b-h100"])


def loose_conversation(n: int, trace: str = "splitwise_conv") -> Instance:
    """The first n requests of the Splitwise conversation trace (or `trace`), all at 0, with M = 100,000
    tokens, as the real suite's loose cases: about a hundred conversation requests decode together."""
    from .conftest import SHARED_DATA, shared_data  # noqa: F401 (skips without the data)

    requests = [Request(r.prompt, r.output, 0.0) for r in load_trace(SHARED_DATA / "traces" / f"{trace}.csv",
                                                                     limit=n)]
    return Instance(requests, SystemConfig(100_000, 2048, 2048, 16), PRESETS["llama2-7b-h100"])


def heuristic_best(inst: Instance) -> float:
    return min(run_scheduler(inst, name).replay.metrics.total_latency for name in ("rank-i", "sjf-mc", "sarathi"))


def test_the_fits_from_the_end_match_their_definitions_where_work_rounds_to_zero():
    """A case hypothesis found: the reversed profiles' prefill work rounds to -7e-15 in a batch,
    which once moved the reference's clock below 0 and held back a request there."""
    from itertools import permutations

    from kvbound.costs.model import CostModel

    inst = Instance([Request(1, 1), Request(21, 33), Request(30, 12), Request(1, 1)], SystemConfig(100, 32, 31, 4),
                    CostModel(intercept=0.5, prefill_attention=0.07))
    backward = [p.reversed() for p in profiles(inst)]
    for order in permutations(range(len(inst))):
        assert (batchwise_starts(backward, inst.system, order) == batch_by_batch(backward, inst.system, order)).all()


def test_the_greedy_beats_the_heuristics_when_m_is_tight_and_cpsat_only_improves_it(shared_data):
    inst = tight_instance(20)
    greedy = pack(inst, Deadline(0.5))  # under a second left: the greedy fits alone, no search, no CP-SAT
    assert "cpsat_batches" not in greedy.stats and "order_search_batches" not in greedy.stats
    greedy_value = validate(inst, greedy.schedule).metrics.total_latency
    assert greedy_value < heuristic_best(inst)  # measured: 10.870 s against rank-i's 10.963 s
    found = pack(inst, Deadline(10.0))  # CP-SAT gets the last quarter after the search over orders
    replay = validate(inst, found.schedule)
    assert found.stats["greedy_batches"] == greedy.batches
    assert len(replay.batch_end) <= found.batches <= found.stats["order_search_batches"] <= greedy.batches
    assert found.stats["cpsat_batches"] is not None
    # CP-SAT's bound on its own (no-pause, no-eviction) model is below what it found
    assert found.stats["cpsat_bound"] <= found.stats["cpsat_batches"]
    assert replay.metrics.total_latency <= greedy_value * (1 + 1e-12)


def test_packing_stops_at_a_lower_bound_on_the_batches(shared_data):
    inst = tight_instance(20)
    greedy = pack(inst, Deadline(0.5))
    began = time.perf_counter()
    found = pack(inst, Deadline(30.0), fewest=greedy.batches)  # as if a bound proved the greedy's span
    assert time.perf_counter() - began < 10.0  # neither the search nor CP-SAT ran
    assert found.batches == greedy.batches
    assert "order_search_batches" not in found.stats and "cpsat_batches" not in found.stats
    profs = profiles(inst)
    lengths = np.array([p.batches for p in profs])
    order = np.arange(len(inst))
    seeds = {fit: (order, fit_of(profs, inst.system, order)) for fit, fit_of in FITS.items()}
    _, _, span, _, moves = search_orders(profs, inst.system, seeds, Deadline(30.0), np.random.default_rng(0),
                                         fewest=10**9)
    assert moves == 0 and span == min(int((s + lengths).max()) for _, s in seeds.values())


def test_the_search_over_orders_hands_its_time_on_once_it_stalls():
    inst = Instance([Request(40, 8), Request(30, 12), Request(20, 4)], SystemConfig(64, 64, 64, 4),
                    PRESETS["llama2-7b-h100"])
    profs = profiles(inst)
    order = np.arange(len(inst))
    seeds = {fit: (order, fit_of(profs, inst.system, order)) for fit, fit_of in FITS.items()}
    deadline = Deadline(60.0)
    *_, moves = search_orders(profs, inst.system, seeds, deadline, np.random.default_rng(0))
    assert STALLED_MOVES <= moves < STALLED_MOVES + 100  # at most a few gains before it stalls
    assert deadline.remaining() > 30.0


def test_the_timed_search_hands_its_time_on_once_it_stalls():
    inst = Instance([Request(40, 8), Request(30, 12, 0.01), Request(20, 4, 0.02)], SystemConfig(64, 64, 64, 4),
                    PRESETS["llama2-7b-h100"])
    deadline = Deadline(60.0)
    found = pack(inst, deadline)
    assert TIMED_STALLED_MOVES <= found.stats["order_search_moves"] < TIMED_STALLED_MOVES + 30
    assert deadline.remaining() > 30.0
    validate(inst, found.schedule)


def test_the_fits_give_up_once_the_deadline_has_passed():
    inst = Instance([Request(40, 8), Request(30, 12), Request(20, 4)], SystemConfig(64, 64, 64, 4),
                    PRESETS["llama2-7b-h100"])
    profs = profiles(inst)
    for fit in FITS.values():
        assert fit(profs, inst.system, [0, 1, 2], Deadline(0.0)) is None
        assert (fit(profs, inst.system, [0, 1, 2], Deadline(60.0)) == fit(profs, inst.system, [0, 1, 2])).all()
    assert timed_starts(profs, inst.arrivals, inst.system, inst.cost.intercept, [0, 1, 2], Deadline(0.0)) is None
    assert pack(inst, Deadline(0.0)).schedule is None
    arriving = Instance([Request(40, 8), Request(30, 12, 1.0), Request(20, 4, 2.0)], inst.system, inst.cost)
    assert pack(arriving, Deadline(0.0)).schedule is None


def test_packing_answers_soon_after_an_interrupt(shared_data):
    import threading

    from kvbound import interrupt

    inst = tight_instance(300)  # a fit takes ~0.3-1 s here
    timer = threading.Timer(2.0, interrupt.request)
    timer.start()
    began = time.perf_counter()
    try:
        found = pack(inst, Deadline(120.0))
    finally:
        timer.cancel()
        interrupt.reset()
    assert time.perf_counter() - began < 2.0 + 2.0
    if found.schedule is not None:
        validate(inst, found.schedule)


def test_the_batch_by_batch_fit_packs_300_tight_arxiv_requests_in_fewer_batches(shared_data):
    inst = tight_instance(300)  # M = 8,192: two or three requests fit at once
    profs = profiles(inst)
    lengths = np.array([p.batches for p in profs])
    order = np.argsort(-np.array([p.kv[-1] for p in profs]), kind="stable")
    batchwise = int((batchwise_starts(profs, inst.system, order) + lengths).max())
    earliest = int((greedy_starts(profs, inst.system, order) + lengths).max())
    assert batchwise < 0.98 * earliest  # measured: 25,987 against 26,875 batches


def test_repacking_from_the_end_in_the_order_of_the_ends_shortens_100_tight_arxiv_requests(shared_data):
    inst = tight_instance(100)
    profs = profiles(inst)
    lengths = np.array([p.batches for p in profs])
    order = np.argsort(-np.array([p.kv[-1] for p in profs]), kind="stable")
    forward = batchwise_starts(profs, inst.system, order)
    backward = FITS["latest fit"](profs, inst.system, justified_order(forward, lengths, "latest fit"))
    # measured: 8,974 -> 8,894 batches (the forward fit's last batches are half empty)
    assert int((backward + lengths).max()) < 0.995 * int((forward + lengths).max())
    again = FITS["earliest fit"](profs, inst.system, justified_order(backward, lengths, "earliest fit"))
    assert int((again + lengths).max()) <= int((backward + lengths).max())  # measured: 8,894


def test_search_keeps_a_packed_schedule_only_through_the_validator(shared_data):
    inst = tight_instance(20)
    result = solve(inst, "total_latency", formulation="lagrangian", time_limit=12)
    assert result.schedule is not None
    checked = validate(inst, result.schedule).metrics.total_latency
    assert checked == pytest.approx(result.objective, rel=1e-12)
    assert result.lower_bound <= result.objective
    # the packed schedule, or a pattern seeded by its admission order, at least as good as the greedy's
    greedy = validate(inst, pack(inst, Deadline(0.5)).schedule).metrics.total_latency
    assert result.source == "packed" or result.source.startswith("pattern:")
    assert result.objective <= greedy * (1 + 1e-12)
    assert result.backend_stats["packing"]["greedy_batches"] is not None


@pytest.mark.parametrize("constraints", [Constraints(), Constraints(no_hybrid=True), Constraints(no_chunk=True)])
def test_search_packs_only_where_packed_schedules_can_meet_the_constraints(constraints):
    from .test_lagrangian import conv_like

    inst = conv_like()
    found = solve(inst, Objective.TOTAL_LATENCY, time_limit=3.0, warm_start=["sjf-mc"], formulation="search",
                  constraints=constraints)
    assert ("packing" in found.stats) == (constraints == Constraints())
    assert constraints.admit(inst, found.schedule)
    validate(inst, found.schedule)


def test_search_packs_with_arrivals_and_keeps_a_packed_schedule_only_through_the_validator():
    from .test_lagrangian import conv_like

    offline = conv_like()
    inst = Instance([Request(r.prompt, r.output, 0.02 * k) for k, r in enumerate(offline.requests)],
                    offline.system, offline.cost)
    start = run_scheduler(inst, "sjf-mc")
    found = solve(inst, Objective.TOTAL_LATENCY, time_limit=3.0, warm_start=["sjf-mc"], formulation="search")
    stats = found.stats["packing"]
    assert stats["greedy_fit"] == "timed batch by batch" and stats["order_search_moves"] > 0
    assert stats["order_search_makespan"] <= stats["greedy_makespan"]
    profs = profiles(inst)
    arrival_order, _ = timed_starts(profs, inst.arrivals, inst.system, inst.cost.intercept, range(len(inst)))
    packed = validate(inst, packed_schedule(inst, profs, arrival_order)).metrics.total_latency
    assert found.objective <= min(packed, start.replay.metrics.total_latency) * (1 + 1e-12)
    assert validate(inst, found.schedule).metrics.total_latency == pytest.approx(found.objective, rel=1e-12)


def test_prefill_chunks_leave_room_for_as_many_decodes_as_m_holds(shared_data):
    tight = tight_instance(30)  # two or three requests at once: the smallest room
    assert decode_room(tight) == DECODE_ROOM and chunk_size(tight) == 2048 - DECODE_ROOM
    inst = loose_conversation(300)
    room = decode_room(inst)
    assert 64 <= room <= 128 and chunk_size(inst) == 2048 - room  # about a hundred decode together
    order = np.argsort(-np.array([r.output for r in inst.requests]), kind="stable")  # longest first

    def span(profs):
        return int((greedy_starts(profs, inst.system, order) + np.array([p.batches for p in profs])).max())

    wide = profiles(inst)
    for p in wide:
        assert (p.tokens[:p.prefill_batches] <= 2048 - room).all()
    # measured: 973 against 1,036 batches (a chunk leaving 16 tokens joins a batch only while at
    # most 16 requests decode)
    assert span(wide) < 0.97 * span(profiles(inst, chunk=2048 - DECODE_ROOM))
    starts = greedy_starts(wide, inst.system, order)
    validate(inst, packed_schedule(inst, wide, starts))
