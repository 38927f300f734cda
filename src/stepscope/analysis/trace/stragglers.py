"""Per-rank comparison and straggler candidates.

For each rank: mean step time (plugin Overview), HTA idle/compute shares, communication share of
GPU time. Straggler rule (HTA's ``find_stragglers_with_late_start_comm_kernels``, with the
kernel-name test widened to every COMMUNICATION kernel so ``ncclDevKernel_*`` counts): per rank
and per step, take the start of the first communication kernel relative to the step start; a rank
whose collectives start late is where the others wait. For each step, ranks whose relative start
exceeds the median by more than ``STRAGGLER_GAP`` of the mean step time are flagged; the ranks
flagged in the most steps (at most ``num_candidates``) are the candidates. With one rank, or
without communication kernels, there are no candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.traces import intervals

STRAGGLER_GAP = 0.05


@dataclass(frozen=True)
class RankSummary:
    """One rank's step time, idle and compute shares, for the comparison across ranks."""

    rank: int
    step_time_us: float | None
    idle_share: float | None
    compute_share: float | None
    comm_start_offsets_us: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class RankComparison:
    """The ranks side by side and the stragglers among them."""

    ranks: tuple[RankSummary, ...]
    stragglers: tuple[int, ...]
    flagged_steps: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": [r.__dict__ for r in self.ranks],
            "stragglers": list(self.stragglers),
            "flagged_steps": {str(k): v for k, v in self.flagged_steps.items()},
        }


def compare_ranks(summaries: list[RankSummary], num_candidates: int = 2) -> RankComparison:
    if len(summaries) < 2:
        return RankComparison(tuple(summaries), ())
    n_steps = min(len(s.comm_start_offsets_us) for s in summaries)
    step_times = [s.step_time_us for s in summaries if s.step_time_us]
    mean_step = float(np.mean(step_times)) if step_times else 0.0
    flagged: dict[int, int] = {}
    for step in range(n_steps):
        values = [(s.rank, offset) for s in summaries if (offset := s.comm_start_offsets_us[step]) is not None]
        if len(values) < 2 or mean_step <= 0:
            continue
        median = intervals.median(np.array([v for _, v in values]))
        for rank, value in values:
            if value - median > STRAGGLER_GAP * mean_step:
                flagged[rank] = flagged.get(rank, 0) + 1
    ranked = sorted(flagged.items(), key=lambda item: (-item[1], item[0]))[:num_candidates]
    return RankComparison(tuple(summaries), tuple(rank for rank, _ in ranked), flagged)
