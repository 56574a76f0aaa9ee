"""OR-Tools CP-SAT in a child process: the runner, and the solver settings every CP-SAT model here uses.

OR-Tools bundles its own HiGHS, whose symbols clash with highspy's when both load in one process,
so CP-SAT never runs in kvbound's own. The child reports each improving solution; the parent
keeps the last one, tells the child to stop on an interrupt, and kills it where it does not answer
(`CPSAT_GRACE` after its deadline, `interrupt.STOP_GRACE` after an interrupt).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import interrupt
from .deadline import Deadline

#: seconds CP-SAT may overrun its deadline before its process is killed: it does not always stop
#: in time (google/or-tools#2604, #4882), and the time limit is part of `solve`'s contract
CPSAT_GRACE = 1.0


@dataclass
class CpsatAnswer:
    """What `run_cpsat_process` got: the child's outcome, or (killed) the last incumbent it reported."""

    outcome: object | None  # what the child's solve function returned; None if it was killed
    last: tuple | None  # the last ("incumbent", ...) message
    seconds: float
    why: str = ""  # why the child was killed


def run_cpsat_process(solve_here: Callable, payload, deadline: Deadline, *, grace: float = CPSAT_GRACE,
                      on_incumbent: Callable[[tuple], None] | None = None) -> CpsatAnswer:
    """Run `solve_here(payload, at, say, stop_conn, on_start)` (a module-level function that builds and
    solves a CP-SAT model until the monotonic time `at`, `say`ing ("incumbent", ...) messages) in a
    fresh child process until `deadline`, the child's start-up and model building included. If the
    child has not answered `grace` seconds after it, it is killed and the answer holds the last
    incumbent it reported."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    stop_receive, stop_send = ctx.Pipe(duplex=False)
    began = time.monotonic()
    child = ctx.Process(target=_cpsat_child, daemon=True,
                        args=(send, stop_receive, solve_here, payload, deadline.at, os.getpid()))
    best = None  # the last ("incumbent", ...) the child reported
    message = None
    solving = False  # the child said it began to solve (or sent anything)
    kill_at = deadline.at + grace
    # a signal during the start is deferred, not lost: it stays pending (`held`) and is then only a
    # request (`deferred`) that the loop below sees at once; the child starts with the signals blocked
    # (a Ctrl-C reaches the whole process group) and ignores SIGINT before it unblocks them
    with interrupt.deferred():
        try:
            interrupt.add_child(child)
            try:
                with interrupt.held():
                    child.start()
            finally:
                send.close()
                stop_receive.close()
            while message is None or message[0] not in ("done", "error"):
                stopping = interrupt.requested() is not None or deadline.called_off()
                if stopping and kill_at > time.monotonic() + interrupt.STOP_GRACE * solving:
                    # a child that is solving gets STOP_GRACE to hand back its answer; one still starting has none
                    kill_at = time.monotonic() + interrupt.STOP_GRACE * solving
                    with contextlib.suppress(OSError):
                        stop_send.send("stop")
                wait = kill_at - time.monotonic()
                if wait <= 0:
                    child.kill()
                    why = ("stopped by an interrupt" if interrupt.requested() is not None
                           else "stopped: another solver settled the race" if deadline.called_off()
                           else f"CP-SAT did not return {max(0.0, time.monotonic() - deadline.at):.1f} s after its deadline")
                    return CpsatAnswer(None, best, time.monotonic() - began, why)
                try:
                    message = _receive(receive, child, min(wait, 0.1))
                except KeyboardInterrupt:  # no handler installed (a library caller): stop, keep the best
                    interrupt.request()
                    continue
                except RuntimeError:  # the child ended without an answer
                    if interrupt.requested() is None and not deadline.called_off():
                        raise
                    return CpsatAnswer(None, best, time.monotonic() - began, "stopped by an interrupt" if
                                       interrupt.requested() is not None else "stopped: another solver settled the race")
                solving = solving or message is not None
                if message is not None and message[0] == "incumbent":
                    best = message
                    if on_incumbent is not None:
                        on_incumbent(message)
        finally:
            if child.pid is not None:  # started
                child.join(timeout=interrupt.STOP_GRACE if interrupt.requested() is not None or deadline.called_off() else 5)
                if child.is_alive():
                    child.kill()
                    child.join(timeout=5)
            interrupt.drop_child(child)
            receive.close()
            stop_send.close()
    kind, payload = message
    if kind == "error":
        raise payload
    return CpsatAnswer(payload, best, time.monotonic() - began)


def cpsat_solver(workers: int, at: float, stop_conn=None, verbose: bool = False):
    """A CpSolver as every CP-SAT model here runs: `workers` threads, kvbound's interrupt instead of
    CP-SAT's own, stopped by a message on `stop_conn`, its log (with `verbose`) on stderr, and a time
    limit up to the monotonic time `at` (set last: what comes before it takes time)."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False  # the parent decides (kvbound.interrupt)
    solver.parameters.num_workers = workers
    solver.parameters.log_search_progress = bool(verbose)
    if verbose:  # CP-SAT's log goes to stderr, never stdout
        solver.parameters.log_to_stdout = False
        solver.log_callback = lambda line: print(line, file=sys.stderr, flush=True)
    _stop_on_message(solver, stop_conn)
    solver.parameters.max_time_in_seconds = float(max(at - time.monotonic(), 0.0))
    return solver


def _stop_on_message(solver, stop_conn) -> None:
    """Stop `solver` (a CpSolver) when a message comes on `stop_conn` (the parent's interrupt)."""
    if stop_conn is None:
        return

    def wait_for_stop():
        with contextlib.suppress(EOFError, OSError):
            stop_conn.recv()
            solver.stop_search()
    threading.Thread(target=wait_for_stop, daemon=True).start()


def _receive(conn, child, timeout: float | None):
    """The child's next message, or None if none came within `timeout` seconds."""
    if not conn.poll(timeout):
        return None
    try:
        return conn.recv()
    except EOFError:
        child.join(timeout=5)
        raise RuntimeError(f"the CP-SAT process ended without an answer (exit code {child.exitcode})") from None


def _cpsat_child(conn, stop_conn, solve_here, payload, at, parent) -> None:
    # the parent handles Ctrl-C and tells this process to stop; it dies with the parent (at once if
    # that has already happened). It started with SIGINT and SIGTERM blocked (`interrupt.held`): a
    # Ctrl-C that came meanwhile is dropped here, as SIGINT is ignored before they are unblocked
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    interrupt.die_with_parent(parent)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, interrupt.SIGNALS)
    lock = threading.Lock()

    def say(message):
        with lock:
            conn.send(message)

    try:
        say(("done", solve_here(payload, at, say, stop_conn, on_start=lambda: say(("solving", None)))))
    except BaseException as exc:  # handed to the parent, which raises it
        say(("error", exc))
    finally:
        conn.close()
