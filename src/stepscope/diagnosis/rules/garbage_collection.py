"""Garbage collection: the collector's pauses cost a material share of the step.

Evidence: every collection timed exactly with ``gc.callbacks`` (capture), summed over the steady
state (:class:`~stepscope.analysis.run.gc_pauses.GcPauseSummary`): its share of step time, the
pauses per step by generation, and the largest pause with the step and phase it hit. The cost is
measured, and it lies in the phases the pauses hit (its ``claims``), so it never double-counts
with the finding about that phase.

Prescriptions, by what the pauses are: ``gc.freeze()`` after set-up moves the model, the data
and everything long-lived out of the collector's view (full collections stop walking them);
raising the generation-0 threshold makes young collections rarer when they are many and short;
full (generation-2) pauses that grow point at reference cycles created per step.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: Collector pauses worth a finding (XProf's "moderate" 5 % level for a secondary category is the
#: medium severity; from 1 % the finding is LOW).
GC_MINOR = 0.01
GC_MODERATE = 0.05
#: More young collections than this per step suggests raising the generation-0 threshold.
MANY_YOUNG_PER_STEP = 2.0
#: Generation-0 threshold suggested (CPython's default is 700 allocations).
SUGGESTED_GEN0 = 50_000
#: Phases -> the parts of the step findings claim.
_CLAIMS = {"data_wait": "data_wait", "forward": "compute", "backward": "compute", "optimizer": "compute",
           "other": "other"}


def collector_pauses(ev: RunEvidence) -> Finding | None:
    summary, steady = ev.gc, ev.steady
    if summary is None or steady is None or summary.share_of_step_time is None:
        return None
    share = summary.share_of_step_time
    if share < GC_MINOR:
        return None
    young = next((item for item in summary.by_generation if item.generation == 0), None)
    full = next((item for item in summary.by_generation if item.generation == 2), None)
    evidence = [Evidence("gc_share_of_step", round(share, 4), GC_MODERATE, "steps", "ratio",
                         f"{summary.count} collections over {summary.steps} steady steps"),
                Evidence("gc_pauses_per_step", round(summary.pauses_per_step or 0.0, 2), None, "steps", "count",
                         "all generations")]
    largest = summary.largest
    if largest is not None:
        evidence.append(Evidence("largest_gc_pause_s", round(largest.duration_s, 5), None, "steps", "s",
                                 f"generation {largest.generation}, step {largest.step}, "
                                 f"phase {largest.phase or 'between steps'}"))
    for item in summary.by_generation:
        evidence.append(Evidence(f"gc_gen{item.generation}_s", round(item.total_s, 4), None, "steps", "s",
                                 f"{item.count} collections, longest {common.ms(item.max_s)}"))
    full_share = full.total_s / summary.total_s * share if full is not None and summary.total_s else 0.0
    prescriptions = [Prescription(
        "gc.freeze() once set-up is done (after building the model, optimizer and datasets)",
        "long-lived objects leave the collector's view, so full collections stop walking them — "
        f"full collections take {common.pct(full_share)} of the step; how much of that freezing saves "
        "depends on how many of the objects they walk existed before training (not measured)")]
    if young is not None and summary.steps and young.count / summary.steps >= MANY_YOUNG_PER_STEP:
        prescriptions.append(Prescription(
            f"gc.set_threshold({SUGGESTED_GEN0}, 20, 100)",
            f"{young.count / summary.steps:.1f} young collections per step: rarer ones cost less in total",
            "gc_threshold", "(700, 10, 10)", f"({SUGGESTED_GEN0}, 20, 100)"))
    prescriptions.append(Prescription(
        "Avoid reference cycles in per-step objects (parent <-> child links, closures holding self; "
        "weakref for back-references), or clear them explicitly",
        "objects in cycles are only freed by the collector, and every full collection walks all of them"))
    hit = [phase for phase, seconds in summary.by_phase_s.items() if seconds > 0]
    claims = tuple(sorted({_CLAIMS[phase] for phase in hit if phase in _CLAIMS})) or ("step",)
    title = (f"Garbage-collector pauses take {common.pct(share)} of step time "
             + (f"(largest {common.ms(largest.duration_s)})" if largest is not None else ""))
    summary_text = (f"{summary.count} collections paused the training thread for "
                    f"{common.ms(summary.total_s)} in total over the steady state"
                    + (f"; the largest, a generation-{largest.generation} collection, took "
                       f"{common.ms(largest.duration_s)} in step {largest.step}" if largest is not None else "")
                    + ".")
    return common.finding("garbage_collection.collector_pauses", "garbage_collection", title, share, 0.9,
                          evidence, prescriptions, summary_text, claims=claims)


FAMILY = FamilyEntry(
    "garbage_collection", (collector_pauses,),
    diagnoses="Python's garbage collector pauses the step",
    evidence="Measured collector pauses (gc.callbacks) ≥ 1 % of the steady step time (medium from 5 %)",
    supersedes=frozenset())
