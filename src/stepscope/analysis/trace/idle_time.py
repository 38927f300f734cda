"""HTA idle-time breakdown per GPU stream: host wait, kernel wait, other.

Definition (HTA ``BreakdownAnalysis.get_idle_time_breakdown``): rows with ``stream != -1`` and
``cat`` in {kernel, Kernel, gpu_memcpy, Memcpy, gpu_memset, Memset, mtia_ccp_events}; per stream,
sorted by start time, ``gap = ts - previous row's end`` (the previous row, not a running max, so
a gap can be negative; the first row has none). A gap is

- **host_wait** when the correlated CPU launch started after the previous row ended
  (``ts_runtime > prev_end``: the CPU was late);
- else **kernel_wait** when ``gap < 30 µs`` (``consecutive_kernel_delay``, back-to-back launch
  latency);
- else **other**.

Rows without a correlated CPU row cannot be host_wait; the correlated row is HTA's link in the
linked-events table (``HtaRows.cpu_link``: the first kept host row with that correlation).
``ratio`` is per stream. The rank-level
totals add the streams (which is *not* the temporal breakdown's idle time of merged streams).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.traces import intervals
from stepscope.traces.links import BoolArray, EventLinks, FloatArray, HtaRows, unique_ints

CONSECUTIVE_KERNEL_DELAY_US = 30.0
CATEGORIES = ("host_wait", "kernel_wait", "other")
_IDLE_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")


@dataclass(frozen=True)
class StreamIdle:
    """One CUDA stream's idle time, split by cause (waiting for the host, between kernels, other)."""

    stream: int
    idle_us: dict[str, float]  # category -> µs
    ratio: dict[str, float | None]
    interval_stats: dict[str, dict[str, float | None]]  # category -> count/mean/std/min/p25/p50/p75/max


@dataclass(frozen=True)
class IdleTimeBreakdown:
    """The GPU's idle time on each stream of one rank, split by cause (HTA's idle-time breakdown)."""

    rank: int
    streams: tuple[StreamIdle, ...]

    def totals(self) -> dict[str, float]:
        return {c: sum(s.idle_us[c] for s in self.streams) for c in CATEGORIES}

    def shares(self) -> dict[str, float] | None:
        """Each category's part of the idle time summed over streams; None without idle time."""
        totals = self.totals()
        all_idle = sum(totals.values())
        return {k: v / all_idle for k, v in totals.items()} if all_idle > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "totals_us": self.totals(),
            "shares": self.shares(),
            "streams": [asdict(s) for s in self.streams],
        }


def _describe(values: FloatArray) -> dict[str, float | None]:
    if len(values) == 0:
        return {"count": 0, "mean": None, "std": None, "min": None, "p25": None, "p50": None, "p75": None, "max": None}
    q = intervals.quantiles(values, [0.25, 0.5, 0.75])
    return {
        "count": int(len(values)),
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)) if len(values) > 1 else None,
        "min": float(values.min()),
        "p25": float(q[0]),
        "p50": float(q[1]),
        "p75": float(q[2]),
        "max": float(values.max()),
    }


def runtime_ts_for_gpu_rows(rows: HtaRows, gpu_sel: BoolArray) -> FloatArray:
    """Start (rounded) of the host row linked to each selected GPU row (HTA's correlation link), NaN if none."""
    link = rows.cpu_link[gpu_sel]
    out = np.full(len(link), np.nan)
    found = link >= 0
    out[found] = rows.ts[link[found]]
    return out


def idle_time_breakdown(links: EventLinks, rank: int) -> IdleTimeBreakdown:
    events, rows = links.events, links.hta
    cats = events.cat_mask(*_IDLE_CATS)[rows.index]
    sel = rows.gpu & cats
    ts_runtime = runtime_ts_for_gpu_rows(rows, sel)
    stream = events.stream[rows.index[sel]]
    ts, end = rows.ts[sel], rows.end[sel]
    out = []
    for value in unique_ints(stream).tolist():
        pick = np.flatnonzero(stream == value)
        order = pick[np.argsort(ts[pick], kind="stable")]
        del pick
        prev_end = np.empty(len(order))  # each row's predecessor's end on the stream (NaN for the first)
        prev_end[0] = np.nan
        prev_end[1:] = end[order[:-1]]
        gap = ts[order]
        gap -= prev_end
        with np.errstate(invalid="ignore"):
            host = ts_runtime[order] > prev_end
            kernel = ~host & (gap < CONSECUTIVE_KERNEL_DELAY_US)
        del order, prev_end
        other = ~host & ~kernel
        valid = ~np.isnan(gap)
        idle, stats = {}, {}
        for name, mask in zip(CATEGORIES, (host, kernel, other)):
            values = gap[mask & valid]
            idle[name] = float(values.sum())
            stats[name] = _describe(values)
        total = sum(idle.values())
        ratio = {k: (v / total if total else None) for k, v in idle.items()}  # 0/0: no idle time
        out.append(StreamIdle(int(value), idle, ratio, stats))
    return IdleTimeBreakdown(rank, tuple(out))
