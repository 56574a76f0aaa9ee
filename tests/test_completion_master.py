"""The Lagrangian bound with the completion master (issue 14).

* It never exceeds the brute-force optimum, for mean latency and mean TTFT, with arrivals, block
  rounding and evictions allowed: at random multipliers on the KV and token limits, random prices
  per unfinished batch (eta, any sign) and work weights (rho <= nu), and after subgradient passes,
  whatever the horizon.
* At eta = a0, rho = nu the master adds nothing: the bound is the Lagrangian one without batch
  sharing, to rounding.
* With eta = rho = 0 the trajectories cost nothing and the master alone is a completion-order
  bound: at least the intercepts of the fewest unfinished requests and each k-th completion's
  least work.
* On a prefill-heavy case its subgradient passes raise it above the Lagrangian bound with batch
  sharing, and the search reports the better of the two.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbound.alone import least_work
from kvbound.bounds.completion_master import MasterBound
from kvbound.bounds.lagrangian import LagrangianBound
from kvbound.schedulers import get_scheduler, simulate
from kvbound.objective import Objective
from kvbound.solvers import solve
from kvbound.costs import PRESETS
from kvbound.workload import Instance, Request, SystemConfig
from tests.oracle import brute_force
from tests.test_formulation import instances
from tests.test_lagrangian import MEAN, conv_like

BOUND_OK = 1e-9


@settings(max_examples=80, deadline=None)
@given(inst=instances(min_requests=1, max_requests=3, max_prompt=4, max_output=4), objective=st.sampled_from(MEAN),
       seed=st.integers(0, 2 ** 16), horizon=st.integers(1, 12))
def test_master_bound_never_exceeds_the_brute_force_optimum(inst, objective, seed, horizon):
    opt = brute_force(inst, objective).value
    bound = MasterBound(inst, objective, horizon)
    H, a0 = bound.H, inst.cost.intercept
    rng = np.random.default_rng(seed)
    for _ in range(4):
        eta = rng.uniform(-1.0, 2.0, H) * a0 * rng.integers(0, 2)
        rho = np.minimum(bound.nu[:H], rng.uniform(-1.0, 1.2, H) * bound.nu[:H])
        lam = rng.exponential(a0 / max(1, inst.system.kv_capacity), H) * rng.integers(0, 2)
        mu = rng.exponential(a0 / max(1, inst.system.max_batch_tokens), H) * rng.integers(0, 2)
        pricing, count, work = bound.price(eta, rho, lam, mu)
        assert pricing.value <= opt * (1 + BOUND_OK) + 1e-12
        assert count.shape == (H,) and (np.diff(count) <= 0).all() and (work >= 0).all()
    passes, value = 0, -math.inf
    for value, pricing, _ in MasterBound(inst, objective, horizon).iterate(opt * 1.2):
        passes += 1
        if passes == 40:
            break
    assert value <= opt * (1 + BOUND_OK) + 1e-12


@settings(max_examples=30, deadline=None)
@given(inst=instances(min_requests=1, max_requests=4, max_prompt=6, max_output=4), objective=st.sampled_from(MEAN))
def test_master_adds_nothing_where_it_starts(inst, objective):
    horizon = 12
    bound = MasterBound(inst, objective, horizon)
    zeros = np.zeros(bound.H)
    pricing, _, _ = bound.price(np.full(bound.H, inst.cost.intercept), bound.nu[:bound.H].copy(), zeros, zeros)
    plain = LagrangianBound(inst, objective, horizon)
    plain.alpha = 1.0
    assert math.isclose(pricing.value, plain.price(zeros, zeros).value, rel_tol=1e-12, abs_tol=1e-12)


def test_master_alone_is_a_completion_order_bound():
    # all at 0: with eta = rho = 0 the trajectories cost nothing and the value is the master's, at
    # least the k-th completion's least work summed over k (each done request's work is done before
    # it); its count never drops below nu while batches remain
    inst = conv_like()
    bound = MasterBound(inst, Objective.MEAN_LATENCY, 60)
    zeros = np.zeros(bound.H)
    pricing, count, work = bound.price(zeros, zeros, zeros, zeros)
    works = np.sort([least_work(r, inst.cost) for r in inst.requests])
    assert pricing.value >= np.cumsum(works).sum() / len(inst) * (1 - 1e-12)
    running = count > 0  # batches before the master's last
    assert running[0] and (count[running] >= bound.nu[:bound.H][running]).all()


def code_like() -> Instance:
    """Prompts near the token budget C and few output tokens each (like the Splitwise code trace):
    what a request waits for is mostly the prefill work of others."""
    reqs = [(1800, 8), (1500, 20), (1900, 5), (1200, 12), (1700, 30), (1000, 6), (1600, 15), (1400, 10)]
    return Instance(tuple(Request(p, o, 0.0) for p, o in reqs), SystemConfig(100_000, 2048, 2048, 16),
                    PRESETS["llama2-7b-h100"])


def best_after(iterations, passes: int) -> float:
    best = -math.inf
    for _, (value, _, _) in zip(range(passes), iterations):
        best = value
    return best


def test_master_beats_batch_sharing_on_prefill_heavy_requests_and_the_search_reports_it():
    # (on these 8 requests, 300 passes each towards sjf-mc's value: 0.231 s with batch sharing,
    # 0.251 s with the master)
    inst = code_like()
    horizon = 80
    target = simulate(inst, get_scheduler("sjf-mc")).replay.metrics.mean_latency
    sharing = best_after(LagrangianBound(inst, Objective.MEAN_LATENCY, horizon).iterate(target), 300)
    master = best_after(MasterBound(inst, Objective.MEAN_LATENCY, horizon).iterate(target), 300)
    assert master > sharing * 1.05
    res = solve(inst, Objective.MEAN_LATENCY, time_limit=6.0, formulation="lagrangian")
    variants = res.stats["lagrangian_variants"]
    assert variants["completion master"]["passes"] >= 1
    assert res.lower_bound >= variants["completion master"]["bound"] * (1 - 1e-12)
    assert res.lower_bound <= res.objective * (1 + 1e-9)


def test_the_lower_bound_gets_its_share_of_the_time_once_the_first_has_warmed_up():
    # the race's turns (bounds.race.Turns), driven by simulated passes: batch sharing creeps up
    # without stalling, the master's passes take twice as long and its bound overtakes late
    from kvbound.bounds.race import FOLLOWER_SHARE, STALLED_PASSES, Member, Turns
    from kvbound.deadline import Deadline

    sharing, master = Member("batch sharing", None), Member("completion master", None)
    tracks, turns = [sharing, master], Turns(Deadline(None))
    overtakes = STALLED_PASSES + 1500

    def run(passes: int) -> dict:
        spent = {"batch sharing": 0.0, "completion master": 0.0}
        for _ in range(passes):
            track, shared = turns.next(tracks)
            assert shared == (sharing.passes > STALLED_PASSES)
            step = 0.1 if track is sharing else 0.2
            value = 1.0 + 1e-6 * track.passes if track is sharing else (2.0 if n_pass() >= overtakes else 0.5)
            track.history.append(max(track.value, value))
            track.seconds += step
            track.shared += step if shared else 0.0
            spent[track.name] += step
        return spent

    def n_pass() -> int:
        return sharing.passes + master.passes

    assert run(STALLED_PASSES + 1)["completion master"] == 0  # the first alone until it has warmed up
    spent = run(1000)
    assert spent["completion master"] / sum(spent.values()) == pytest.approx(FOLLOWER_SHARE, abs=0.02)
    run(overtakes - n_pass() + 10)
    assert master.value > sharing.value  # the master leads: batch sharing gets the follower's share at once
    spent = run(1000)
    assert spent["batch sharing"] / sum(spent.values()) == pytest.approx(FOLLOWER_SHARE, abs=0.02)
    # on a slow machine the time shares from half the time on, whatever the passes
    first, second = Member("batch sharing", None), Member("completion master", None)
    clock = [0.0]
    turns = Turns(Deadline(10.0, clock=lambda: clock[0]))
    assert turns.next([first, second]) == (first, False)
    clock[0] = 5.0
    assert turns.next([first, second])[1] and first.passes < STALLED_PASSES
