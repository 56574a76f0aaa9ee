"""Stopping a command: Ctrl-C (SIGINT), SIGTERM and a passed deadline, as outcomes rather than crashes.

The CLI installs `install()`. The first SIGINT or SIGTERM is *requested*: in code that polls
(a backend waiting for its solver, `deferred()`), it only sets a flag that `Deadline.remaining()`
and the backends read, so the solver is stopped and its best answer kept; elsewhere it raises
`Stopped` at once, which `solve_with` turns into an interrupted result. A second signal ends the
process at once (exit 128 + signal) after killing the registered child processes and removing
the registered temporary folders, so nothing is left behind.

`Deadline.enforced()` (kvbound.deadline) raises `Stopped` in pure-Python phases (heuristics,
model building) when the deadline passes, through SIGALRM, in the main thread.

Signals are deferred, never ignored: a child process is started with SIGINT and SIGTERM blocked
(`held()`), so that a signal that comes meanwhile stays pending and is handled as soon as the
start is done (and the child, which inherits the blocked mask, is deaf to a Ctrl-C until it has
chosen how to take one). The CLI's process catches a signal from its first import on
(`at_startup()`), so a Ctrl-C while it starts is the command's interrupt too. Children die with
kvbound (`die_with_parent`, `child_setup`: Linux's parent-death signal), and a temporary folder
is removed by a watcher process when kvbound dies, even by SIGKILL (`add_folder`).
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


_state = {"signal": None, "raise": True, "installed": False, "startup": False}
_children: dict[int, object] = {}  # id -> a Popen or multiprocessing.Process to kill on a hard exit
_folders: set[str] = set()
_watchers: dict[str, tuple] = {}  # folder -> (watcher Popen, the write end of its pipe)
#: the signals a command takes as requests to stop
SIGNALS = (signal.SIGINT, signal.SIGTERM)
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
    """SIGINT and SIGTERM become requests to stop (main thread only; the CLI calls this). Any
    earlier interrupt is forgotten, except in the command's own process, where `at_startup()`'s handler
    caught every one so far: those are the command's. A signal while the handlers change is never lost
    and raises nothing here: it is pending, and the command reports what it has at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    if not _state["startup"]:  # a library caller's (or a test's) earlier interrupt is not this command's
        _state["signal"] = None
    with deferred():
        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)
    _state["installed"] = True


def _early_handler(signum, frame) -> None:
    if _state["signal"] is not None:  # a second signal: nothing has started yet
        os._exit(EXIT_STATUS.get(signum, 128 + signum))
    _state["signal"] = signum


def at_startup() -> None:
    """In the `kvbound` command's process only (the console script or `python -m kvbound.cli`), from
    its first import on: a SIGINT or SIGTERM while the CLI still imports is kept, not a traceback,
    and `install()` makes it the command's interrupt (which then reports what it has, at once)."""
    if threading.current_thread() is not threading.main_thread() or not _is_cli():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):  # never one ignored on purpose
            signal.signal(sig, _early_handler)
            _state["startup"] = True


def _is_cli() -> bool:
    """Whether this process is the `kvbound` command: the console script or `python -m kvbound.cli`, as
    the interpreter was started (a worker it spawns, given the command's sys.argv, is not)."""
    argv, k = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]), 1
    while k < len(argv):  # the interpreter's own options come first
        word = argv[k]
        if word == "-m":
            return k + 1 < len(argv) and argv[k + 1] == "kvbound.cli"
        if word.startswith("-m"):
            return word[2:] == "kvbound.cli"
        if word in ("-c", "-"):
            return False
        if not word.startswith("-"):  # the script
            return os.path.basename(word) == "kvbound"
        k += 2 if word in ("-X", "-W", "-Q") else 1
    return False


@contextlib.contextmanager
def held():
    """Within: SIGINT and SIGTERM are blocked in this thread (pending, not lost: handled as soon as it
    ends, unless another thread of this process took them meanwhile). Around a child process's start,
    inside `deferred()` (so that a signal this process takes meanwhile is only a request): the child
    inherits the blocked mask, so a Ctrl-C to the whole process group cannot end it while it starts
    (it unblocks them once it has chosen how to take them: `_cpsat_child`, `child_setup`), and this
    process is not cut short between starting a child and knowing it."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def uninstall() -> None:
    """Forget the handlers (the caller restores the previous ones) and any pending interrupt."""
    _state["installed"] = False
    _state["signal"], _state["startup"] = None, False
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


#: the watcher of a temporary folder: it waits on a pipe that only this process can write to; a line
#: means the folder was removed here, an end of file without one that this process died (even by
#: SIGKILL): it then removes the folder, and again a second later (a child solver killed by the same
#: death may still have been writing)
_WATCHER = 'read _ || { rm -rf -- "$1"; sleep 1; rm -rf -- "$1"; }'


def add_folder(path: str) -> None:
    """A temporary folder: removed on a hard exit, and by a watcher process if this one dies first."""
    path = str(path)
    with _lock:
        _folders.add(path)
    watcher = _watch(path)
    if watcher is not None:
        with _lock:
            _watchers[path] = watcher


def _watch(path: str):
    import subprocess

    read, write = os.pipe()  # not inheritable: no other child holds the write end
    try:
        with held():
            proc = subprocess.Popen(["/bin/sh", "-c", _WATCHER, "kvbound-folder-watcher", path], stdin=read,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:  # no /bin/sh: the folder is still removed on every exit but a SIGKILL
        os.close(write)
        return None
    finally:
        os.close(read)
    return proc, write


def drop_folder(path: str) -> None:
    """Remove a temporary folder (and forget it, its watcher told)."""
    path = str(path)
    shutil.rmtree(path, ignore_errors=True)
    with _lock:
        _folders.discard(path)
        watcher = _watchers.pop(path, None)
    if watcher is not None:
        proc, write = watcher
        with contextlib.suppress(OSError):
            os.write(write, b"removed\n")
        os.close(write)
        with contextlib.suppress(Exception):
            proc.wait(timeout=2)


def cleanup() -> None:
    """Kill the registered children and remove the registered folders (safe in a signal handler)."""
    for proc in list(_children.values()):
        with contextlib.suppress(Exception):
            proc.kill()
    for path in list(_folders):
        shutil.rmtree(path, ignore_errors=True)
        watcher = _watchers.get(path)
        if watcher is not None:  # removed: its watcher ends now rather than a second after this process
            with contextlib.suppress(OSError):
                os.write(watcher[1], b"removed\n")


def die_with_parent(parent: int | None = None) -> None:
    """In a child process: be killed when the parent dies (Linux), so a SIGKILLed kvbound leaves no
    orphan. `parent`: the parent's pid, where known; if it has already died (before this call), exit now."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def child_setup():
    """A `preexec_fn` for a solver binary (`subprocess.Popen`): it is killed when this process dies,
    even by SIGKILL (and exits at once if that happened before), and it hears SIGINT and SIGTERM
    again (they are blocked around its start, `held()`). Made here, called in the child after fork."""
    parent = os.getpid()
    prctl = None
    with contextlib.suppress(Exception):
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl  # looked up before the fork

    def setup():
        if prctl is not None:
            prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    return setup
