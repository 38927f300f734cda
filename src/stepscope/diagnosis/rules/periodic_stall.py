"""Periodic stalls: slow steps that recur every N steps, with their period and cost.

Algorithm (steady-state steps; warm-up and the FLOP-counted step excluded), per phase column
(``data_wait`` less worker start-up, ``loader_init``, ``forward``, ``backward``, ``optimizer``,
``other``) — a stall shows in the phase that stalls, far more crisply than in noisy step totals:

1. the phase's baseline is its median; a step *stalls* in it when the phase exceeds both
   :data:`STALL_FACTOR` × baseline and baseline + :data:`STALL_MIN_EXCESS_S`, and the excess is at
   least :data:`STALL_MIN_STEP_SHARE` of the median step;
2. at least :data:`MIN_STALLS` stalls, in at most :data:`MAX_SLOW_SHARE` of the steps (otherwise
   the "stall" is the normal step);
3. the period is the most common gap between consecutive stalls; at least :data:`REGULARITY` of
   the gaps must be within one step of it, and at least :data:`COVERAGE` of the stalls the period
   predicts over the steady state must be there (a few aligned noise spikes are not a period);
4. the cost is the stalls' excess over the baseline divided by all steady time;
5. the phase with the costliest periodic stall wins and names the likely cause: DataLoader
   start-up → workers restarted every epoch; ``other`` (outside forward/backward/optimizer) →
   checkpointing, logging, evaluation or garbage collection; ``forward`` → an evaluation loop;
   ``data_wait`` → a data source that refills every N batches. A data-wait period up to
   ``num_workers`` is skipped: workers deliver batches in turn (or in bursts), so a starved
   pipeline waits every few batches — the input pipeline's pattern, reported by its own rules.
"""

from __future__ import annotations

from collections import Counter

from typing import Any

import numpy as np

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common
from stepscope.record.run import PHASES, StepTable

#: A slow step takes at least this multiple of the median step (Nsight's gpu_gaps and XProf's
#: step-time variance views flag outliers against the typical step; 2× is clearly not noise).
STALL_FACTOR = 2.0
#: …and at least this much longer than the median (ignores jitter on sub-millisecond steps).
STALL_MIN_EXCESS_S = 0.005
#: …and the excess is at least this share of the median step (a stall is felt in the step).
STALL_MIN_STEP_SHARE = 0.1
#: Fewer slow steps than this are not a pattern.
MIN_STALLS = 3
#: More slow steps than this share are the normal step, not a stall.
MAX_SLOW_SHARE = 0.4
#: Share of gaps between slow steps within ±1 of the period.
REGULARITY = 0.6
#: Share of the stalls a period predicts over the steady state that must be observed.
COVERAGE = 0.5
#: Stalls costing less than this share of the run are not reported (the severity scale's LOW).
MIN_COST = 0.01


def phase_columns(steps: StepTable, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Steady-state phase columns in seconds, worker start-up split out of data wait."""
    columns = {name: steps.phase(name)[mask] / 1e9 for name in PHASES}
    columns["loader_init"] = steps.loader_init_ns[mask] / 1e9
    columns["data_wait"] = columns["data_wait"] - columns["loader_init"]
    return columns


def periodic_stall(values: np.ndarray, step_s: float) -> dict[str, Any] | None:
    """The periodic stall in one phase column (seconds), or None (see the module docstring)."""
    baseline = float(np.median(values))
    limit = max(STALL_FACTOR * baseline, baseline + STALL_MIN_EXCESS_S,
                baseline + STALL_MIN_STEP_SHARE * step_s)
    slow = np.flatnonzero(values > limit)
    if len(slow) < MIN_STALLS or len(slow) > MAX_SLOW_SHARE * len(values):
        return None
    gaps = np.diff(slow)
    period, _ = Counter(gaps.tolist()).most_common(1)[0]
    regular = float(np.mean(np.abs(gaps - period) <= 1))
    if period < 2 or regular < REGULARITY or len(slow) < COVERAGE * len(values) / period:
        return None
    excess = float((values[slow] - baseline).sum())
    return {"slow": slow, "period": int(period), "regular": regular, "excess_s": excess,
            "baseline_s": baseline, "limit_s": limit}


#: phase -> (likely cause, prescriptions as (action, why, setting, current, suggested))
_CAUSES: dict[str, tuple[str, list[tuple[str, str | None, str | None, Any, Any]]]] = {
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


def recurring_slow_steps(ev: RunEvidence) -> Finding | None:
    stats = ev.steady
    steps = getattr(ev.record, "steps", None)
    if stats is None or steps is None or stats.steady_count < MIN_STALLS * 2:
        return None
    index = np.flatnonzero(stats.mask)
    total_s = float(steps.duration_ns[index].sum()) / 1e9
    loader = ev.main_loader
    round_robin = loader.num_workers if loader is not None and loader.num_workers > 1 else None
    found = {}
    for phase, values in phase_columns(steps, stats.mask).items():
        stall = periodic_stall(values, stats.step_time_s)
        if stall is None or (phase == "data_wait" and round_robin and stall["period"] <= round_robin):
            continue  # workers deliver in turn/bursts: the input pipeline's pattern, not a stall
        found[phase] = stall
    if not found or total_s <= 0:
        return None
    phase = max(found, key=lambda name: found[name]["excess_s"])
    stall = found[phase]
    period, regular, count = stall["period"], stall["regular"], len(stall["slow"])
    cost = stall["excess_s"] / total_s
    if cost < MIN_COST:
        return None
    slow_index = index[stall["slow"]]
    cause, fixes = _CAUSES[phase]
    stall_s = stall["excess_s"] / count
    evidence = [
        Evidence("period_steps", int(period), None, "steps", "steps", f"{count} slow steps"),
        Evidence("stall_s", round(stall_s, 4), round(stall["limit_s"] - stall["baseline_s"], 4), "steps", "s",
                 f"mean excess of {phase} over its median"),
        Evidence("stall_cost_share", round(cost, 4), MIN_COST, "steps", "ratio", "steady state"),
        Evidence("regularity", round(regular, 2), REGULARITY, "steps", "ratio", "gaps within ±1 of the period"),
        Evidence("stall_phase", phase, None, "steps", "phase", "the phase that stalls"),
    ]
    title = (f"Every {period} steps a step stalls for ~{common.ms(stall_s)} "
             f"({common.pct(cost)} of the run)")
    summary = (f"Every {period} steps, {phase.replace('_', ' ')} takes ~{common.ms(stall_s)} longer than usual "
               f"({count} times; the median step is {common.ms(stats.step_time_s)}): likely {cause}.")
    prescriptions = [Prescription(action, why or f"a ~{common.ms(stall_s)} stall every {period} steps",
                                  setting, current, suggested)
                     for action, why, setting, current, suggested in fixes]
    return common.finding("periodic_stall.recurring_slow_steps", "periodic_stall", title, cost,
                          min(0.95, 0.5 + 0.45 * regular), evidence, prescriptions, summary,
                          period_steps=int(period), slow_steps=[int(i) for i in slow_index[:50]])
