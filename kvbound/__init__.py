"""kvbound: optimal batch schedules and certified latency lower bounds for LLM inference under a KV-cache limit.

Data flows one way: case file -> `Instance` -> scheduler or formulation + solver ->
`Schedule` -> `validate` / metrics -> report, plot or replay.
"""
from . import interrupt as _interrupt

_interrupt.at_startup()  # the `kvbound` command only: a Ctrl-C while it still imports is its interrupt, not a traceback
from .costs import CostModel
from .errors import InputError, KvboundError
from .schedule import Batch, Metrics, Schedule, ScheduleError, validate
from .schedulers import SCHEDULERS, get_scheduler, run_scheduler, simulate
from .io import load_case, load_trace
from .workload import Instance, Request, SystemConfig

__version__ = "0.1.0"

__all__ = ["CostModel", "InputError", "KvboundError", "Batch", "Metrics", "Schedule", "ScheduleError", "validate",
           "SCHEDULERS", "get_scheduler", "run_scheduler", "simulate", "Instance", "Request", "SystemConfig",
           "load_case", "load_trace"]
