"""Stragglers: one rank is slower than the others, and every collective waits for it.

Evidence: per-rank steady-state means of data wait and forward time (``ev.ranks``, one record per
rank). Backward time is deliberately not used: DDP's all-reduce equalises it across ranks, which
hides a backward straggler (TraceML issue #252). The skew score of a phase is
``(slowest − median) / median``; TraceML warns at 0.10 and calls 0.20 critical.
"""

from __future__ import annotations

import numpy as np

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: TraceML's straggler score warning level.
SKEW_WARN = 0.10
#: TraceML's straggler score critical level.
SKEW_CRITICAL = 0.20
#: Phases compared across ranks (not backward, see the module docstring).
STRAGGLER_PHASES = ("data_wait", "forward")


def slow_rank(ev: RunEvidence) -> Finding | None:
    if len(ev.ranks) < 2:
        return None
    per_rank = [(item.rank, item.steady) for item in ev.ranks]
    best = None
    for phase in STRAGGLER_PHASES:
        seconds = np.array([stats.shares[phase] * stats.step_time_mean_s for _, stats in per_rank])
        median = float(np.median(seconds))
        slowest = int(np.argmax(seconds))
        if median <= 0:
            continue
        skew = (float(seconds[slowest]) - median) / median
        if best is None or skew > best[0]:
            best = (skew, phase, slowest, float(seconds[slowest]) - median)
    if best is None or best[0] < SKEW_WARN:
        return None
    skew, phase, index, lost_s = best
    rank, stats = per_rank[index]
    step = max(stats.step_time_mean_s for _, stats in per_rank)
    impact = lost_s / step if step > 0 else 0.0
    fixes = {"data_wait": Prescription(f"Rank {rank}'s input is slower: check its node's CPU load, "
                                       "storage and num_workers; balance shards across ranks",
                                       f"{phase} {skew:.0%} above the median rank"),
             "forward": Prescription(f"Rank {rank} computes slower: check for a throttled or shared GPU "
                                     "(stepscope gpu-procs), uneven batch shapes, or a slower node",
                                     f"{phase} {skew:.0%} above the median rank")}
    return common.finding("straggler.slow_rank", "straggler",
                          f"Rank {rank} straggles: its {phase.replace('_', ' ')} is {skew:.0%} above the "
                          "median rank", impact, 0.7 if skew >= SKEW_CRITICAL else 0.55,
                          [Evidence("straggler_score", round(skew, 3), SKEW_WARN, "ranks", "ratio",
                                    f"rank {rank}, {phase}"),
                           Evidence("lost_s_per_step", round(lost_s, 5), None, "ranks", "s",
                                    "slowest minus median rank")],
                          [fixes[phase]], "Every collective waits for the slowest rank.", rank=rank)
