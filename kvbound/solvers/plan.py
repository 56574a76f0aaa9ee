"""What a solve runs, in order: the phases (`PLAN`) and the bounds registered for their stages.

The import line below registers the bounds in `kvbound.bounds` (each module registers its method
for a stage, `kvbound.bounds.base.register`), in the order they run within a stage. A new bound: its
module in kvbound/bounds, and its name added to that line.
"""
from __future__ import annotations

from ..backends import BACKENDS
from ..bounds import analytic, window_ranks, configuration_lp, lagrangian, completion_master, lp_relaxation, blocks  # noqa: F401  registers them
from ..bounds.base import Stage
from .phases.bounds import Bounds
from .phases.bursts import Bursts, BurstSeeds
from .phases.exhaust import Exhaust
from .phases.heuristics import ChooseRoute, Heuristics
from .phases.model import Model
from .phases.packing import Packing
from .phases.periods import BusyPeriods
from .phases.race_first import RaceFirst
from .phases.search import Search
from .phases.windows import Windows

PLAN = (
    Bounds(Stage.FIRST),  # the analytic bounds, from the instance alone
    Heuristics(),  # the warm-start heuristics and the serial schedule
    Exhaust(),  # tiny instances: the optimum by exhausting the states
    BusyPeriods(),  # mean objectives with arrivals: the windows between idle times, each solved alone
    ChooseRoute(BACKENDS),  # a model, the search, or neither
    Bounds(Stage.MODEL),  # before a model, where every bound is asked for (the LP relaxation)
    BurstSeeds(),  # before a model, mean objectives: burst schedules as its incumbent, in 15% of the time
    RaceFirst(),  # before a model, mean objectives on 6+ requests: the Lagrangian bound in 5% of the time
    Model(),  # the model, warm-started, solved by the backend (or the race of several)
    Search(steps=(Bounds(Stage.SEARCH), Packing(), Bursts(), Windows())),  # where no model is solved: until the deadline or a proof
)
