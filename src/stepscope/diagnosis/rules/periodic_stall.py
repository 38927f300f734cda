"""Periodic stalls: slow steps that recur every N steps, with their period and cost.

Algorithm (steady-state steps, warm-up and the FLOP-counted step excluded):

1. the baseline is the median step; a step is *slow* when it exceeds both
   :data:`STALL_FACTOR` × baseline and baseline + :data:`STALL_MIN_EXCESS_S`;
2. at least :data:`MIN_STALLS` slow steps, at most :data:`MAX_SLOW_SHARE` of the steps (otherwise
   the "stall" is the normal step);
3. the period is the most common gap between consecutive slow steps; at least
   :data:`REGULARITY` of the gaps must be within one step of it;
4. the cost is the time slow steps spend above the baseline over all steady time;
5. the phase that carries the excess names the likely cause: DataLoader start-up → workers
   restarted every epoch; ``other`` (outside forward/backward/optimizer) → checkpointing, logging,
   evaluation or garbage collection; ``forward`` → an evaluation loop; ``data_wait`` → a data source
   that refills every N batches.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common
from stepscope.record.run import PHASES

#: A slow step takes at least this multiple of the median step (Nsight's gpu_gaps and XProf's
#: step-time variance views flag outliers against the typical step; 2× is clearly not noise).
STALL_FACTOR = 2.0
#: …and at least this much longer than the median (ignores jitter on sub-millisecond steps).
STALL_MIN_EXCESS_S = 0.005
#: Fewer slow steps than this are not a pattern.
MIN_STALLS = 3
#: More slow steps than this share are the normal step, not a stall.
MAX_SLOW_SHARE = 0.4
#: Share of gaps between slow steps within ±1 of the period.
REGULARITY = 0.6
#: Stalls costing less than this share of the run are not reported (the severity scale's LOW).
MIN_COST = 0.01


def _excess_phase(steps, slow: np.ndarray, normal: np.ndarray) -> tuple[str, float]:
    """The phase (or ``loader_init``) carrying most of the slow steps' excess, and its share."""
    excess = {}
    for name in (*PHASES, "loader_init"):
        column = steps.phase(name) if name != "loader_init" else steps.loader_init_ns
        baseline = float(np.median(column[normal])) if normal.any() else 0.0
        excess[name] = float(np.clip(column[slow] - baseline, 0, None).sum())
    excess["data_wait"] = max(0.0, excess["data_wait"] - excess["loader_init"])
    total = sum(value for name, value in excess.items()) or 1.0
    phase = max(excess, key=excess.get)
    return phase, excess[phase] / total


_CAUSES = {
    "loader_init": ("DataLoader workers start again at every epoch",
                    [("DataLoader(persistent_workers=True)",
                      "keeps the workers (and their warmed-up state) across epochs",
                      "persistent_workers", False, True)]),
    "other": ("work outside forward/backward/optimizer (checkpointing, logging, evaluation, GC)",
              [("Save checkpoints asynchronously (torch.distributed.checkpoint.async_save, or a "
                "background thread writing a CPU copy of the state_dict), or less often", None, None, None, None),
               ("Log and evaluate less often, or move them off the training step's critical path",
                None, None, None, None)]),
    "forward": ("extra forward passes (an evaluation loop)",
                [("Evaluate less often or on a subset; run evaluation under torch.inference_mode()",
                  None, None, None, None)]),
    "data_wait": ("the data source refills every N batches (shard or buffer boundaries)",
                  [("Raise prefetch_factor / shuffle-buffer read-ahead so the refill overlaps compute",
                    None, None, None, None)]),
    "backward": ("periodically more expensive backward passes", []),
    "optimizer": ("periodically more expensive optimizer steps (e.g. gradient accumulation boundary, "
                  "scheduler or EMA work)", []),
}


def recurring_slow_steps(ctx) -> Finding | None:
    stats = ctx.stats
    steps = getattr(ctx.record, "steps", None)
    if stats is None or steps is None or stats.steady_count < MIN_STALLS * 2:
        return None
    index = np.flatnonzero(stats.mask)
    durations = steps.duration_ns[index].astype(np.float64)
    baseline = float(np.median(durations))
    limit = max(STALL_FACTOR * baseline, baseline + STALL_MIN_EXCESS_S * 1e9)
    slow_local = durations > limit
    count = int(slow_local.sum())
    if count < MIN_STALLS or count > MAX_SLOW_SHARE * len(durations):
        return None
    slow_index = index[slow_local]
    gaps = np.diff(slow_index)
    period, _ = Counter(gaps.tolist()).most_common(1)[0]
    regular = float(np.mean(np.abs(gaps - period) <= 1))
    if period < 2 or regular < REGULARITY:
        return None
    excess_s = float((durations[slow_local] - baseline).sum()) / 1e9
    cost = excess_s / (float(durations.sum()) / 1e9)
    if cost < MIN_COST:
        return None
    slow_mask = np.zeros(len(steps), dtype=bool)
    slow_mask[slow_index] = True
    phase, phase_share = _excess_phase(steps, slow_mask, stats.mask & ~slow_mask)
    cause, fixes = _CAUSES[phase]
    stall_s = excess_s / count
    evidence = [
        Evidence("period_steps", int(period), None, "steps", "steps", f"{count} slow steps"),
        Evidence("stall_s", round(stall_s, 4), round(limit / 1e9 - baseline / 1e9, 4), "steps", "s",
                 "mean excess of a slow step over the median step"),
        Evidence("stall_cost_share", round(cost, 4), MIN_COST, "steps", "ratio", "steady state"),
        Evidence("regularity", round(regular, 2), REGULARITY, "steps", "ratio", "gaps within ±1 of the period"),
        Evidence("stall_phase", phase, None, "steps", "phase", f"{phase_share:.0%} of the excess"),
    ]
    title = (f"Every {period} steps a step stalls for ~{common.ms(stall_s)} "
             f"({common.pct(cost)} of the run)")
    summary = (f"{count} steps take over {STALL_FACTOR:g}× the median step ({common.ms(baseline / 1e9)}), "
               f"every {period} steps; the extra time is in {phase.replace('_', ' ')}: likely {cause}.")
    prescriptions = [Prescription(action, why or f"a ~{common.ms(stall_s)} stall every {period} steps",
                                  setting, current, suggested)
                     for action, why, setting, current, suggested in fixes]
    return common.finding("periodic_stall.recurring_slow_steps", "periodic_stall", title, cost,
                          min(0.95, 0.5 + 0.45 * regular), evidence, prescriptions, summary,
                          period_steps=int(period), slow_steps=[int(i) for i in slow_index[:50]])
