"""Periodic stalls: slow steps that recur every N steps, with their period and cost.

The detection is the evidence bundle's (:mod:`stepscope.analysis.run.stalls`: per phase, a phase
that exceeds 2× its median at a regular period). This rule names the likely cause from the phase
that stalls: DataLoader start-up → workers restarted every epoch; ``other`` (outside
forward/backward/optimizer) → checkpointing, logging, evaluation or garbage collection;
``forward`` → an evaluation loop; ``data_wait`` → a data source that refills every N batches, or,
where the DataLoader starts its workers anew every epoch, the new workers catching up after each
start (the epoch-start steps' own wait is left out of the detection: the epoch-boundary finding
prices it). When the stalled steps ran beside a neighbour's burst of CPU (the stall is the
neighbour's, see the analysis module), this rule stands down: the foreign-load rule reports it, and
this rule's prescriptions would send the user after a checkpoint that is not there.
"""

from __future__ import annotations

from typing import Any

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

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
#: A data-wait stall where the workers restart every epoch (see ``recurring_slow_steps``).
_RESTARTED = ("the DataLoader's workers, started anew at every epoch, catching up after each start "
              "(or a data source that refills every N batches)",
              [("DataLoader(persistent_workers=True)", "kept workers go on making batches across the epoch boundary",
                "persistent_workers", False, True),
               *_CAUSES["data_wait"][1]])


def recurring_slow_steps(ev: RunEvidence) -> Finding | None:
    stall = ev.stall
    if stall is None or ev.steady is None or stall.neighbour:
        return None
    from stepscope.analysis.run.stalls import MIN_COST, REGULARITY  # loaded with the stall (a run record's)

    if stall.cost_share < MIN_COST:
        return None
    phase, period, regular, count = stall.phase, stall.period_steps, stall.regularity, stall.count
    cost, stall_s = stall.cost_share, stall.stall_s
    # the epoch-start steps' own wait is the epoch boundary's (the analysis leaves it out); with workers
    # restarted every epoch, the steps after a start wait while the new workers catch up
    cause, fixes = _RESTARTED if phase == "data_wait" and common.restarts_workers(ev) else _CAUSES[phase]
    evidence = [
        Evidence("period_steps", int(period), None, "steps", "steps", f"{count} slow steps"),
        Evidence("stall_s", round(stall_s, 4), round(stall.limit_s - stall.baseline_s, 4), "steps", "s",
                 f"mean excess of {phase} over its median"),
        Evidence("stall_cost_share", round(cost, 4), MIN_COST, "steps", "ratio", "steady state"),
        Evidence("regularity", round(regular, 2), REGULARITY, "steps", "ratio", "gaps within ±1 of the period"),
        Evidence("stall_phase", phase, None, "steps", "phase", "the phase that stalls"),
    ]
    if stall.outside_cores_stalled is not None:
        evidence.append(Evidence("outside_cores_stalled", stall.outside_cores_stalled, None, "sampler", "cores",
                                 f"other processes + steal in the slow steps (others: {stall.outside_cores_normal})"))
    title = (f"Every {period} steps a step stalls for ~{common.ms(stall_s)} "
             f"({common.pct(cost)} of the run)")
    summary = (f"Every {period} steps, {phase.replace('_', ' ')} takes ~{common.ms(stall_s)} longer than usual "
               f"({count} times; the median step is {common.ms(ev.steady.step_time_s)}): likely {cause}.")
    prescriptions = [Prescription(action, why or f"a ~{common.ms(stall_s)} stall every {period} steps",
                                  setting, current, suggested)
                     for action, why, setting, current, suggested in fixes]
    return common.finding("periodic_stall.recurring_slow_steps", "periodic_stall", title, cost,
                          min(0.95, 0.5 + 0.45 * regular), evidence, prescriptions, summary,
                          period_steps=int(period), slow_steps=list(stall.slow_steps[:50]))


FAMILY = FamilyEntry(
    "periodic_stall", (recurring_slow_steps,),
    diagnoses="A step stalls every N steps: checkpoints, logging, evaluation, worker restarts",
    evidence="One phase above 2× its median (and +5 ms, +10 % of a step) at least 3 times, ≥ 60 % of the gaps at one period",
    supersedes=frozenset({"outside_model"}), cpu_based=True)
