"""Stragglers: one rank is slower than the others, and every collective waits for it.

Evidence: per-rank steady-state means of each rank's *own* work — data wait, forward, optimizer
and the time outside the model ("other": a per-rank evaluation, a blocking upload, logging) —
(``ev.ranks``, one record per rank) and, when capture timed the collectives, the other ranks'
communication wait. A slow rank's "other" time is named by its own code attribution (the line,
with its measured share of that rank's step). Backward time is deliberately not used: DDP's all-reduce equalises it across
ranks, which hides a backward straggler (TraceML issue #252). The skew score of a phase is
``(slowest − median of the others) / median of the others``; TraceML warns at 0.10 and calls 0.20
critical. The finding is the same on every rank of the job (the waiting ranks too), so a rank that
waits for another is never reported as compute- or communication-bound (``SUPERSEDES``). Its cost,
when the collectives were timed, is the others' wait in them beyond the slow rank's own (at most
its excess): a chore the slow rank's loader fetches ahead behind costs the job less than its length.
Where the slow rank spent that time off CPU while the job's own processes kept its machine's cores
busy, the cost states a lower end (``extra["impact_low"]``, :func:`_capacity_low`). Where the slow
rank's own work is the excess and its workers' pace was measured, the cost is at most what lies
above that rank's DataLoader floor (:func:`~stepscope.diagnosis.loader_pace.capped_at_floor`): the
work taken out, it waits for its own data instead (blind w016 of seed 1650520568: a 34 ms chore on
rank 1 charged 57 % of the step, its floor 75 % of it; removing the chore gained 10 %).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.analysis.bundle import RankSteady, RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: TraceML's straggler score warning level.
SKEW_WARN = 0.10
#: TraceML's straggler score critical level.
SKEW_CRITICAL = 0.20
#: Phases compared across ranks (not backward, see the module docstring).
STRAGGLER_PHASES = ("data_wait", "forward", "optimizer", "other")
#: The straggler's slow phase -> the families of the slow rank's own findings that are its cause
#: (the job report says so on that finding: both describe one problem).
CAUSE_FAMILIES = common.PHASE_CAUSES
#: The straggler's slow phase -> the part of the step its cost sits in beside the others' wait in
#: collectives: on the slow rank, that phase (a chore outside the model is no data wait of its own,
#: and claimed as one it would absorb the rank's loader finding: blind w016 of seed 1650520568).
PHASE_CLAIMS = {"data_wait": "data_wait", "forward": "compute", "optimizer": "compute", "other": "other"}
#: Scores above this are shown capped (the other ranks' time in the phase is near zero).
MAX_SCORE = 10.0
#: The excess must also be this share of the step (a 10 % skew of a 0.1 ms phase is noise).
MIN_EXCESS_SHARE = 0.10
#: When collectives were timed, the other ranks must wait at least this share of the excess more
#: than the slow rank does (all ranks waiting alike is communication, not a straggler).
MIN_WAIT_EXPLAINED = 0.5


def slow_rank(ev: RunEvidence) -> Finding | None:
    if len(ev.ranks) < 2:
        return None
    per_rank = list(ev.ranks)
    step = max(item.steady.step_time_mean_s for item in per_rank)
    timed = all(item.comm is not None for item in per_rank)
    best = None
    for phase in STRAGGLER_PHASES:
        if phase == "other" and not timed:
            continue  # "other" holds what the phases leave: only the others' measured wait ties it to a rank
        seconds = np.array([item.own_work_s((phase,)) for item in per_rank])
        slowest = int(np.argmax(seconds))
        others = np.delete(seconds, slowest)
        median = float(np.median(others))
        excess = float(seconds[slowest]) - median
        if excess <= 0 or step <= 0 or excess < MIN_EXCESS_SHARE * step:
            continue
        skew = excess / median if median > 0 else float("inf")
        if best is None or excess > best[3]:
            best = (skew, phase, slowest, excess)
    if best is None or best[0] < SKEW_WARN:
        return None
    skew, phase, index, lost_s = best
    slow = per_rank[index]
    rank = slow.rank
    waiting = [item for item in per_rank if item is not slow]
    waits = [item.comm.exposed_s for item in waiting if item.comm is not None]
    wait_s = float(np.median(waits)) if waits else None
    slow_wait = slow.comm.exposed_s if slow.comm is not None else 0.0
    if wait_s is not None and wait_s - slow_wait < MIN_WAIT_EXPLAINED * lost_s:
        return None
    # with the collectives timed, what the job measurably loses is what the others wait beyond the
    # slow rank's own wait: its excess less what it saved meanwhile (its loader fetches ahead behind a chore)
    impact = (lost_s if wait_s is None else min(lost_s, max(0.0, wait_s - slow_wait))) / step
    cause = _cause(slow, phase, lost_s)
    others_s = own_s_of_others = float(np.median([item.own_work_s((phase,)) for item in waiting]))
    del own_s_of_others
    capped = skew > MAX_SCORE
    evidence = [Evidence("straggler_score", round(min(skew, MAX_SCORE), 3), SKEW_WARN, "ranks", "ratio",
                         f"rank {rank}, {phase}" + (" (capped: the other ranks barely spend time there)"
                                                    if capped else "")),
                Evidence("lost_s_per_step", round(lost_s, 5), None, "ranks", "s",
                         "slowest rank minus the median of the others")]
    if wait_s is not None:
        evidence.append(Evidence("others_wait_in_collectives_s", round(wait_s, 5), None, "steps", "s",
                                 "median over the other ranks, per step"))
    confidence = 0.7 if skew >= SKEW_CRITICAL else 0.55
    if wait_s is not None and wait_s >= 0.5 * lost_s:
        confidence = 0.85  # the others measurably wait for it
    waiting_ranks = ", ".join(str(item.rank) for item in waiting)
    summary = (f"Rank {rank} {cause['what']}; rank(s) {waiting_ranks} wait for it"
               + (f" {common.ms(wait_s)} per step in collectives" if wait_s else "") + ".")
    capacity = _capacity_low(per_rank, slow, phase, impact * step, step)
    low, busy = capacity if capacity is not None else (None, 0.0)
    extra = common.lower_end(
        impact, low, f"rank {rank} spent that time mostly off CPU while the job's own processes kept {busy:.0%} of its "
        "machine's cores busy; if that work is the step's, taking the time out gives back no more than the idle "
        "cores' share and its on-CPU part", evidence, "straggler_cost_low",
        f"the idle share of rank {rank}'s machine ({1 - busy:.0%}: the job's processes kept {busy:.0%} of its cores "
        "busy) plus the part of its excess it spent on a CPU")
    found = common.finding("straggler.slow_rank", "straggler",
                           f"Rank {rank} straggles: {cause['what']} (other ranks: {common.ms(others_s)})",
                           impact, confidence, evidence, [cause["fix"]], summary,
                           claims=("communication", PHASE_CLAIMS[phase]), rank=rank,
                           cause_families=CAUSE_FAMILIES.get(phase, ()),
                           waiting_ranks=[item.rank for item in waiting], phase=phase, **extra)
    if phase == "data_wait" or slow.floor is None:
        return found
    # its own work taken out, the slow rank waits for its own workers instead: the job saves at most
    # what lies above that rank's loader floor, as the rank's own finding of the same work says
    from stepscope.diagnosis.loader_pace import capped_at_floor

    return capped_at_floor(found, slow.floor, f"Rank {rank}'s DataLoader", f"less work on rank {rank}")


def _capacity_low(per_rank: list[RankSteady], slow: RankSteady, phase: str, charged_s: float,
                  step: float) -> tuple[float, float] | None:
    """(the lower end of what taking ``charged_s`` of the slow rank's ``phase`` out gives back, a
    share of the step; the share of its machine's cores the job's processes kept busy), or None
    where the account or the sampler did not measure it.

    While the slow rank was off CPU in that phase (asleep: an upload, a sleep, a lock), what ran on
    its machine ran instead: when the job's own processes (every rank's training process and
    workers there) kept its cores busy with the step's work (loading its batches), that work needs
    the cores whether or not the rank sleeps, and the step cannot get shorter than the job's CPU
    over the cores. Taking the time out then gives back no more than the cores' idle share plus the
    part of it the rank spent on a CPU (which frees a core, over the machine's cores). Whether the
    busy cores' work is the step's (not a spinning wait) the counters do not say: the value is the
    cost's lower end, not its measure; the ranking checks it against the next cause
    (:mod:`stepscope.diagnosis.near_tie`). A blind workload (two ranks, CPU-bound workers, rank 1
    asleep 16 ms a step) was charged 39.8 % of the step; removing the sleep gave back nothing (−2 %)."""
    on = slow.on_cpu.get(phase)
    cores = slow.machine_cores
    host = [item for item in per_rank if item.hostname == slow.hostname]
    if on is None or not cores or step <= 0 or any(item.tree_cores is None for item in host):
        return None
    busy = min(1.0, sum(float(item.tree_cores or 0.0) for item in host) / cores)
    return min(1.0, (1.0 - busy) + charged_s * on / (cores * step)), busy


def _cause(slow: RankSteady, phase: str, lost_s: float) -> dict[str, Any]:
    rank = slow.rank
    own_s = slow.own_work_s((phase,))
    if phase == "data_wait":
        loader = slow.loader
        settings = ""
        if loader is not None:
            settings = f": DataLoader(num_workers={loader.num_workers}) on rank {rank}"
        what = f"waits {common.ms(own_s)} per step for data{settings}"
        suggested = max(2, (loader.num_workers * 2) if loader is not None and loader.num_workers else 2)
        fix = Prescription(
            f"Speed up rank {rank}'s input: DataLoader(num_workers={suggested}) on rank {rank}, check its "
            "shard (same size and cost as the others'), its node's CPU load and storage",
            f"rank {rank} waits {common.ms(lost_s)} per step longer for data than the others",
            setting="num_workers", current=loader.num_workers if loader is not None else None,
            suggested=suggested)
    elif phase == "forward":
        what = f"computes its forward {common.ms(lost_s)} per step slower than the others"
        fix = Prescription(f"Rank {rank} computes slower: check for a throttled or shared GPU "
                           "(stepscope gpu-procs), uneven batch shapes, or a slower node",
                           f"forward {common.ms(lost_s)} per step above the other ranks")
    elif phase == "other":
        location = slow.other_code
        where = (f" — {location.label} takes {common.pct(location.share_of_step)} of its step"
                 if location is not None else "")
        what = f"spends {common.ms(lost_s)} per step longer outside the model than the others{where}"
        target = f"{location.label} on rank {rank}" if location is not None else f"rank {rank}'s work outside the model"
        fix = Prescription(
            f"Take {target} off the training step: run it every N steps, asynchronously (a thread or "
            "process), or on every rank alike",
            f"rank {rank} spends {common.ms(own_s)} per step outside forward, backward and the optimizer, "
            f"{common.ms(lost_s)} more than the others, and they wait for it in the next collective"
            + (f" (measured: {location.label}, {common.pct(location.share_of_step)} of rank {rank}'s step)"
               if location is not None else ""))
    else:
        what = f"spends {common.ms(lost_s)} per step longer in the optimizer than the others"
        fix = Prescription(f"Rank {rank}'s optimizer step is slower: check its node's CPU load and "
                           "parameter placement", f"optimizer {common.ms(lost_s)} per step above the other ranks")
    return {"what": what, "fix": fix}


FAMILY = FamilyEntry(
    "straggler", (slow_rank,),
    diagnoses="One rank's own work is slower and the others wait for it in collectives",
    evidence="A rank's data wait, forward, optimizer or time outside the model ≥ 10 % above the other ranks' median and ≥ 10 % of the step, the others waiting in collectives for at least half of it",
    supersedes=frozenset({"compute", "communication"}), explains_other_ranks=True)
