"""Solving: `solve_with(instance, SolveOptions(...))` (`driver`) runs the phases of `plan` on one
`ledger` and returns a `Result`; `solve` names the options one by one; `prove` answers hypotheses."""
from .driver import lower_bounds, solve, solve_with
from .options import SolveOptions
from .result import Result

__all__ = ["Result", "SolveOptions", "lower_bounds", "solve", "solve_with"]
