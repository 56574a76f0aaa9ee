"""The restrictions a hypothesis adds to the semantics (`Constraints`), and the one check of a schedule
against them (`Constraints.admit`)."""
from __future__ import annotations

from dataclasses import dataclass

from .accounting import is_decode_type
from .objective import Objective
from .schedule import ReplayState, Schedule
from .workload import Instance


@dataclass(frozen=True)
class Constraints:
    """Restrictions a hypothesis adds to the semantics (all off by default)."""

    no_evict: bool = False
    no_chunk: bool = False  # a prefill-type request processes all its uncached tokens at once
    no_hybrid: bool = False  # a batch is all decode-type or all prefill-type
    max_batch_size: int | None = None  # requests processed per batch
    admission_order: tuple[int, ...] | None = None  # request ids in the order they may first be processed
    objective_cap: float | None = None  # the objective must be <= this (seconds)

    def describe(self) -> list[str]:
        out = []
        if self.no_evict:
            out.append("no evictions")
        if self.no_chunk:
            out.append("no chunked prefill")
        if self.no_hybrid:
            out.append("no hybrid batches")
        if self.max_batch_size is not None:
            out.append(f"at most {self.max_batch_size} requests per batch")
        if self.admission_order is not None:
            out.append("fixed admission order " + ",".join(map(str, self.admission_order)))
        if self.objective_cap is not None:
            out.append(f"objective <= {self.objective_cap:.9g}")
        return out

    def stops_at_first_tokens(self, objective: Objective) -> bool:
        """Whether a model of `objective` may stop at the first tokens (mean TTFT where evictions are
        allowed: any prefix can then be completed by evicting, which changes no first token)."""
        return objective.first_token and not self.no_evict

    def impossible(self, instance: Instance) -> str | None:
        """Why no schedule of `instance` can meet these constraints, where that follows from the case
        alone (None: it does not): no request may be processed, or a prompt must go in one chunk that
        no batch can hold."""
        if self.max_batch_size is not None and self.max_batch_size < 1:
            return f"at most {self.max_batch_size} requests per batch: no request can be processed"
        P = instance.system.max_prefill_tokens
        if self.no_chunk:
            for i, r in enumerate(instance.requests):
                if r.prompt > P:
                    return f"request {i}'s prompt of {r.prompt} tokens exceeds P = {P}, and no chunked prefill forbids splitting it"
        return None

    def within_cap(self, value: float) -> bool:
        """Whether an objective value meets the cap (if any)."""
        return self.objective_cap is None or value <= self.objective_cap * (1 + 1e-12)

    def admit(self, instance: Instance, schedule: Schedule) -> bool:
        """Whether a valid schedule also meets the hypothesis constraints (the objective cap aside:
        `within_cap` checks its value)."""
        if not (self.no_evict or self.no_chunk or self.no_hybrid or self.max_batch_size is not None
                or self.admission_order is not None):
            return True  # nothing beyond the semantics, which the schedule meets
        st = ReplayState(instance)
        first_seen: dict[int, int] = {}
        for j, bt in enumerate(schedule.batches):
            if self.no_evict and bt.evict:
                return False
            if self.max_batch_size is not None and len(bt.tokens) > self.max_batch_size:
                return False
            kinds = set()
            for i, c in bt.tokens.items():
                S, m = st.prompt[i] + st.n[i], (0 if i in bt.evict else st.m[i])
                decode = is_decode_type(st.n[i], S - m)
                kinds.add(decode)
                if self.no_chunk and not decode and c != S - m:
                    return False
                first_seen.setdefault(i, j)
            if self.no_hybrid and len(kinds) > 1:
                return False
            st.apply(bt)
        if self.admission_order is not None:
            starts = [first_seen[i] for i in self.admission_order]
            if any(b < a for a, b in zip(starts, starts[1:])):
                return False
        return True
