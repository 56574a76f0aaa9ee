"""One deadline per command: made at the edge from `--time-limit`, asked by every phase for the time left.

An interrupt (kvbound.interrupt: Ctrl-C, SIGTERM) ends every deadline at once: `remaining()` is 0
from then on, so each phase that asks stops, and the backends stop their solvers. A deadline made
`until(event)` also ends when the event is set: the solvers of a race stop when another has won.
"""
from __future__ import annotations

import contextlib
import math
import signal
import threading
import time

from . import interrupt
from .interrupt import Stopped


class Deadline:
    """A point in (monotonic) time; `None` seconds means no limit."""

    def __init__(self, seconds: float | None = None, *, clock=time.monotonic):
        if seconds is not None and not (isinstance(seconds, (int, float)) and seconds >= 0 and not math.isnan(seconds)):
            raise ValueError(f"a deadline needs seconds >= 0 or None, got {seconds!r}")
        self._clock = clock
        self.started = clock()
        self.limit = math.inf if seconds is None else float(seconds)
        self.at = self.started + self.limit
        self._off: threading.Event | None = None  # set: called off before its time (`until`)

    def remaining(self) -> float:
        """Seconds left (0 once passed, interrupted or called off; inf without a limit)."""
        if interrupt.requested() is not None or self.called_off():
            return 0.0
        return max(0.0, self.at - self._clock())

    def called_off(self) -> bool:
        """Whether the event this deadline was made `until` is set (not an interrupt, not the time)."""
        return self._off is not None and self._off.is_set()

    def until(self, event: threading.Event) -> "Deadline":
        """The same deadline, also ended at once when `event` is set."""
        child = self.shifted(0.0)
        child._off = event
        return child

    def elapsed(self) -> float:
        return self._clock() - self.started

    def expired(self) -> bool:
        return interrupt.requested() is not None or self.called_off() or self._clock() >= self.at

    def share(self, fraction: float) -> "Deadline":
        """A deadline `fraction` of the time left from now, never later than this one."""
        child = Deadline(None, clock=self._clock)
        child.limit = self.remaining() * fraction if math.isfinite(self.at) else math.inf
        child.at = min(self.at, child.started + child.limit)
        child._off = self._off
        return child

    def shifted(self, seconds: float) -> "Deadline":
        """The same deadline `seconds` later (earlier if negative), for a grace or a margin."""
        child = Deadline(None, clock=self._clock)
        child.started, child.limit, child.at = self.started, self.limit + seconds, self.at + seconds
        child._off = self._off
        return child

    def with_grace(self) -> "Deadline":
        """The same deadline later by half of what the promise allows past it (`overrun_allowed`): for the
        one thing a command should not return without (a first schedule), never for improving one."""
        return self.shifted(0.5 * overrun_allowed(self.limit)) if math.isfinite(self.limit) else self

    @contextlib.contextmanager
    def enforced(self):
        """Within: `Stopped` is raised when this deadline passes (SIGALRM; main thread, real clock) or
        on an interrupt. For phases that cannot poll: heuristics, model building. Without SIGALRM (a
        thread other than the main one) it only raises on entry if the deadline has already passed."""
        if self.expired():
            raise Stopped("interrupted" if interrupt.requested() is not None else "time limit")
        usable = (threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
                  and self._clock is time.monotonic and math.isfinite(self.at))
        if not usable:
            with interrupt.raising():
                yield
            return
        previous_handler = signal.signal(signal.SIGALRM, _alarm)
        previous_delay, _ = signal.getitimer(signal.ITIMER_REAL)
        outer_at = time.monotonic() + previous_delay if previous_delay > 0 else math.inf
        try:
            with interrupt.raising():
                signal.setitimer(signal.ITIMER_REAL, max(1e-3, min(self.at, outer_at) - time.monotonic()), ALARM_REPEAT)
                yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)
            if math.isfinite(outer_at):  # an enclosing region's alarm goes on
                signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer_at - time.monotonic()), ALARM_REPEAT)

    def __repr__(self) -> str:
        return f"Deadline(remaining={self.remaining():.3f} s of {self.limit:g} s)"


def overrun_allowed(limit: float) -> float:
    """The promise of every `--time-limit T`: the command ends within max(2 s, 10%) of T."""
    return max(2.0, 0.1 * limit)


#: seconds between alarms once the deadline has passed: a `Stopped` raised where Python swallows
#: exceptions (a garbage-collector callback, a __del__) is raised again instead of lost
ALARM_REPEAT = 0.2


def _alarm(signum, frame) -> None:
    if interrupt.raises_now():
        raise Stopped("time limit")
