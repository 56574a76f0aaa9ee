"""The anytime bounds raced in the search: whose pass comes next, and when one leaves.

The first member passes alone until it has made STALLED_PASSES passes (or half the time has gone:
passes are slower on a busy machine); then the member with the lower bound gets FOLLOWER_SHARE of
the time, so a bound that creeps without stalling cannot starve one that would overtake it. A
member leaves once its bound has gained less than STALLED_GAIN over its last STALLED_PASSES passes
(while another is left), and the whole race ends where the first member's first pass is below
USEFUL_FIRST_PASS of the best bound known (the others start where it does). docs/formulation.md,
"The completion master".
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ..deadline import Deadline
from ..interrupt import Stopped
from .base import Bound, Pass

#: a race ends after its first member's first pass if that is below this share of the best bound known
USEFUL_FIRST_PASS = 0.5
#: a member leaves once its bound has gained less than this share over its last passes (or its steps
#: vanished); bounds can stay flat for a hundred passes and then rise again
STALLED_PASSES = 200
STALLED_GAIN = 1e-4
#: once the first member has made STALLED_PASSES passes (or half the time has gone), the member with
#: the lower bound gets this share of the time
FOLLOWER_SHARE = 0.2


@dataclass
class Member:
    """One anytime bound in the race: its passes and what they gave."""

    name: str
    iterations: object  # its iterator of `Pass`
    seconds: float = 0.0  # spent in its passes
    shared: float = 0.0  # of which since the leader took the lead (`Turns`)
    history: list = field(default_factory=list)  # its best bound after each pass

    @property
    def passes(self) -> int:
        return len(self.history)

    @property
    def value(self) -> float:
        """Its best bound so far."""
        return self.history[-1] if self.history else -math.inf


class Turns:
    """Whose pass comes next (the module's docstring); the follower's share is counted from when the
    leader took the lead, so a new leader does not owe the old one the time it had."""

    def __init__(self, deadline: Deadline):
        self.leader: Member | None = None
        self.warm_up = deadline.share(0.5)

    def next(self, members: list[Member]) -> tuple[Member, bool]:
        """The member, and whether the time is shared yet (its pass then adds to its `shared`)."""
        if len(members) == 1 or (members[0].passes <= STALLED_PASSES and not self.warm_up.expired()):
            return members[0], False
        leader = max(members, key=lambda m: m.value)
        if leader is not self.leader:
            self.leader = leader
            for m in members:
                m.shared = 0.0
        return min(members, key=lambda m: m.shared / (1 - FOLLOWER_SHARE if m is leader else FOLLOWER_SHARE)), True


class Race:
    """The registered anytime bounds that can run on what is known, raced (the module's docstring).

    Iterate `turns(deadline)`: one item a turn, a `Pass` (its member's best so far) or None where a
    member left; it ends where no member is left. `note` says why no value came where none did."""

    def __init__(self, methods, known, deadline: Deadline):
        self.known, self.members, self.note = known, [], "none: no pass finished in time"
        try:
            with deadline.enforced():  # a reason may replay a schedule: under a second on 1,000 requests
                for method in methods:
                    why = method.skip_reason(known)
                    if why is None:
                        self.members.append(Member(method.name, method.passes(known)))
                    elif method is methods[0]:
                        self.note = why  # the others start where the first one does: none runs
                        break
        except Stopped:
            self.members = []
        self.all = list(self.members)
        self.passes, self.best, self.leader = 0, -math.inf, None

    def turns(self, deadline: Deadline):
        members, turns = list(self.members), Turns(deadline)
        while members:
            member, sharing = turns.next(members)
            began = time.perf_counter()
            with deadline.enforced():  # a pass on 1,000 requests takes minutes: it is cut at the deadline
                found = next(member.iterations, None)
            spent = time.perf_counter() - began
            member.seconds += spent
            member.shared += spent if sharing else 0.0
            if found is None:
                members.remove(member)
                yield None
                continue
            self.passes += 1
            member.history.append(max(member.value, found.value))
            if (len(members) > 1 and member.passes > STALLED_PASSES
                    and member.value - member.history[-STALLED_PASSES - 1] <= STALLED_GAIN * abs(member.value)):
                members.remove(member)  # its bound stalls: the next member takes the time
            if member.passes == 1 and member is self.all[0] and found.value < USEFUL_FIRST_PASS * self.known.lower:
                self.note = "none kept: its first pass was below half the analytic bound (it does not see arrival times)"
                return
            if found.value > self.best:
                self.best, self.leader = found.value, member.name
            yield Pass(member.value, found.hint)

    def row(self, name: str) -> Bound:
        """The race's best so far as a certified bound row named `name` (each pass is a bound)."""
        return Bound(name, self.best, note=f"{self.leader} variant: every multiplier gives a bound")

    def report(self) -> dict:
        """What the race did, per member (passes, seconds, best bound)."""
        return {m.name: {"passes": m.passes, "seconds": round(m.seconds, 3),
                         "bound": m.value if math.isfinite(m.value) else None} for m in self.all}
