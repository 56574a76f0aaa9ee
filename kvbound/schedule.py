"""Schedules and the semantics that say what a schedule does (docs/semantics.md).

`ReplayState.apply` is the single implementation of one batch under the semantics:
the validator replays a whole schedule with it, the simulator builds schedules
through it, and the MILP and the executor are tested against it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from .accounting import FEATURES, account_batch, is_decode_type, round_to_blocks
from .errors import InputError, KvboundError
from .workload import Instance, Request

_TIME_EPS = 1e-9


class ScheduleError(KvboundError):
    """A schedule breaks a rule; `batch` and `request` locate it (None where not applicable)."""

    def __init__(self, batch: int | None, request: int | None, problem: str, *, stage: str | None = None):
        self.batch, self.request, self.problem = batch, request, problem
        where = []
        if batch is not None:
            where.append(f"batch {batch}")
        else:
            where.append(stage or "after the last batch")
        if request is not None:
            where.append(f"request {request}")
        super().__init__(", ".join(where) + ": " + problem)


@dataclass
class Batch:
    """One batch: tokens processed per request id (c >= 1) and the ids evicted before it runs."""

    tokens: dict[int, int]
    evict: tuple[int, ...] = ()
    start: float | None = None  # the earliest time the scheduler lets it start; None: right after the previous

    def to_json(self) -> dict:
        out = self.json_form()
        out["tokens"] = {str(i): c for i, c in self.tokens.items()}
        return out

    def json_form(self) -> dict:
        """`to_json()` for `json.dumps` only: the tokens dict itself, whose int keys json writes as the
        strings `to_json` makes (the same text without a copy of every batch)."""
        out: dict = {}
        if self.start is not None:
            out["start"] = self.start
        out["tokens"] = self.tokens
        out["evict"] = list(self.evict)
        return out


@dataclass
class Schedule:
    """The requests and the batches that serve them; `to_json` is the file form (read back by `kvbound.io.schedules`)."""

    requests: tuple[Request, ...]
    batches: list[Batch] = field(default_factory=list)

    def to_json(self) -> dict:
        return self._form(Batch.to_json)

    def json_form(self) -> dict:
        """What `json.dumps` writes as `to_json()`'s text, without copying each batch (`Batch.json_form`):
        on the full Splitwise trace's 63,248 batches 1.2 s instead of 2.1 s, and no second copy in memory."""
        return self._form(Batch.json_form)

    def json_text(self) -> str:
        """`json.dumps(self.json_form())`: the same text (for int ids and counts, what schedules hold),
        written a batch at a time with the entries c = 1 (every decode) from one cached text per
        request id. json's encoder takes ~0.2 us an entry (0.88 s for the 4.1 million entries of the
        full Splitwise trace's sarathi schedule, this 0.47 s); a batch with an id the cache lacks or a start that is
        not a finite float goes through `json.dumps` itself."""
        unit = {i: f'"{i}": 1' for i in range(len(self.requests))}
        texts = []
        for b in self.batches:
            tokens, start = b.tokens, b.start
            if start is not None and not (type(start) is float and math.isfinite(start)):
                texts.append(json.dumps(b.json_form()))
                continue
            try:
                if not tokens or max(tokens.values()) == 1 == min(tokens.values()):
                    body = ", ".join(map(unit.__getitem__, tokens))
                else:
                    body = ", ".join([unit[i] if c == 1 else f'"{i}": {c}' for i, c in tokens.items()])
            except KeyError:
                texts.append(json.dumps(b.json_form()))
                continue
            head = "" if start is None else f'"start": {start!r}, '
            texts.append(f'{{{head}"tokens": {{{body}}}, "evict": [{", ".join(map(str, b.evict))}]}}')
        return f'{{"requests": {json.dumps(self._requests_form())}, "batches": [{", ".join(texts)}]}}'

    def _requests_form(self) -> list[dict]:
        return [{"id": i, "prompt": r.prompt, "output": r.output, "arrival": r.arrival}
                for i, r in enumerate(self.requests)]

    def _form(self, batch_form) -> dict:
        return {"requests": self._requests_form(), "batches": [batch_form(b) for b in self.batches]}


# --------------------------------------------------------------------------- metrics

METRIC_KEYS = ("total_latency", "mean_latency", "mean_ttft", "mean_tpot", "batches",
               "evictions", "recomputed_tokens", "peak_kv")


@dataclass
class Metrics:
    total_latency: float  # end of the last batch
    mean_latency: float
    mean_ttft: float
    mean_tpot: float  # over requests with O > 1; 0 if there are none
    batches: int  # batches that process at least one token
    evictions: int
    recomputed_tokens: int
    peak_kv: int
    p50_latency: float
    p99_latency: float
    p50_ttft: float
    p99_ttft: float
    p50_tpot: float
    p99_tpot: float
    # the papers' metrics (beside the keys above, also a contract)
    p95_ttft: float = 0.0
    mean_tbt: float = 0.0  # over every gap between consecutive tokens of a request, all requests pooled
    p99_tbt: float = 0.0
    p50_normalized_latency: float = 0.0  # latency / O per request
    p95_normalized_latency: float = 0.0
    slo_attainment: float | None = None  # only with an SLO (`Replay.apply_slo`); left out of to_dict() without

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        if d["slo_attainment"] is None:
            del d["slo_attainment"]
        return d


@dataclass(frozen=True)
class Slo:
    """Apt-Serve's latency SLO: a request attains it when its TTFT <= ttft and the 99th percentile of
    its own token gaps (its P99 TBT, linear interpolation; no gaps when O = 1) <= tbt."""

    ttft: float
    tbt: float

    @classmethod
    def parse(cls, text: str, source: str = "", field: str = "slo") -> "Slo":
        """From "ttft=S,tbt=S" (seconds, both required, finite and > 0)."""
        values = {}
        for part in text.split(","):
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or key not in ("ttft", "tbt"):
                raise InputError(source, field, f"{text!r}: expected ttft=SECONDS,tbt=SECONDS")
            try:
                v = float(value)
            except ValueError:
                raise InputError(source, field, f"{text!r}: {key}: expected a number of seconds, got {value.strip()!r}") from None
            if not (math.isfinite(v) and v > 0):
                raise InputError(source, field, f"{text!r}: {key}: must be a finite number of seconds > 0")
            if key in values:
                raise InputError(source, field, f"{text!r}: {key} given more than once")
            values[key] = v
        missing = [k for k in ("ttft", "tbt") if k not in values]
        if missing:
            raise InputError(source, field, f"{text!r}: {missing[0]} is missing (expected ttft=SECONDS,tbt=SECONDS)")
        return cls(values["ttft"], values["tbt"])

    def __str__(self) -> str:
        return f"ttft={self.ttft:g},tbt={self.tbt:g}"


@dataclass
class Replay:
    """Everything the replay of a valid schedule computed."""

    metrics: Metrics
    arrivals: np.ndarray  # per request, seconds
    completion: np.ndarray
    first_token: np.ndarray
    evictions: np.ndarray  # per request
    batch_start: np.ndarray  # per batch (every batch in the schedule, empty ones included)
    batch_end: np.ndarray
    batch_kv: np.ndarray  # KV tokens in use during the batch (blocks rounded)
    batch_features: np.ndarray  # (batches, len(FEATURES)): the cost model's features
    request_p99_tbt: np.ndarray  # per request: the 99th percentile of its token gaps (0 when O = 1)

    @property
    def latencies(self) -> np.ndarray:
        return self.completion - self.arrivals

    def slo_attained(self, slo: Slo) -> np.ndarray:
        """Per request: TTFT <= slo.ttft and its own P99 TBT <= slo.tbt (1e-9 relative slack for rounding)."""
        ttft = self.first_token - self.arrivals
        return (ttft <= slo.ttft * (1 + _TIME_EPS)) & (self.request_p99_tbt <= slo.tbt * (1 + _TIME_EPS))

    def apply_slo(self, slo: Slo | None) -> Metrics:
        """The metrics with `slo_attainment` (the share of requests that attain `slo`; 1 with no requests) set."""
        if slo is not None:
            ok = self.slo_attained(slo)
            self.metrics.slo_attainment = float(ok.mean()) if ok.size else 1.0
        return self.metrics


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


def _index_type(k: int):
    """The smallest unsigned integer type that holds 0..k-1 (numpy's stable sort of 16-bit keys is a radix sort)."""
    return np.uint16 if k <= 1 << 16 else np.uint32 if k <= 1 << 32 else np.uint64


def _grouped_percentile(values: np.ndarray, groups: np.ndarray, k: int, q: float) -> np.ndarray:
    """Per group 0..k-1: the q-th percentile of its values (numpy's linear interpolation), 0 for an empty group."""
    out = np.zeros(k)
    if not values.size:
        return out
    by_value = np.argsort(values, kind="stable")
    order = by_value[np.argsort(groups[by_value].astype(_index_type(k)), kind="stable")]  # by group, then value
    v, g = values[order], groups[order]
    counts = np.bincount(g, minlength=k)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    has = counts > 0
    pos = (counts[has] - 1) * (q / 100.0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, counts[has] - 1)
    frac = pos - lo
    base = starts[has]
    out[has] = v[base + lo] + frac * (v[base + hi] - v[base + lo])
    return out


class ReplayState:
    """Per-request state (m cached, n generated) and the clock, advanced one batch at a time."""

    def __init__(self, instance: Instance):
        self.instance = instance
        reqs = instance.requests
        self.prompt = [r.prompt for r in reqs]
        self.output = [r.output for r in reqs]
        self.arrival = [r.arrival for r in reqs]
        k = len(reqs)
        self.m = [0] * k
        self.n = [0] * k
        self.finished = [False] * k
        self.unfinished = k
        self.first_token = [math.nan] * k
        self.last_token = [0.0] * k  # when each request generated its latest token
        # Each batch's processing requests, and the entries (batch x k + request) that generated no
        # token: `finish` derives every token gap from them at numpy speed, instead of two appends per
        # token here (the full Splitwise trace generates 4.1 million tokens; prefill chunks are few).
        self._batch_requests: list[tuple[int, ...]] = []
        self._silent: list[int] = []
        # the decode-type requests (`is_decode_type` of their m, n), kept batch by batch: a scheduler
        # reads its running decodes from it instead of testing every running request each batch
        self.decoding: set[int] = set()
        self.done: list[int] = []  # the requests that finished in the latest batch
        self.completion = [math.nan] * k
        self.evictions = [0] * k
        self.recomputed = 0
        self.kv_used = 0  # blocks-rounded KV of all requests, between batches
        self.peak_kv = 0
        self.now = 0.0
        self.batches_applied = 0
        self.generated = 0  # tokens generated so far, all requests
        self.nonempty_batches = 0
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.kv_trace: list[int] = []
        self.features: list[tuple] = []
        # the requests a batch may process: arrived by the latest applied batch's start, unfinished (one
        # subset test a batch covers the ids, the arrivals and the finished, instead of tests per request)
        self._servable: set[int] = set()
        self._by_arrival = sorted(range(k), key=self.arrival.__getitem__)
        self._arrived = 0  # how many of _by_arrival have arrived (been made servable)
        s = instance.system
        self._b = s.block_size
        self._C, self._P, self._M = s.max_batch_tokens, s.max_prefill_tokens, s.kv_capacity

    def _check_tokens(self, j: int, start: float, tokens: dict[int, int], evicted: set[int]) -> None:
        """Raise ScheduleError for the first processing request (in batch order) that breaks a rule."""
        m, n, prompt, arrival, finished = self.m, self.n, self.prompt, self.arrival, self.finished
        late = start + _TIME_EPS * (1.0 + abs(start))
        for i, c in tokens.items():
            if not 0 <= i < len(m):
                raise ScheduleError(j, i, "processes an unknown request id")
            if finished[i]:
                raise ScheduleError(j, i, "processed after it finished")
            if arrival[i] > late:
                raise ScheduleError(j, i, f"processed in a batch starting at {start:.9g} s, before its arrival at {arrival[i]:.9g} s")
            if c < 1:
                raise ScheduleError(j, i, f"processes {c} tokens; a processing request needs c >= 1 (leave it out to idle)")
            mi = 0 if i in evicted else m[i]
            avail = prompt[i] + n[i] - mi
            if c > avail:
                raise ScheduleError(j, i, f"processes {c} tokens but only {avail} are not cached (S = {prompt[i] + n[i]}, m = {mi})")

    def apply(self, batch: Batch) -> float:
        """Check `batch` against the semantics and advance; returns its end time. Raises ScheduleError."""
        j = self.batches_applied
        start = self.now if batch.start is None else max(self.now, batch.start)
        m, n, prompt, finished = self.m, self.n, self.prompt, self.finished
        k = len(m)
        b = self._b
        tokens = batch.tokens
        seen_evict = set()
        for i in batch.evict:
            if not 0 <= i < k:
                raise ScheduleError(j, i, "evicts an unknown request id")
            if i in seen_evict:
                raise ScheduleError(j, i, "evicted twice in one batch")
            seen_evict.add(i)
            if finished[i]:
                raise ScheduleError(j, i, "evicted after it finished")
            if m[i] == 0:
                raise ScheduleError(j, i, "evicted but holds no cached KV")
            if i in tokens:
                raise ScheduleError(j, i, "both evicted and processed in the same batch")
        late = start + _TIME_EPS * (1.0 + abs(start))  # arrivals up to this count as arrived
        servable, by_arrival, arrival = self._servable, self._by_arrival, self.arrival
        a = self._arrived
        while a < k and arrival[by_arrival[a]] <= late:  # starts never decrease
            a += 1
        # Whole-batch tests at C speed (the hot path); where one fails, or the account finds a
        # request asking for more tokens than it has uncached, _check_tokens names the culprit.
        if tokens and (min(tokens.values()) < 1 or not (servable.issuperset(tokens)
                                                        or (tokens.keys() - servable).issubset(by_arrival[self._arrived:a]))):
            self._check_tokens(j, start, tokens, seen_evict)
        decoding = self.decoding
        account = account_batch(tokens, m, n, prompt, seen_evict, b)
        if account.overdrawn:
            self._check_tokens(j, start, tokens, seen_evict)
        tok, pre_tok = account.tokens, account.prefill_tokens
        kv = self.kv_used + account.kv_growth
        for i in seen_evict:
            kv -= round_to_blocks(m[i], b)
        if tok > self._C:
            raise ScheduleError(j, None, f"processes {tok} tokens, more than max_batch_tokens C = {self._C}")
        if pre_tok > self._P:
            raise ScheduleError(j, None, f"processes {pre_tok} prefill-type tokens, more than max_prefill_tokens P = {self._P}")
        if kv > self._M:
            raise ScheduleError(j, None, f"needs {kv} KV tokens, more than kv_capacity M = {self._M}")
        self.kv_trace.append(kv)
        if kv > self.peak_kv:
            self.peak_kv = kv
        # the batch is valid: advance
        for i in by_arrival[self._arrived:a]:
            servable.add(i)
        self._arrived = a
        for i in seen_evict:
            self.recomputed += m[i]
            self.evictions[i] += 1
            m[i] = 0
            decoding.discard(i)
        end = start + account.time(self.instance.cost)
        output, first, last_token = self.output, self.first_token, self.last_token
        self._batch_requests.append(tuple(tokens))
        done = []  # requests that generate their last token
        generated = 0  # counted locally: an attribute update per token is a cost on the hot path
        for i, c in tokens.items():
            mi = m[i] + c
            ni = n[i]
            if mi == prompt[i] + ni:
                if c != 1 or not ni:  # it was prefill-type; now it is decode-type (until done)
                    decoding.add(i)
                ni += 1
                generated += 1
                n[i] = ni
                if ni == 1:
                    first[i] = end
                last_token[i] = end
                if ni == output[i]:
                    done.append(i)
            else:
                self._silent.append(j * k + i)
                if is_decode_type(ni, prompt[i] + ni - mi):  # a refill that leaves only the generated token uncached
                    decoding.add(i)
            m[i] = mi
        completion = self.completion
        for i in done:
            finished[i] = True
            servable.discard(i)
            completion[i] = end
            kv -= round_to_blocks(m[i], b)
            m[i] = 0
            decoding.discard(i)
        self.unfinished -= len(done)
        self.done = done
        self.generated += generated
        if tok:
            self.nonempty_batches += 1
        self.batches_applied += 1
        self.starts.append(start)
        self.ends.append(end)
        self.features.append(account.features)
        self.now = end
        self.kv_used = kv
        return end

    def _token_gaps(self, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every gap between consecutive tokens of a request, in the order the tokens were generated
        (batch by batch, each batch's requests in its order), and whose gap each is. A gap is the end
        of the batch of a token less the end of the batch of the request's previous token."""
        k = len(self.m)
        per_batch = self._batch_requests
        sizes = np.fromiter(map(len, per_batch), dtype=np.int64, count=len(per_batch))
        requests = np.fromiter(chain.from_iterable(per_batch), dtype=_index_type(k), count=int(sizes.sum()))
        batch = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
        if self._silent:  # the entries that generated no token (prefill chunks, refills) leave
            silent_batch, silent_request = divmod(np.array(self._silent, dtype=np.int64), k)
            offsets = np.cumsum(sizes) - sizes
            at = offsets[silent_batch] + [per_batch[j].index(i) for j, i in zip(silent_batch.tolist(), silent_request.tolist())]
            token = np.ones(requests.size, dtype=bool)
            token[at] = False
            requests, batch = requests[token], batch[token]
        # by request, in generation order within each: a token's predecessor is the one before it
        order = np.argsort(requests, kind="stable")
        by_request = requests[order]
        later = np.empty(order.size, dtype=bool)  # the same request generated a token before it
        later[:1] = False
        np.equal(by_request[1:], by_request[:-1], out=later[1:])
        del by_request
        token_end = ends[batch[order]]
        del batch
        gap_sorted = token_end.copy()
        np.subtract(token_end[1:], token_end[:-1], out=gap_sorted[1:])
        del token_end
        has_gap = np.empty(order.size, dtype=bool)
        has_gap[order] = later
        gaps = np.empty(order.size)
        gaps[order] = gap_sorted
        del order, gap_sorted
        return gaps[has_gap], requests[has_gap]

    def finish(self) -> Replay:
        for i, done in enumerate(self.finished):
            if not done:
                raise ScheduleError(None, i, f"unfinished: {self.n[i]} of {self.output[i]} tokens generated")
        completion = np.array(self.completion)
        first = np.array(self.first_token)
        arrivals = np.array(self.arrival)
        outputs = np.array(self.output)
        lat = completion - arrivals
        ttft = first - arrivals
        multi = outputs > 1
        tpot = (completion[multi] - first[multi]) / (outputs[multi] - 1)
        ends = np.array(self.ends)
        gaps, gap_requests = self._token_gaps(ends)
        normalized = lat / outputs
        metrics = Metrics(
            total_latency=float(self.ends[-1]) if self.ends else 0.0,
            mean_latency=float(lat.mean()),
            mean_ttft=float(ttft.mean()),
            mean_tpot=float(tpot.mean()) if tpot.size else 0.0,
            batches=self.nonempty_batches,
            evictions=int(sum(self.evictions)),
            recomputed_tokens=int(self.recomputed),
            peak_kv=int(self.peak_kv),
            p50_latency=_pct(lat, 50), p99_latency=_pct(lat, 99),
            p50_ttft=_pct(ttft, 50), p99_ttft=_pct(ttft, 99),
            p50_tpot=_pct(tpot, 50), p99_tpot=_pct(tpot, 99),
            p95_ttft=_pct(ttft, 95),
            mean_tbt=float(gaps.mean()) if gaps.size else 0.0, p99_tbt=_pct(gaps, 99),
            p50_normalized_latency=_pct(normalized, 50), p95_normalized_latency=_pct(normalized, 95),
        )
        request_p99_tbt = _grouped_percentile(gaps, gap_requests, len(outputs), 99)
        return Replay(metrics, arrivals, completion, first, np.array(self.evictions),
                      np.array(self.starts), ends, np.array(self.kv_trace, dtype=np.int64),
                      np.array(self.features, dtype=float).reshape(-1, len(FEATURES)), request_p99_tbt)


def check_requests_match(instance: Instance, schedule: Schedule) -> None:
    if len(schedule.requests) != len(instance.requests):
        raise ScheduleError(None, None, f"the schedule lists {len(schedule.requests)} requests, the case has {len(instance.requests)}",
                            stage="request list")
    for i, (a, b) in enumerate(zip(schedule.requests, instance.requests)):
        if (a.prompt, a.output) != (b.prompt, b.output) or abs(a.arrival - b.arrival) > _TIME_EPS * (1 + b.arrival):
            raise ScheduleError(None, i, f"differs from the case: schedule has (prompt {a.prompt}, output {a.output}, "
                                         f"arrival {a.arrival}), case has ({b.prompt}, {b.output}, {b.arrival})",
                                stage="request list")


def validate(instance: Instance, schedule: Schedule) -> Replay:
    """Replay `schedule` on `instance` under the semantics; raise ScheduleError at the first broken rule."""
    check_requests_match(instance, schedule)
    state = ReplayState(instance)
    for batch in schedule.batches:
        state.apply(batch)
    return state.finish()
