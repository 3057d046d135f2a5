"""How a region's forward is timed: by profile_regions (_profiling) in the profiled step, and by
remat.fit in the planned steps after it that re-time the profile (_fit: a first step runs cold).

The timers: "auto" is CUDA events on a GPU (the time the GPU spent between the region's entry and
exit; read later, without a synchronization at the region) and the thread's CPU time on the CPU;
"wall" is wall-clock time, on a GPU after synchronizing at the region's entry and exit, so a
region that waits (I/O, a collective, a synchronization) counts what it waited.
"""

from __future__ import annotations

import operator
import time

import torch

TIMERS = ("auto", "wall")


def timer_arg(where, timer):
    if timer not in TIMERS:
        raise ValueError(f"{where}: timer must be 'auto' (CUDA events on a GPU, the thread's CPU time on the CPU) or "
                         f"'wall' (wall-clock time, counting what a region waits for: I/O, a collective, a "
                         f"synchronization), got {timer!r}")
    return timer


def retime_steps_arg(where, steps):
    """remat.fit's retime_steps: how many planned steps are timed to re-time a profile (0: none)."""
    if isinstance(steps, bool) or not hasattr(type(steps), "__index__") or operator.index(steps) < 0:
        raise ValueError(f"{where}: retime_steps must be an int of 0 or more (the planned steps whose regions' times "
                         f"re-time the profile of the first, cold step; 0 plans from that step's times alone), got "
                         f"{steps!r:.80}")
    return operator.index(steps)


def on_gpu():
    """Whether regions run on a GPU now (CUDA initialized in this process)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def clock_of(timer, cuda):
    """The clock `timer` reads, as a region-profile dump names it: wall_time, cuda_events or thread_time."""
    return "wall_time" if timer == "wall" else "cuda_events" if cuda else "thread_time"


def timed(timer, call):
    """(call(), what it took by `timer`): seconds, or on a GPU under "auto" the (start, end) CUDA
    events recorded around it, which seconds_of() reads."""
    cuda = on_gpu()
    if timer == "wall":
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = call()
        if cuda:
            torch.cuda.synchronize()
        return out, time.perf_counter() - start
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = call()
        end.record()
        return out, (start, end)
    start = time.thread_time()
    out = call()
    return out, time.thread_time() - start


def seconds_of(measures):
    """The seconds timed() measured, added up; CUDA events are waited for."""
    total = 0.0
    for measure in measures:
        if isinstance(measure, tuple):
            measure[1].synchronize()
            measure = measure[0].elapsed_time(measure[1]) / 1000.0
        total += measure
    return total


class RegionTimes:
    """The forward seconds of each top-level region of one step (remat.fit's planned steps), timed
    by `timer` as the regions run under the plan. A region whose time is not its compute alone (one
    the plan offloads: its copies to the host run inside it) is counted, not timed; so is every
    region after `stop()` (the step differs from the profiled one: its times are of no use)."""

    def __init__(self, timer):
        self.timer = timer
        self.clocks = set()  # the clocks read (clock_of): one where CUDA was not initialized midway
        self.stopped = False
        self._measures = {}  # region -> [what timed() measured, per call; None: not timed]

    def run(self, name, call, timing=True):
        if self.stopped or not timing:
            self._measures.setdefault(name, []).append(None)
            return call()
        self.clocks.add(clock_of(self.timer, on_gpu()))
        out, measure = timed(self.timer, call)
        self._measures.setdefault(name, []).append(measure)
        return out

    def stop(self):
        self.stopped = True

    def calls(self):
        """region -> the calls of it that ran."""
        return {name: len(measures) for name, measures in self._measures.items()}

    def seconds(self):
        """region -> its calls' seconds added up, for the regions whose every call was timed."""
        return {name: seconds_of(measures) for name, measures in self._measures.items()
                if all(measure is not None for measure in measures)}
