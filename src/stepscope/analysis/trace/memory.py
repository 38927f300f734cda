"""Memory view from ``[memory]`` allocator instants (``profile_memory=True``).

Per device (``Device Type``/``Device Id``: 0 = CPU, 1 = CUDA): the allocated and reserved curves
(``Total Allocated`` / ``Total Reserved`` after each event, in bytes; traces that predate those
args get the running sum of ``Bytes``), down-sampled to at most
``max_points`` points by keeping, per time bucket, the point with the highest allocation (so the
peak always survives); the peak allocation and when it happened (µs from the trace's first
event). Top allocating operators: each allocation (``Bytes > 0``) is charged to the innermost
host operator on the same thread whose span contains it; rows give count and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.analysis.trace.op_tree import OpTree
from stepscope.traces.events import EventTable, MemoryTable
from stepscope.traces.links import unique_ints

DEVICE_TYPES = {0: "CPU", 1: "CUDA"}


@dataclass(frozen=True)
class DeviceMemory:
    """One device's allocator events: its peak allocated (and reserved) memory and the curve to it."""

    device: str  # "CUDA:0", "CPU"
    events: int
    peak_allocated_bytes: float
    peak_at_us: float
    peak_reserved_bytes: float | None
    curve_ts_us: tuple[float, ...]
    curve_allocated_bytes: tuple[float, ...]
    curve_reserved_bytes: tuple[float | None, ...]


@dataclass(frozen=True)
class AllocatingOperator:
    """An operator that allocates device memory: how often and how much."""

    name: str
    allocations: int
    allocated_bytes: float


@dataclass(frozen=True)
class MemoryView:
    """The trace's memory view: each device's curve and peak, and the operators that allocate most."""

    devices: tuple[DeviceMemory, ...]
    top_operators: tuple[AllocatingOperator, ...]

    def peak_bytes(self, kind: str = "CUDA") -> float | None:
        peaks = [d.peak_allocated_bytes for d in self.devices if d.device.startswith(kind)]
        return max(peaks) if peaks else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": [d.__dict__ for d in self.devices],
            "top_operators": [o.__dict__ for o in self.top_operators],
        }


def _downsample(ts: np.ndarray, values: np.ndarray, max_points: int) -> np.ndarray:
    if len(ts) <= max_points:
        return np.arange(len(ts))
    edges = np.linspace(ts[0], ts[-1], max_points + 1)
    bucket = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, max_points - 1)
    order = np.lexsort((-values, bucket))
    first = np.ones(len(order), dtype=bool)
    first[1:] = bucket[order][1:] != bucket[order][:-1]
    return np.sort(order[first])


def memory_view(
    events: EventTable, memory: MemoryTable, tree: OpTree, origin_us: float, max_points: int = 1000, top: int = 20
) -> MemoryView:
    devices = []
    if len(memory):
        order = np.argsort(memory.ts, kind="stable")
        dev_type, dev_id = memory.device_type[order], memory.device_id[order]
        by_device = np.lexsort((dev_id, dev_type))
        first = np.ones(len(by_device), dtype=bool)
        first[1:] = (np.diff(dev_type[by_device]) != 0) | (np.diff(dev_id[by_device]) != 0)
        pairs = zip(dev_type[by_device][first].tolist(), dev_id[by_device][first].tolist())
        for dtype, did in pairs:
            sel = order[(dev_type == dtype) & (dev_id == did)]
            alloc = memory.total_allocated[sel]
            if not np.isfinite(alloc).any():  # 2021 traces: no running totals, add up the deltas
                alloc = np.cumsum(np.nan_to_num(memory.nbytes[sel], nan=0.0))
            ts = memory.ts[sel] - origin_us
            reserved = memory.total_reserved[sel]
            alloc_filled = np.nan_to_num(alloc, nan=0.0)
            peak = int(np.argmax(alloc_filled))
            keep = _downsample(ts, alloc_filled, max_points)
            label = DEVICE_TYPES.get(dtype, f"type{dtype}")
            name = label if dtype == 0 else f"{label}:{did}"
            devices.append(
                DeviceMemory(
                    device=name,
                    events=int(len(sel)),
                    peak_allocated_bytes=float(alloc_filled[peak]),
                    peak_at_us=float(ts[peak]),
                    peak_reserved_bytes=float(np.nanmax(reserved)) if np.isfinite(reserved).any() else None,
                    curve_ts_us=tuple(ts[keep].tolist()),
                    curve_allocated_bytes=tuple(alloc_filled[keep].tolist()),
                    curve_reserved_bytes=tuple(None if np.isnan(v) else float(v) for v in reserved[keep]),
                )
            )
    return MemoryView(tuple(devices), _top_allocators(events, memory, tree, top))


def _top_allocators(events: EventTable, memory: MemoryTable, tree: OpTree, top: int) -> tuple[AllocatingOperator, ...]:
    alloc = np.flatnonzero(memory.nbytes > 0)
    if not len(alloc) or not len(tree.rows):
        return ()
    rows = tree.rows[tree.kept]
    parent_pos = tree.parent
    kept_pos = np.flatnonzero(tree.kept)
    tids = events.tid[rows]
    where = np.full(len(tree.rows), -1, dtype=np.int64)
    found_names, found_bytes = [], []
    for tid in unique_ints(memory.tid[alloc]).tolist():
        mine = kept_pos[tids == tid]
        if not len(mine):
            continue
        starts = events.ts[tree.rows[mine]]
        order = np.argsort(starts, kind="stable")
        mine, starts = mine[order], starts[order]
        ends = starts + events.dur[tree.rows[mine]]
        where[mine] = np.arange(len(mine))
        pick = alloc[memory.tid[alloc] == tid]
        at = memory.ts[pick]
        idx = np.searchsorted(starts, at, side="right") - 1
        while True:  # climb to the innermost op that still contains the allocation
            climb = np.flatnonzero(idx >= 0)
            climb = climb[ends[idx[climb]] < at[climb]]
            if not len(climb):
                break
            up = parent_pos[mine[idx[climb]]]
            idx[climb] = np.where(up >= 0, where[np.maximum(up, 0)], -1)
        where[mine] = -1
        hit = idx >= 0
        found_names.append(events.name[tree.rows[mine[idx[hit]]]].astype(np.int64))
        found_bytes.append(memory.nbytes[pick][hit])
    if not found_names:
        return ()
    names = np.concatenate(found_names)
    nbytes = np.concatenate(found_bytes)
    if not len(names):
        return ()
    # per operator name: count and bytes; ties keep the order of first appearance
    uniq, first, inverse = np.unique(names, return_index=True, return_inverse=True)
    count = np.bincount(inverse, minlength=len(uniq))
    total = np.bincount(inverse, weights=nbytes, minlength=len(uniq))
    counts = {int(uniq[g]): (int(count[g]), float(total[g])) for g in np.argsort(first, kind="stable").tolist()}
    ranked = sorted(counts.items(), key=lambda item: -item[1][1])[:top]
    return tuple(AllocatingOperator(events.symbols.strings[k], int(v[0]), float(v[1])) for k, v in ranked)
