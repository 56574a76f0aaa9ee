"""Stopping a command: Ctrl-C (SIGINT), SIGTERM and a passed deadline, as outcomes rather than crashes.

The CLI installs `install()`. The first SIGINT or SIGTERM is *requested*: in code that polls
(a backend waiting for its solver, `deferred()`), it only sets a flag that `Deadline.remaining()`
and the backends read, so the solver is stopped and its best answer kept; elsewhere it raises
`Stopped` at once, which `solve_with` turns into an interrupted result. A second signal ends the
process at once (exit 128 + signal) after killing the registered child processes and removing
the registered temporary folders, so nothing is left behind.

`Deadline.enforced()` (kvbound.deadline) raises `Stopped` in pure-Python phases (heuristics,
model building) when the deadline passes, through SIGALRM, in the main thread.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import sys
import threading

#: exit statuses: 128 + the signal number, as shells report them
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}
#: seconds a stopped solver (an interrupt) gets to hand back its best before it is killed or abandoned
STOP_GRACE = 1.0


class Stopped(BaseException):
    """A phase was cut short: by an interrupt (`reason` "interrupted") or its deadline ("time limit").

    A BaseException, so that no `except Exception` in a heuristic swallows it.
    """

    def __init__(self, reason: str = "interrupted"):
        super().__init__(reason)
        self.reason = reason


_state = {"signal": None, "raise": True, "installed": False}
_children: dict[int, object] = {}  # id -> a Popen or multiprocessing.Process to kill on a hard exit
_folders: set[str] = set()
_lock = threading.Lock()


def requested() -> int | None:
    """The signal number of a pending interrupt, or None."""
    return _state["signal"]


def request(signum: int = signal.SIGINT) -> None:
    """Ask everything that polls to stop (what the first Ctrl-C does; also for a KeyboardInterrupt caught)."""
    if _state["signal"] is None:
        _state["signal"] = signum


def reset() -> None:
    """Forget a pending interrupt (tests, and a library caller that handled one)."""
    _state["signal"] = None


def exit_status() -> int:
    return EXIT_STATUS.get(_state["signal"], 130)


def _handler(signum, frame) -> None:
    if _state["signal"] is not None:  # the second signal: out at once, leaving nothing behind
        cleanup()
        os._exit(EXIT_STATUS.get(signum, 128 + signum))
    _state["signal"] = signum
    if _state["raise"]:
        raise Stopped("interrupted")


def install() -> None:
    """SIGINT and SIGTERM become requests to stop (main thread only; the CLI calls this)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)
    _state["installed"] = True


def uninstall() -> None:
    """Forget the handlers (the caller restores the previous ones) and any pending interrupt."""
    _state["installed"] = False
    _state["signal"] = None
    _state["raise"] = True


def installed() -> bool:
    return _state["installed"]


@contextlib.contextmanager
def deferred():
    """Within: a first signal only sets the flag (the code here polls `requested()`)."""
    before = _state["raise"]
    _state["raise"] = False
    try:
        yield
    finally:
        _state["raise"] = before


@contextlib.contextmanager
def raising():
    """Within: a first signal raises `Stopped` (a pending one raises on entry)."""
    before = _state["raise"]
    _state["raise"] = True
    try:
        if _state["signal"] is not None:
            raise Stopped("interrupted")
        yield
    finally:
        _state["raise"] = before


def raises_now() -> bool:
    return _state["raise"]


# ------------------------------------------------------------------------- what a hard exit cleans up

_abandoned: list = []


#: seconds the interpreter's exit waits for an abandoned solver thread to return (it was told to stop)
EXIT_WAIT = 30.0


def abandon(thread) -> None:
    """A solver thread that did not stop when asked; the CLI ends the process without waiting for it.

    A library caller's interpreter would abort at exit if the thread still ran in native code
    ("terminate called without an active exception"), so at exit the thread gets EXIT_WAIT
    seconds to return, and the process then ends at once (status 1) if it has not."""
    with _lock:
        if not _abandoned:
            atexit.register(_end_abandoned)
        _abandoned.append(thread)


def _end_abandoned() -> None:
    for thread in _abandoned:
        thread.join(EXIT_WAIT)
    if abandoned():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def abandoned() -> bool:
    """Whether a solver thread still runs that was given up on."""
    return any(t.is_alive() for t in _abandoned)


def add_child(proc) -> None:
    with _lock:
        _children[id(proc)] = proc


def drop_child(proc) -> None:
    with _lock:
        _children.pop(id(proc), None)


def add_folder(path: str) -> None:
    with _lock:
        _folders.add(str(path))


def drop_folder(path: str) -> None:
    """Remove a temporary folder (and forget it)."""
    shutil.rmtree(path, ignore_errors=True)
    with _lock:
        _folders.discard(str(path))


def cleanup() -> None:
    """Kill the registered children and remove the registered folders (safe in a signal handler)."""
    for proc in list(_children.values()):
        with contextlib.suppress(Exception):
            proc.kill()
    for path in list(_folders):
        shutil.rmtree(path, ignore_errors=True)


def die_with_parent() -> None:
    """In a child process: be killed when the parent dies (Linux), so a SIGKILLed kvbound leaves no orphan."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
