"""Clocks: the device time of a model run, and the host time of preparing it."""
from __future__ import annotations

import gc
import math
import time

import torch


def host_clock():
    """With one torch thread, that thread's CPU time (`time.thread_time`, monotonic): all the work
    runs on it, and time the OS gives to other processes on a shared machine does not count.
    With more threads, wall time (`time.perf_counter`)."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


class Timer:
    """Time of a block of host code and the device work it issues.

    CUDA: events on the current stream, with the device idle first (the end event is waited
    for), so the figure is the GPU time of the work between them. CPU, where torch ops are
    synchronous: `host_clock()`. Python's garbage collector is paused inside: a collection is
    triggered by allocation counts, so it falls on the same batch of every pass of a replay
    (on an H100 one batch took 49.4 ms in both passes where its twins took 29-30 ms), and its
    time belongs to no batch; it runs after the block instead.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.seconds = math.nan

    def __enter__(self) -> "Timer":
        self._collecting = gc.isenabled()
        gc.disable()
        if self.cuda:
            torch.cuda.synchronize()
            self._start.record()
        else:
            self._clock = host_clock()
            self._t0 = self._clock()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1000.0
        else:
            self.seconds = self._clock() - self._t0
        if self._collecting:
            gc.enable()


class HostTimer:
    """Host time of a block of host code (batch preparation): `host_clock()` on CPU; wall time
    on CUDA, where the host thread is what is measured and the GPU runs beside it."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds = math.nan

    def __enter__(self) -> "HostTimer":
        self._clock = time.perf_counter if self.cuda else host_clock()
        self._t0 = self._clock()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = self._clock() - self._t0
