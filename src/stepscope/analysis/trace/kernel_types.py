"""HTA kernel-type breakdown: how long each combination of kernel types runs at once.

Definition (HTA ``BreakdownAnalysis._get_gpu_kernel_type_time``): per rank, the GPU rows
(``stream != -1``) of each analysed type — COMPUTATION, COMMUNICATION, MEMORY — are merged into
intervals; a sweep measures the time each non-empty set of types is active together, labelled
like ``"COMPUTATION overlapping COMMUNICATION"``. OTHER rows (syncs) are not counted. Sums are
added over ranks and ``share`` is each label's part of the grand sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepscope.traces import intervals
from stepscope.traces.links import COMMUNICATION, COMPUTATION, MEMORY
from stepscope.traces.timeline import GpuTimeline

_ORDER = ((COMPUTATION, "COMPUTATION"), (COMMUNICATION, "COMMUNICATION"), (MEMORY, "MEMORY"))


@dataclass(frozen=True)
class KernelTypeRow:
    """One kind of GPU kernel (computation, communication, memory, …) and its share of kernel time."""

    kernel_type: str
    sum_us: float
    share: float


@dataclass(frozen=True)
class KernelTypeBreakdown:
    """GPU kernel time by kind of kernel, over every rank (HTA's kernel-type breakdown)."""

    rows: tuple[KernelTypeRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.__dict__ for r in self.rows]}

    def share_of(self, label: str) -> float | None:
        for row in self.rows:
            if row.kernel_type == label:
                return row.share
        return None


def kernel_type_sums(timeline: GpuTimeline | None) -> dict[str, float]:
    """Label -> µs for one rank (its timeline's unions per kernel type)."""
    if timeline is None:
        return {}
    lists = [timeline.kinds[kind] for kind, _ in _ORDER]
    by_mask = intervals.sweep_labels(lists)
    out: dict[str, float] = {}
    for mask, duration in by_mask.items():
        label = " overlapping ".join(name for bit, (_, name) in enumerate(_ORDER) if mask & (1 << bit))
        out[label] = out.get(label, 0.0) + duration
    return out


def kernel_type_breakdown(per_rank: list[dict[str, float]]) -> KernelTypeBreakdown:
    totals: dict[str, float] = {}
    for sums in per_rank:
        for label, value in sums.items():
            totals[label] = totals.get(label, 0.0) + value
    grand = sum(totals.values())
    ordered = sorted(totals.items(), key=lambda item: -item[1])
    return KernelTypeBreakdown(
        tuple(KernelTypeRow(label, value, value / grand if grand else 0.0) for label, value in ordered)
    )
