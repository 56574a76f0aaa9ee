"""Independent units of work (a sweep's points, the blocks of a bound) on every core or on Ray.

`run_units(fn, units)` yields `(index, fn(units[index]))` as each finishes: in this process
(`workers=1`), on a process pool of `workers` (default: every core), or as Ray tasks (`backend="ray"`:
on the cluster at `address`, else on a local Ray of `workers` CPUs). `fn` and the units must pickle;
results come back in the order they finish. Closing the generator early (the caller's deadline, an
error) cancels what has not run and stops what is running; so does an interrupt (Ctrl-C, SIGTERM), which
it raises as `Stopped` within POLL_SECONDS even while a unit runs (the units hear it too).

Units that share a deadline pass `start`: each unit's argument is then made as the unit starts (units
start only as workers free up), knowing the rounds of units still to start, so that a unit takes its
share of the time left and time an early unit leaves goes to the later ones. `session()` keeps one Ray
for several groups of units run one after another.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

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
              address: str | None = None, start: Callable | None = None) -> Iterator[tuple[int, object]]:
    """`(index, fn(unit))` for every unit, in the order they finish (the module's docstring).

    `start(unit, rounds)`, where given, is called in this process as each unit starts, in order, and
    `fn` gets what it returns instead of the unit; `rounds` = ceil(units not yet started, this one's
    included / units at once): a unit's fair share of a shared deadline is the time left / rounds."""
    check_backend(backend, workers)
    if not units or _in_a_unit:
        return _here(fn, units, start)  # a generator all the same: callers may close it
    if backend == "ray":
        return _ray(fn, units, workers, address, start)
    workers = min(default_workers(workers), len(units))
    return _here(fn, units, start) if workers == 1 else _pool(fn, units, workers, start)


def _arguments(units: Sequence, at_once: int, start: Callable | None):
    """(index, what `fn` gets) of each unit in order, made as it is drawn (`run_units`'s `start`)."""
    for k, unit in enumerate(units):
        yield k, unit if start is None else start(unit, -(-(len(units) - k) // at_once))


def _room(start: Callable | None, at_once: int, running: int) -> int | None:
    """How many more units to start now: with `start`, as workers free up (the argument of each is made
    when it starts); else all at once (None)."""
    return None if start is None else max(0, at_once - running)


def _here(fn, units, start=None):
    # no pool: cheaper, and a debugger or profiler sees the work
    for k, arg in _arguments(units, 1, start):
        _interrupted()  # an interrupt starts no more units, as on a pool
        yield k, fn(arg)


def _interrupted() -> None:
    if interrupt.requested() is not None:
        raise Stopped("interrupted")


def _dispatch(units, at_once: int, start, submit: Callable, finished: Callable, running: dict):
    """`(index, result)` as units end, on a pool or Ray: units are submitted (`submit(argument)` -> a
    handle, kept in `running` with the unit's index, for the caller's clean-up) as `_room` allows, and
    `finished(running)` waits up to POLL_SECONDS for (handle, result) pairs of those that ended."""
    todo = _arguments(units, at_once, start)
    while True:
        _interrupted()
        for k, arg in islice(todo, _room(start, at_once, len(running))):
            running[submit(arg)] = k
        if not running:
            return
        for handle, result in finished(running):
            yield running.pop(handle), result


def _pool(fn, units, workers: int, start):
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    def finished(running):
        done, _ = wait(running, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
        return ((future, future.result()) for future in done)  # each result read as it is yielded

    pool = ProcessPoolExecutor(max_workers=workers, initializer=_enter_worker)
    try:
        yield from _dispatch(units, workers, start, lambda arg: pool.submit(fn, arg), finished, {})
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


def _ray(fn, units, workers: int | None, address: str | None, start):
    with _ray_session(workers, address) as ray:
        # without `workers`, as many at once as the cluster (or the local Ray) has CPUs
        at_once = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        task = ray.remote(num_cpus=1)(_in_worker)

        def finished(running):
            ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_SECONDS)
            return ((ref, ray.get(ref)) for ref in ready)

        # units travel with their data (an Instance, not a case file), so worker nodes need kvbound only
        running: dict = {}
        try:
            yield from _dispatch(units, at_once, start, lambda arg: task.remote(fn, arg), finished, running)
        except BaseException:
            for ref in running:  # on a shared cluster, do not leave the rest running
                ray.cancel(ref, force=True)
            raise


@contextlib.contextmanager
def _ray_session(workers: int | None, address: str | None):
    """Within: Ray, joined at `address` or started locally with `workers` CPUs, unless it runs already
    (then it is left running)."""
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
        yield ray
    finally:
        if started:
            ray.shutdown()


@contextlib.contextmanager
def session(backend: str = "local", workers: int | None = None, address: str | None = None):
    """Within: every `run_units` on Ray uses one Ray, started here (a local one takes seconds to start:
    a caller with several groups of units pays that once). Nothing to do locally or inside a unit."""
    check_backend(backend, workers)
    if backend != "ray" or _in_a_unit:
        yield
        return
    with _ray_session(workers, address):
        yield


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

    def run(self, fn: Callable, units: Sequence, start: Callable | None = None) -> Iterator[tuple[int, object]]:
        return run_units(fn, units, backend=self.backend, workers=self.workers, address=self.address, start=start)

    def session(self):
        """`session()` for this runner's backend: one Ray for every `run` within."""
        return session(self.backend, self.workers, self.address)
