"""The device's timeline of one rank: when the GPU was busy, with what, and why it idled — merged once.

Contract: :func:`timeline_of` returns the :class:`GpuTimeline` of a linked-events table (computed
on first use, kept with the table, None without GPU rows). Every view that needs the device's busy
or idle time reads it — HTA's temporal breakdown, the communication overlap, the kernel-type
breakdown, the idle causes, the trace evidence — instead of merging the same rows again.

Definitions (HTA's, over its GPU rows: ``stream != -1``, HTA-rounded times, all streams merged):

- ``busy`` — the union of all GPU rows; ``kinds[k]`` — the union of the rows of HTA kernel type
  ``k`` (COMPUTATION, COMMUNICATION, MEMORY, OTHER);
- ``kernel_time`` — end of the last busy interval − start of the first; ``idle`` — kernel time −
  |busy|; the *gaps* are the holes between busy intervals (they add up to ``idle``);
- each instant of a gap goes to the first of these host activities (any host thread) that covers
  it — the gap's cause (:meth:`GpuTimeline.gap_causes`):

  1. **dataloader** — inside a DataLoader range (the plugin's ``enumerate(DataLoader)#*.__next__``
     and ``enumerate(DataPipe)#*``, and stepscope's ``[stepscope]dataloader*`` annotations);
  2. **sync** — inside a synchronising runtime call (:data:`SYNC_CALLS`);
  3. **launch** — inside any other runtime call, or a host operator that issues device work (its
     ``External id`` is that of a runtime call launching a kernel, memcpy or memset);
  4. **other** — none of these (Python between operators, host-only operators, untraced time).

  The four partition the idle time exactly (each is what remains after the ones before it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from stepscope.traces import intervals
from stepscope.traces.links import (ANNOTATION, COMMUNICATION, COMPUTATION, MEMORY, OPERATOR, OTHER, PYTHON, RUNTIME,
                                    EventLinks, FloatArray, int_isin, is_dataloader)
from stepscope.traces.events import row_chunks
from stepscope.traces.spill import follow

SYNC_CALLS = (
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy",
)
CAUSES = ("dataloader", "sync", "launch", "other")
KINDS = (COMPUTATION, COMMUNICATION, MEMORY, OTHER)

Intervals = tuple[FloatArray, FloatArray]


@dataclass(frozen=True)
class GapCauses:
    """Device idle time (µs) by what the host was doing; the four parts add up to ``idle_us``."""

    idle_us: float
    dataloader_us: float
    sync_us: float
    launch_us: float
    other_us: float
    gaps: int


@dataclass(frozen=True)
class GpuTimeline:
    """The device's busy and idle time of one rank (see the module docstring)."""

    links: EventLinks
    busy: Intervals
    kinds: dict[int, Intervals]

    @property
    def start_us(self) -> float:
        return float(self.busy[0][0])

    @property
    def end_us(self) -> float:
        return float(self.busy[1][-1])

    @property
    def kernel_time_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def busy_us(self) -> float:
        return intervals.total(*self.busy)

    @property
    def idle_us(self) -> float:
        return self.kernel_time_us - self.busy_us

    def kind_us(self, kind: int) -> float:
        return intervals.total(*self.kinds[kind])

    @property
    def gaps(self) -> Intervals:
        starts, ends = self.busy
        gap_s, gap_e = ends[:-1], starts[1:]
        keep = gap_e > gap_s
        return gap_s[keep], gap_e[keep]

    @cached_property
    def gap_causes(self) -> GapCauses:
        """The idle time attributed to the host's activity (see the module docstring)."""
        gaps = self.gaps
        idle = intervals.total(*gaps)
        parts: dict[str, float] = {}
        remaining = gaps
        for cause, ranges in zip(CAUSES[:3], _host_ranges(self.links)):
            taken = intervals.intersect(remaining, ranges)
            parts[cause] = intervals.total(*taken)
            remaining = intervals.subtract(remaining, taken)
        parts["other"] = max(idle - parts["dataloader"] - parts["sync"] - parts["launch"], 0.0)
        return GapCauses(idle, parts["dataloader"], parts["sync"], parts["launch"], parts["other"],
                         int(len(gaps[0])))


def gpu_timeline(links: EventLinks) -> GpuTimeline | None:
    """The :class:`GpuTimeline` of one trace (None without GPU rows)."""
    rows = links.hta
    if not rows.gpu.any():
        return None
    spill = follow(links.events.ts)  # read by every view: on disk where the table is

    def merged(chosen: np.ndarray) -> Intervals:
        starts, ends = intervals.merge(rows.ts[chosen], rows.end[chosen])
        return spill(starts), spill(ends)

    busy = merged(rows.gpu)
    kinds = {kind: merged(rows.gpu & (rows.ktype == kind)) for kind in KINDS}
    return GpuTimeline(links, busy, kinds)


def timeline_of(links: EventLinks) -> GpuTimeline | None:
    """The :class:`GpuTimeline` of ``links``, computed on first use and kept with them."""
    if "_timeline" not in links.__dict__:
        links.__dict__["_timeline"] = gpu_timeline(links)
    timeline: GpuTimeline | None = links.__dict__["_timeline"]
    return timeline


def _host_ranges(links: EventLinks) -> tuple[Intervals, Intervals, Intervals]:
    events, role = links.events, links.role
    host = (role == OPERATOR) | (role == ANNOTATION) | (role == PYTHON)
    loader = host & links.name_is(is_dataloader)
    del host
    runtime = links.rows(RUNTIME)
    is_sync = links.name_is(lambda s: s in SYNC_CALLS, runtime)
    sync = runtime[is_sync]
    other_runtime = runtime[~is_sync]
    launching = links.launcher[links.launcher >= 0]
    issuing_ext = events.external_id[launching]
    del launching
    issuing_ext = np.sort(issuing_ext[issuing_ext > 0])
    # the operators that issue device work, a chunk of rows at a time (no whole column of operator rows)
    issuing = []
    for part in row_chunks(len(role)):
        ops = np.flatnonzero((role[part] == OPERATOR) & ~loader[part]) + part.start
        issuing.append(ops[int_isin(events.external_id[ops], issuing_ext, presorted=True)].astype(other_runtime.dtype))
    launch = np.concatenate((other_runtime, *issuing))
    del issuing, other_runtime, runtime
    loading = np.flatnonzero(loader)
    return (intervals.merge_rows(events.ts, events.dur, loading), intervals.merge_rows(events.ts, events.dur, sync),
            intervals.merge_rows(events.ts, events.dur, launch))


__all__ = ["CAUSES", "GapCauses", "GpuTimeline", "SYNC_CALLS", "gpu_timeline", "timeline_of"]
