"""`SolveOptions`: everything that says how to solve, made once at the edge and passed as one value."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..constraints import Constraints
from ..formulation import FORMULATION_KINDS
from ..objective import Objective
from ..schedulers import FAST_HEURISTICS
from ..units import UnitRunner

#: seconds, when a command or call names no time limit
DEFAULT_TIME_LIMIT = 60.0
#: `--formulation search`: no model; bounds and schedule searches use the time (the Lagrangian bound
#: for mean objectives, the configuration LP and packing for total latency, admission patterns)
SEARCH = "search"
#: the earlier name of SEARCH, still accepted
SEARCH_ALIAS = "lagrangian"
#: the names `--formulation` takes: "auto" picks a model by size, and the search where none fits
FORMULATIONS = ("auto", *FORMULATION_KINDS, SEARCH, SEARCH_ALIAS)


@dataclass(frozen=True)
class SolveOptions:
    objective: Objective = Objective.TOTAL_LATENCY
    backend: str = "auto"  # auto (HiGHS and CP-SAT race on a small model, else HiGHS) | highs | cpsat | cbc
    formulation: str = "auto"  # auto | chain | network | bigm | search
    time_limit: float = DEFAULT_TIME_LIMIT  # seconds for the whole solve (heuristics, build, backend)
    warm_start: tuple[str, ...] | None = FAST_HEURISTICS  # heuristics whose best valid schedule seeds the solver
    horizon: int | None = None  # batch count J; None: derived (and then certified)
    constraints: Constraints = Constraints()
    verbose: bool = False  # the backend's own log, on stderr
    export: str | None = None  # write the model here (.mps or .lp)
    # a heuristic schedule that meets the analytic bound is optimal: return it without building a
    # model (False: solve anyway, e.g. to test or time a backend on such a case)
    skip_proven: bool = True
    # also the bounds computed before a model only where every bound is asked for (`kvbound bound`:
    # the LP relaxation, in up to half of the time the heuristics leave)
    every_bound: bool = False
    # where independent units of a bound (the block bound's blocks) run: every core by default, or Ray
    units: UnitRunner = UnitRunner()

    def __post_init__(self):
        object.__setattr__(self, "objective", Objective.parse(self.objective))
        if self.formulation == SEARCH_ALIAS:
            object.__setattr__(self, "formulation", SEARCH)
        if self.warm_start is not None:
            object.__setattr__(self, "warm_start", tuple(self.warm_start))

    def but(self, **changes) -> "SolveOptions":
        """A copy with `changes` (e.g. `options.but(constraints=Constraints(no_evict=True))`)."""
        return replace(self, **changes)
