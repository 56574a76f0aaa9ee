"""Reading and writing kvbound's files; the domain types they hold live in `kvbound.workload` and `kvbound.schedule`.

* `kvbound.io.cases`: TOML case files -> `Instance` (`load_case`, `parse_case`, `read_toml`, `load_cost_file`,
  `parse_cost`, `parse_system`, `check_keys`).
* `kvbound.io.traces`: CSV request traces (Splitwise/Vidur, Azure, length-only) -> `Request`s (`load_trace`).
* `kvbound.io.schedules`: schedule JSON <-> `Schedule` (`schedule_from_json`, `load_schedule`, `dump_schedule`).

Every problem with a file is raised as `InputError(file, field, problem)`.
"""
from .cases import load_case
from .schedules import load_schedule, schedule_from_json
from .traces import load_trace

__all__ = ["load_case", "load_trace", "load_schedule", "schedule_from_json"]
