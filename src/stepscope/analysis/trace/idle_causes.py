"""Device idle time attributed to what the host was doing meanwhile.

Definition: the idle gaps are those of HTA's temporal breakdown — the holes in the union of all
GPU rows (``stream != -1``, HTA-rounded times, all streams merged) between the first and the last
GPU activity — so the gaps add up to its ``idle_us``. Each instant of a gap goes to the first of
these host activities (any host thread) that covers it:

1. **dataloader** — inside a DataLoader range: the plugin's DataLoader category
   (``enumerate(DataLoader)#*.__next__``, ``enumerate(DataPipe)#*``) and stepscope's
   ``[stepscope]dataloader*`` annotations: the device waits for the next batch;
2. **sync** — inside a synchronising runtime call (:data:`SYNC_CALLS`: device/stream/event
   synchronize, synchronous ``cudaMemcpy``): the host blocks on the device;
3. **launch** — inside any other runtime call, or inside a host operator that issues device work
   (an operator whose ``External id`` is that of a runtime call launching a kernel, memcpy or
   memset): launch overhead, the device waits for the host to submit work;
4. **other** — none of these (Python between operators, host-only operators, untraced time).

The four parts partition the idle time exactly (each is what remains after the ones before it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.analysis.trace import intervals
from stepscope.analysis.trace.step_breakdown import is_plugin_dataloader
from stepscope.traces.links import ANNOTATION, OPERATOR, PYTHON, RUNTIME, EventLinks, FloatArray, int_isin

SYNC_CALLS = (
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy",
)
STEPSCOPE_DATALOADER_PREFIX = "[stepscope]dataloader"
CAUSES = ("dataloader", "sync", "launch", "other")

Intervals = tuple[FloatArray, FloatArray]


@dataclass(frozen=True)
class IdleCauses:
    """Device idle time (µs) by host activity; the four parts add up to ``idle_us``."""

    idle_us: float
    kernel_time_us: float
    dataloader_us: float
    sync_us: float
    launch_us: float
    other_us: float
    gaps: int

    def share(self, cause: str) -> float | None:
        """The cause's idle time as a share of ``kernel_time`` (like HTA's idle share)."""
        return getattr(self, f"{cause}_us") / self.kernel_time_us if self.kernel_time_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update({f"{c}_share": self.share(c) for c in CAUSES})
        return out


def is_dataloader(name: str) -> bool:
    return is_plugin_dataloader(name) or name.startswith(STEPSCOPE_DATALOADER_PREFIX)


def idle_gaps(links: EventLinks) -> Intervals | None:
    """The holes between merged GPU busy intervals (HTA times); None without GPU rows."""
    rows = links.hta
    if not rows.gpu.any():
        return None
    starts, ends = intervals.merge(rows.ts[rows.gpu], rows.end[rows.gpu])
    gap_s, gap_e = ends[:-1], starts[1:]
    keep = gap_e > gap_s
    return gap_s[keep], gap_e[keep]


def _host_ranges(links: EventLinks) -> tuple[Intervals, Intervals, Intervals]:
    events, role = links.events, links.role
    ts, end = events.ts, events.ts + events.dur
    host = (role == OPERATOR) | (role == ANNOTATION) | (role == PYTHON)
    loader = host & links.name_is(is_dataloader)
    runtime = links.rows(RUNTIME)
    is_sync = links.name_is(lambda s: s in SYNC_CALLS, runtime)
    sync = runtime[is_sync]
    other_runtime = runtime[~is_sync]
    launching = links.launcher[links.launcher >= 0]
    issuing_ext = events.external_id[launching]
    issuing_ext = issuing_ext[issuing_ext > 0]
    ops = np.flatnonzero((role == OPERATOR) & ~loader)
    issuing = ops[int_isin(events.external_id[ops], issuing_ext)]
    launch = np.concatenate((other_runtime, issuing))
    return (
        intervals.merge(ts[loader], end[loader]),
        intervals.merge(ts[sync], end[sync]),
        intervals.merge(ts[launch], end[launch]),
    )


def idle_causes(links: EventLinks) -> IdleCauses | None:
    """Attribute the device idle time of one rank (see the module docstring); None without GPU rows."""
    gaps = idle_gaps(links)
    if gaps is None:
        return None
    rows = links.hta
    busy_s = rows.ts[rows.gpu]
    busy_e = rows.end[rows.gpu]
    kernel_time = float(busy_e.max() - busy_s.min())
    idle = intervals.total(*gaps)
    parts: dict[str, float] = {}
    remaining = gaps
    for cause, ranges in zip(CAUSES[:3], _host_ranges(links)):
        taken = intervals.intersect(remaining, ranges)
        parts[cause] = intervals.total(*taken)
        remaining = intervals.subtract(remaining, taken)
    parts["other"] = max(idle - parts["dataloader"] - parts["sync"] - parts["launch"], 0.0)
    return IdleCauses(
        idle_us=idle, kernel_time_us=kernel_time, dataloader_us=parts["dataloader"], sync_us=parts["sync"],
        launch_us=parts["launch"], other_us=parts["other"], gaps=int(len(gaps[0])),
    )
