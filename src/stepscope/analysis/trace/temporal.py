"""HTA temporal breakdown and communication/computation overlap for one rank.

Definitions (HTA ``BreakdownAnalysis.get_temporal_breakdown`` and
``CommunicationAnalysis.get_comm_comp_overlap``), over the GPU rows (``stream != -1``) of
:func:`~stepscope.analysis.trace.hta_frame.hta_rows`, all streams together:

- ``kernel_time`` = end of the last merged busy interval - start of the first;
- ``idle`` = kernel_time - |union of all GPU rows|;
- ``compute`` = |union of COMPUTATION rows|; ``non_compute`` = kernel_time - compute - idle
  (time when only communication, memory, sync or other GPU rows run);
- ``comm_overlap`` = |union(COMPUTATION) ∩ union(COMMUNICATION)| / |union(COMMUNICATION)|, the
  share of communication hidden under computation; ``None`` without communication kernels
  (HTA returns NaN there).

Results are ``None`` for traces without GPU rows (HTA raises on those). The unions are the rank's
:class:`~stepscope.traces.timeline.GpuTimeline`'s, merged once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from stepscope.traces import intervals
from stepscope.traces.links import COMMUNICATION, COMPUTATION
from stepscope.traces.timeline import GpuTimeline


@dataclass(frozen=True)
class TemporalBreakdown:
    """One rank's GPU time split into idle, compute and non-compute (HTA's temporal breakdown)."""

    rank: int
    idle_us: float
    compute_us: float
    non_compute_us: float
    kernel_time_us: float

    @property
    def idle_share(self) -> float:
        return self.idle_us / self.kernel_time_us if self.kernel_time_us else 0.0

    @property
    def compute_share(self) -> float:
        return self.compute_us / self.kernel_time_us if self.kernel_time_us else 0.0

    @property
    def non_compute_share(self) -> float:
        return self.non_compute_us / self.kernel_time_us if self.kernel_time_us else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(idle_share=self.idle_share, compute_share=self.compute_share, non_compute_share=self.non_compute_share)
        return out


def temporal_breakdown(timeline: GpuTimeline | None, rank: int) -> TemporalBreakdown | None:
    if timeline is None:
        return None
    kernel_time = timeline.kernel_time_us
    idle = timeline.idle_us
    compute = timeline.kind_us(COMPUTATION)
    return TemporalBreakdown(rank, idle, compute, kernel_time - compute - idle, kernel_time)


@dataclass(frozen=True)
class CommOverlap:
    """One rank's communication kernel time and the part of it that overlapped computation."""

    rank: int
    communication_us: float
    overlapped_us: float

    @property
    def overlap_share(self) -> float | None:
        return self.overlapped_us / self.communication_us if self.communication_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "overlap_share": self.overlap_share}


def comm_overlap(timeline: GpuTimeline | None, rank: int) -> CommOverlap:
    if timeline is None:
        return CommOverlap(rank, 0.0, 0.0)
    comm = timeline.kinds[COMMUNICATION]
    both = intervals.intersect(timeline.kinds[COMPUTATION], comm)
    return CommOverlap(rank, intervals.total(*comm), intervals.total(*both))
