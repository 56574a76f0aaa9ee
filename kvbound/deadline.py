"""One deadline per command: made at the edge from `--time-limit`, asked by every phase for the time left."""
from __future__ import annotations

import math
import time


class Deadline:
    """A point in (monotonic) time; `None` seconds means no limit."""

    def __init__(self, seconds: float | None = None, *, clock=time.monotonic):
        if seconds is not None and not (isinstance(seconds, (int, float)) and seconds >= 0 and not math.isnan(seconds)):
            raise ValueError(f"a deadline needs seconds >= 0 or None, got {seconds!r}")
        self._clock = clock
        self.started = clock()
        self.limit = math.inf if seconds is None else float(seconds)
        self.at = self.started + self.limit

    def remaining(self) -> float:
        """Seconds left (0 once passed; inf without a limit)."""
        return max(0.0, self.at - self._clock())

    def elapsed(self) -> float:
        return self._clock() - self.started

    def expired(self) -> bool:
        return self._clock() >= self.at

    def share(self, fraction: float) -> "Deadline":
        """A deadline `fraction` of the time left from now, never later than this one."""
        child = Deadline(None, clock=self._clock)
        child.limit = self.remaining() * fraction if math.isfinite(self.at) else math.inf
        child.at = min(self.at, child.started + child.limit)
        return child

    def __repr__(self) -> str:
        return f"Deadline(remaining={self.remaining():.3f} s of {self.limit:g} s)"
