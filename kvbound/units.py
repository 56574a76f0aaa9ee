"""Independent units of work (a sweep's points, the blocks of a bound) on every core or on Ray.

`run_units(fn, units)` yields `(index, fn(units[index]))` as each finishes: in this process
(`workers=1`), on a process pool of `workers` (default: every core), or as Ray tasks (`backend="ray"`:
on the cluster at `address`, else on a local Ray of `workers` CPUs). `fn` and the units must pickle;
results come back in the order they finish. Closing the generator early (the caller's deadline, an
error) cancels what has not run and stops what is running; so does an interrupt (Ctrl-C, SIGTERM), which
it raises as `Stopped` within POLL_SECONDS even while a unit runs (the units hear it too).
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from . import interrupt
from .errors import InputError
from .interrupt import Stopped

#: the ways `run_units` runs its units
BACKENDS = ("local", "ray")
#: how often a wait for units looks for an interrupt
POLL_SECONDS = 0.2
#: the problem where Ray is named but not installed
NO_RAY = "ray: needs Ray: pip install 'kvbound[distributed]'"
#: set in a worker while it runs units: units it starts run there, one after another (a sweep point's
#: solve does not start a pool of its own on cores the sweep's other points use)
_in_a_unit = False


def check_backend(backend: str, workers: int | None) -> None:
    """Bad input (before any work) for an unknown backend, Ray named but not installed, or fewer than
    one worker."""
    if backend not in BACKENDS:
        raise InputError("", "backend", f"{backend}: must be local or ray")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise InputError("", "backend", NO_RAY)
    if workers is not None and workers < 1:
        raise InputError("", "workers", f"{workers}: must be >= 1")


def default_workers(workers: int | None) -> int:
    return workers or os.cpu_count() or 1


def run_units(fn: Callable, units: Sequence, *, backend: str = "local", workers: int | None = None,
              address: str | None = None) -> Iterator[tuple[int, object]]:
    """`(index, fn(unit))` for every unit, in the order they finish (the module's docstring)."""
    check_backend(backend, workers)
    if not units or _in_a_unit:
        return _here(fn, units)  # a generator all the same: callers may close it
    if backend == "ray":
        return _ray(fn, units, workers, address)
    workers = min(default_workers(workers), len(units))
    return _here(fn, units) if workers == 1 else _pool(fn, units, workers)


def _here(fn, units):
    # no pool: cheaper, and a debugger or profiler sees the work
    for k, unit in enumerate(units):
        yield k, fn(unit)


def _interrupted() -> None:
    if interrupt.requested() is not None:
        raise Stopped("interrupted")


def _pool(fn, units, workers: int):
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(max_workers=workers, initializer=_enter_worker)
    try:
        index = {pool.submit(fn, unit): k for k, unit in enumerate(units)}
        pending = set(index)
        while pending:
            _interrupted()
            done, pending = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            for future in done:
                yield index[future], future.result()
    except BaseException:  # Ctrl-C, an error, or the caller stopped early
        stop_pool(pool)
        raise
    pool.shutdown()


def stop_pool(pool) -> None:
    """Shut a process pool down without waiting for its running units (a solver in native code can take
    minutes to notice a signal): its workers get SIGKILL, since a worker hears SIGTERM as kvbound's
    request to stop and would print the traceback of its pool's loop."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _enter_worker() -> None:
    global _in_a_unit
    _in_a_unit = True
    interrupt.die_with_parent()


def _in_worker(fn, unit):
    """A Ray task: `fn(unit)`, with what it starts run there."""
    global _in_a_unit
    _in_a_unit = True
    return fn(unit)


def _ray(fn, units, workers: int | None, address: str | None):
    try:
        import ray
    except ImportError:
        raise InputError("", "backend", NO_RAY) from None
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(_in_worker)
        # units travel with their data (an Instance, not a case file), so worker nodes need kvbound only
        index = {task.remote(fn, unit): k for k, unit in enumerate(units)}
        pending = list(index)
        try:
            while pending:
                _interrupted()
                ready, pending = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
                if ready:
                    yield index[ready[0]], ray.get(ready[0])
        except BaseException:
            for ref in pending:  # on a shared cluster, do not leave the rest running
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()


@dataclass(frozen=True)
class UnitRunner:
    """Where `run` runs units: `run_units`'s backend, workers and address as one value (default: a
    process pool on every core)."""

    backend: str = "local"
    workers: int | None = None  # None: every core (locally), the local Ray's CPUs or the cluster's
    address: str | None = None  # a Ray cluster (backend "ray")

    def __post_init__(self):
        check_backend(self.backend, self.workers)

    def count(self, units: int) -> int:
        """How many units run at once, of `units` (at least 1; 1 inside a unit of another run)."""
        return 1 if _in_a_unit else max(1, min(default_workers(self.workers), units))

    def run(self, fn: Callable, units: Sequence) -> Iterator[tuple[int, object]]:
        return run_units(fn, units, backend=self.backend, workers=self.workers, address=self.address)
