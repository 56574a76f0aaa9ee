"""Every scheduler's schedules are the ones the simulator made before issue 35's speed-up, batch by batch.

tests/fixtures/schedule_hashes.json holds, per (case, scheduler spec), the sha256 of the canonical
schedule (`schedule_digest`: each batch's start, its tokens in the batch's own order and its
evictions) and of what the replay computed (`replay_digest`: the metrics and the per-request and
per-batch arrays), written by the simulator of commit 0206b6a (before issue 35, item 4; the error messages with the checkout's path cut) with

    python tests/test_simulator_identity.py --write

A refused or stuck scheduler is recorded by its exception's type and message. The full Splitwise
trace's digests for sarathi and vllm:chunked=true, and every scheduler's on 1,000 and 2,000
Splitwise requests, are checked only with KVBOUND_SLOW=1 (minutes).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from kvbound import load_case
from kvbound.errors import KvboundError
from kvbound.schedulers import REGISTRY, get_scheduler, simulate
from kvbound.schedulers.unified import OrderedScheduler

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).with_name("fixtures") / "schedule_hashes.json"

#: (label, case file, system changes): small and medium shipped cases, offline and online, tight and
#: loose memory, and one with KV blocks of 16 tokens
CASES = (
    ("example", "cases/example.toml", {}),
    ("three_tight", "cases/small/three_tight.toml", {}),
    ("evict_better", "cases/evict_better.toml", {}),
    ("fig15_I64", "cases/fig15/fig15_I64.toml", {}),
    ("siso_liso_32", "cases/mix46/siso_liso_32.toml", {}),
    ("sample200", "cases/sample200.toml", {}),
    ("sample200_b16", "cases/sample200.toml", {"block_size": 16}),
    ("sample200_m4k", "cases/sample200.toml", {"kv_capacity": 4096}),
)
#: the medium cases (1,000 and 2,000 Splitwise requests; minutes for every scheduler): with KVBOUND_SLOW=1
MEDIUM = (
    ("conv_1000", "cases/splitwise_conv_1000.toml", {}),
    ("conv_2000", "cases/kossmann/conv_2000.toml", {}),
)
#: schedulers with options the presets do not show
EXTRA_SPECS = ("vllm:chunked=true", "sarathi:prefill_limit=256", "vllm-v1:max_num_seqs=16", "fcfs:max_running=8",
               "srpt:ratio=2", "sjf-mc:prefill_limit=512", "trail:c=0.5", "larry:alpha=5")
#: OrderedScheduler over these bases, with seeded keys and holds
ORDERED_BASES = ("sarathi", "rank-i", "srpt", "vllm-v1")
SLOW = (("conv_full", "cases/splitwise_conv_full.toml", {}, ("sarathi", "vllm:chunked=true")),)


def specs() -> list[str]:
    return list(REGISTRY) + list(EXTRA_SPECS) + [f"ordered({b})" for b in ORDERED_BASES]


def schedule_digest(schedule) -> str:
    h = hashlib.sha256()
    for b in schedule.batches:
        h.update(json.dumps([b.start, list(b.tokens.items()), list(b.evict)]).encode())
        h.update(b"\n")
    return h.hexdigest()


def replay_digest(replay) -> str:
    h = hashlib.sha256(json.dumps(replay.metrics.to_dict(), sort_keys=True).encode())
    for a in (replay.arrivals, replay.completion, replay.first_token, replay.evictions, replay.batch_start,
              replay.batch_end, replay.batch_kv, replay.batch_features, replay.request_p99_tbt):
        h.update(np.ascontiguousarray(a).tobytes())
        h.update(str(a.dtype).encode())
    return h.hexdigest()


def instance_of(path: str, changes: dict):
    inst = load_case(ROOT / path)
    return inst.with_system(**changes) if changes else inst


def build(spec: str, n: int):
    if spec.startswith("ordered("):
        base = get_scheduler(spec[len("ordered("):-1])
        rng = np.random.default_rng(35)
        keys = rng.random(n)
        hold = np.where(rng.random(n) < 0.3, rng.integers(0, 40, n), 0)
        return OrderedScheduler(base, keys, hold)
    return get_scheduler(spec)


def fingerprint(inst, spec: str) -> dict:
    try:
        result = simulate(inst, build(spec, len(inst)))
    except KvboundError as exc:
        return {"error": f"{type(exc).__name__}: {exc}".replace(f"{ROOT}/", "")}  # the checkout's place aside
    return {"batches": len(result.schedule.batches), "schedule": schedule_digest(result.schedule),
            "replay": replay_digest(result.replay)}


def _expected() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("label,path,changes", CASES, ids=[c[0] for c in CASES])
def test_schedules_are_todays(label, path, changes):
    expected = _expected()[label]
    inst = instance_of(path, changes)
    wrong = []
    for spec in specs():
        got = fingerprint(inst, spec)
        if got != expected[spec]:
            wrong.append(f"{spec}: {got} != {expected[spec]}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.skipif(not os.environ.get("KVBOUND_SLOW"), reason="minutes: set KVBOUND_SLOW=1")
@pytest.mark.parametrize("label,path,changes", MEDIUM, ids=[c[0] for c in MEDIUM])
def test_medium_schedules_are_todays(label, path, changes):
    test_schedules_are_todays(label, path, changes)


@pytest.mark.skipif(not os.environ.get("KVBOUND_SLOW"), reason="the full trace: set KVBOUND_SLOW=1")
@pytest.mark.parametrize("label,path,changes,names", SLOW, ids=[c[0] for c in SLOW])
def test_full_trace_schedules_are_todays(label, path, changes, names):
    expected = _expected()[label]
    inst = instance_of(path, changes)
    for spec in names:
        assert fingerprint(inst, spec) == expected[spec], spec


def write() -> None:
    out = {}
    for label, path, changes in CASES + MEDIUM:
        inst = instance_of(path, changes)
        out[label] = {spec: fingerprint(inst, spec) for spec in specs()}
        print(label, flush=True)
    for label, path, changes, names in SLOW:
        inst = instance_of(path, changes)
        out[label] = {spec: fingerprint(inst, spec) for spec in names}
        print(label, flush=True)
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_simulator_identity.py --write")
    write()
