"""The plugin's Kernel view: per kernel name.

Calls, total/mean/min/max duration (µs), mean ``blocks per SM`` and mean est. achieved occupancy
(both weighted by kernel duration; a missing value counts as 0, as in the plugin), and whether the
kernel uses Tensor Cores (by name, see :mod:`~stepscope.analysis.trace.gpu_metrics`). Sorted by total
time, descending.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.analysis.trace.gpu_metrics import uses_tensor_cores
from stepscope.traces.links import KERNEL, EventLinks


@dataclass(frozen=True)
class KernelRow:
    """One GPU kernel (by name): its calls, its time and its launch configuration (blocks per SM, occupancy)."""

    name: str
    calls: int
    total_us: float
    mean_us: float
    min_us: float
    max_us: float
    blocks_per_sm: float
    occupancy_pct: float
    tensor_cores: bool


@dataclass(frozen=True)
class KernelTable:
    """Every GPU kernel of the trace, largest total time first, and their total."""

    rows: tuple[KernelRow, ...]
    total_us: float

    def to_dict(self, limit: int | None = None) -> dict[str, Any]:
        rows = self.rows if limit is None else self.rows[:limit]
        return {"count": len(self.rows), "total_us": self.total_us, "rows": [asdict(r) for r in rows]}


def kernel_table(links: EventLinks) -> KernelTable:
    events = links.events
    rows = links.rows(KERNEL)
    if not len(rows):
        return KernelTable((), 0.0)
    names = events.name[rows]
    dur = events.dur[rows]
    uniq, inverse = np.unique(names, return_inverse=True)
    g = len(uniq)
    calls = np.bincount(inverse, minlength=g)
    total = np.bincount(inverse, weights=dur, minlength=g)
    mins = np.full(g, np.inf)
    maxs = np.full(g, -np.inf)
    np.minimum.at(mins, inverse, dur)
    np.maximum.at(maxs, inverse, dur)
    bps = np.nan_to_num(events.blocks_per_sm[rows], nan=0.0)
    occ = np.nan_to_num(events.occupancy[rows], nan=0.0)
    w_bps = np.bincount(inverse, weights=bps * dur, minlength=g)
    w_occ = np.bincount(inverse, weights=occ * dur, minlength=g)
    out = []
    for gi in range(g):
        name = events.symbols.strings[uniq[gi]]
        weight = total[gi]
        out.append(
            KernelRow(
                name, int(calls[gi]), float(total[gi]), float(total[gi] / calls[gi]), float(mins[gi]), float(maxs[gi]),
                float(w_bps[gi] / weight) if weight > 0 else 0.0, float(w_occ[gi] / weight) if weight > 0 else 0.0,
                uses_tensor_cores(name),
            )
        )
    out.sort(key=lambda r: (-r.total_us, r.name))
    return KernelTable(tuple(out), float(dur.sum()))
