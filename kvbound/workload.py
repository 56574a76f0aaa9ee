"""Requests, system limits and instances; the limits a case may ask for and `check_instance`.

The domain types only: reading them from files (TOML case files, CSV traces) is `kvbound.io`.
Every problem with an instance is raised as `InputError(file, field, problem)`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from .accounting import round_to_blocks
from .costs import CostModel
from .errors import InputError


@dataclass(frozen=True)
class Request:
    prompt: int  # I >= 1
    output: int  # O >= 1, tokens to generate including the final one
    arrival: float = 0.0  # seconds

    @property
    def peak_kv(self) -> int:
        """Largest KV a request ever holds: the final token is generated, never cached."""
        return self.prompt + self.output - 1


@dataclass(frozen=True)
class SystemConfig:
    kv_capacity: int  # M, tokens
    max_batch_tokens: int  # C
    max_prefill_tokens: int | None = None  # P <= C (`check_instance`), default C
    block_size: int = 1  # b

    def __post_init__(self):
        if self.max_prefill_tokens is None:
            object.__setattr__(self, "max_prefill_tokens", self.max_batch_tokens)

    def blocks(self, tokens: int) -> int:
        """KV tokens charged for `tokens` cached tokens: rounded up to whole blocks."""
        return round_to_blocks(tokens, self.block_size)


@dataclass(frozen=True)
class Instance:
    requests: tuple[Request, ...]
    system: SystemConfig
    cost: CostModel
    name: str = ""
    description: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "requests", tuple(self.requests))
        check_instance(self, self.source)

    def __len__(self) -> int:
        return len(self.requests)

    @cached_property
    def prompts(self) -> np.ndarray:
        return np.array([r.prompt for r in self.requests], dtype=np.int64)

    @cached_property
    def outputs(self) -> np.ndarray:
        return np.array([r.output for r in self.requests], dtype=np.int64)

    @cached_property
    def arrivals(self) -> np.ndarray:
        return np.array([r.arrival for r in self.requests], dtype=float)

    @cached_property
    def tokens_held(self) -> int:
        """The most tokens the requests together can process in one batch or hold in KV: sum of I + O - 1."""
        return int(sum(r.peak_kv for r in self.requests))

    @property
    def offline(self) -> bool:
        return bool((self.arrivals == 0).all())

    def from_zero(self) -> "Instance":
        """The same requests with every arrival less the first one (no latency changes)."""
        first = float(self.arrivals.min()) if self.requests else 0.0
        return replace(self, requests=tuple(replace(r, arrival=r.arrival - first) for r in self.requests))

    def with_system(self, **changes) -> "Instance":
        s = self.system
        values = dict(kv_capacity=s.kv_capacity, max_batch_tokens=s.max_batch_tokens,
                      max_prefill_tokens=s.max_prefill_tokens, block_size=s.block_size)
        values.update(changes)
        return Instance(self.requests, SystemConfig(**values), self.cost, self.name, self.description, self.source)


# --------------------------------------------------------------------------- validation

#: limits on what a case may ask for, checked when it is read (before any memory is spent on it):
#: every integer below 2^53 (exact in the float models HiGHS and CBC solve)
MAX_INT = 2 ** 53 - 1
#: at most this many requests (a `count` beyond it is refused before the list is made)
MAX_REQUESTS = 1_000_000
#: a request's prompt + output, tokens (the simulator and the models grow with them)
MAX_REQUEST_TOKENS = 2 ** 24
#: all requests' prompt + output together, tokens (shipped cases: at most 26.5 million)
MAX_TOTAL_TOKENS = 2 ** 28
#: arrivals are finite and at most this many seconds (about 31.7 years)
MAX_ARRIVAL = 1e9


def is_int(value) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_int(source: str, name: str, value, most: int = MAX_INT) -> int:
    """`value` if it is an integer in [1, most]; else InputError(source, name, ...)."""
    if not is_int(value):
        raise InputError(source, name, f"must be an integer, got {value!r}")
    if value < 1:
        raise InputError(source, name, f"must be >= 1, got {value}")
    if value > most:
        raise InputError(source, name, f"must be <= {most:,}, got {value:,}" + (" (integers must stay below 2^53)"
                                                                               if most == MAX_INT else ""))
    return value


def nonneg_number(source: str, name: str, value, most: float = math.inf) -> float:
    """`value` as a float if it is a finite number in [0, most]; else InputError(source, name, ...)."""
    if not _is_number(value):
        raise InputError(source, name, f"must be a number, got {value!r}")
    if is_int(value) and abs(value) > MAX_INT:
        raise InputError(source, name, f"must be <= {most:g}, got {value:.3g}")
    if not math.isfinite(value):
        raise InputError(source, name, f"must be finite, got {value}")
    if value < 0:
        raise InputError(source, name, f"must be >= 0, got {value}")
    if value > most:
        raise InputError(source, name, f"must be <= {most:g}, got {value:g}")
    return float(value)


def check_instance(inst: Instance, source: str = "") -> None:
    """Raise InputError unless the instance can be served by some schedule under the semantics."""
    s = inst.system
    for name in ("kv_capacity", "max_batch_tokens", "max_prefill_tokens", "block_size"):
        positive_int(source, f"system.{name}", getattr(s, name))
    if s.max_prefill_tokens > s.max_batch_tokens:
        raise InputError(source, "system.max_prefill_tokens",
                         f"P = {s.max_prefill_tokens} exceeds max_batch_tokens C = {s.max_batch_tokens}")
    if not inst.requests:
        raise InputError(source, "requests", "the request list is empty")
    if len(inst.requests) > MAX_REQUESTS:
        raise InputError(source, "requests", f"{len(inst.requests):,} requests; at most {MAX_REQUESTS:,}")
    total = 0
    for i, r in enumerate(inst.requests):
        positive_int(source, f"request {i}: prompt", r.prompt, MAX_REQUEST_TOKENS)
        positive_int(source, f"request {i}: output", r.output, MAX_REQUEST_TOKENS)
        nonneg_number(source, f"request {i}: arrival", r.arrival, MAX_ARRIVAL)
        if r.prompt + r.output > MAX_REQUEST_TOKENS:
            raise InputError(source, f"request {i}", f"prompt + output = {r.prompt + r.output:,} tokens; "
                             f"at most {MAX_REQUEST_TOKENS:,}")
        total += r.prompt + r.output
        peak = s.blocks(r.peak_kv)
        if peak > s.kv_capacity:
            raise InputError(source, f"request {i}",
                             f"peak KV {peak} tokens (prompt {r.prompt} + output {r.output} - 1"
                             f"{', in blocks of %d' % s.block_size if s.block_size > 1 else ''})"
                             f" exceeds kv_capacity {s.kv_capacity}")
    if total > MAX_TOTAL_TOKENS:
        raise InputError(source, "requests", f"{total:,} tokens of prompt and output in all; at most {MAX_TOTAL_TOKENS:,}")
