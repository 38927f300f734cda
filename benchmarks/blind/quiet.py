"""Whether the machine was quiet while a blind evaluation ran: the CPU other processes used.

The evaluation times the machine (its ground truth is step times with and without each factor), so a
workload evaluated beside another busy process is not blind: seed 1417138115's first draw ran beside
unit tests, and its w003 read "other processes 94 %" where, drawn again quietly, it had no
bottleneck. :class:`OthersMeter` measures, over a span, the machine's busy CPU time less this
process's and every descendant it reaped (the runs, their DataLoader workers, a planted neighbour: the
launcher kills and reaps it), as cores; the evaluation marks each workload with it and says which
ran beside other load.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

#: Other processes' CPU (cores, averaged over a workload) from which its row is marked as run beside
#: other load. A quiet 2-core machine reads below 0.05.
CROWDED_CORES = 0.2


@dataclass(frozen=True)
class _Snapshot:
    wall_s: float
    busy_s: float  # the machine's CPU time spent not idle, all cores
    own_s: float  # this process's CPU time and its reaped descendants'


def _snapshot() -> _Snapshot:
    times = psutil.cpu_times()
    busy = times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0) \
        + getattr(times, "steal", 0.0)  # guest time is already inside user and nice
    own = os.times()
    return _Snapshot(time.monotonic(), busy, own.user + own.system + own.children_user + own.children_system)


class OthersMeter:
    """Started on construction; :meth:`cores` reads the other processes' mean cores since then."""

    def __init__(self) -> None:
        self._start = _snapshot()

    def cores(self) -> float:
        end = _snapshot()
        span = end.wall_s - self._start.wall_s
        if span <= 0:
            return 0.0
        others = (end.busy_s - self._start.busy_s) - (end.own_s - self._start.own_s)
        return max(0.0, others / span)


def others_now(seconds: float = 2.0) -> float:
    """The other processes' mean cores over the next ``seconds`` (this process idle meanwhile)."""
    meter = OthersMeter()
    time.sleep(seconds)
    return meter.cores()
