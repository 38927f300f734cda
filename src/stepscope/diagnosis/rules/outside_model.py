"""Time outside the model: the step is dominated by work that is neither data loading nor the model.

The "other" phase is everything in a step outside ``next(loader)``, the model's forward, backward
and the optimizer: logging, metric computation, Python bookkeeping, checkpoints, evaluation, and
(on GPUs) host syncs from ``.item()``/``.cpu()``. When it dominates, the finding names the code that
owns it from the stack samples (the top user-code lines of "other", library frames folded into
the user line that called them). The collector's pauses that fall in "other" are taken out first
(they are the ``garbage_collection`` finding's cost). Without stack samples it still fires and says
how to get them.
"""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: Share of the step in "other" that makes it the bottleneck (XProf's HIGH level for its
#: "all others" category is 15 %; we want "other" to dominate, not just to be visible).
OTHER_HIGH = 0.25


def other_dominates(ev: RunEvidence) -> Finding | None:
    steady = ev.steady
    if steady is None:
        return None
    other = steady.shares.get("other", 0.0)
    gc_other = (ev.gc.by_phase_s.get("other", 0.0) / steady.total_s
                if ev.gc is not None and steady.total_s > 0 else 0.0)
    share = max(0.0, other - gc_other)  # the collector's pauses are garbage_collection's cost
    if share < OTHER_HIGH:
        return None
    evidence = [Evidence("other_share", round(other, 4), OTHER_HIGH, "steps", "ratio",
                         "outside data wait, forward, backward and optimizer")]
    if gc_other > 0:
        evidence.append(Evidence("other_share_without_gc", round(share, 4), OTHER_HIGH, "steps", "ratio",
                                 "less the collector's pauses in it"))
    locations = common.code_locations(ev, "other")
    for location in locations[:3]:
        evidence.append(Evidence("code_location", location.label, None, "stacks", "code",
                                 f"{common.pct(location.share_of_phase)} of 'other'"))
    if locations:
        top = locations[0]
        where = f"`{top.label}` takes {common.pct(top.share_of_phase)} of it"
        prescriptions = [Prescription(
            f"Move {top.label} out of the training step, or run it every N steps",
            f"it owns {common.pct(top.share_of_phase)} of the time outside the model "
            f"(~{common.pct(top.share_of_step)} of the step: the most it can save, run every N steps "
            "it saves about (N-1)/N of that)")]
    else:
        where = "no stack samples say which code (run with --stacks-hz > 0 to see it)"
        prescriptions = []
    prescriptions.append(Prescription(
        "Log scalars every N steps (loss.detach(), .item() only when printing); keep metrics on the "
        "device and reduce them rarely; checkpoint and evaluate off the hot path",
        "work done every step outside the model is paid every step"))
    title = f"{common.pct(share)} of the step is outside the model: {where}"
    summary = (f"The step spends {common.pct(share)} of its time in neither data loading nor the model "
               "(forward, backward, optimizer): Python bookkeeping, logging, metrics, syncs or checkpoints.")
    return common.finding("outside_model.other_dominates", "outside_model", title, share, 0.8 if locations else 0.6,
                          evidence, prescriptions, summary, claims=("other",))


FAMILY = FamilyEntry(
    "outside_model", (other_dominates,),
    diagnoses="The step spends its time in neither data loading nor the model: bookkeeping, metrics, logging, named by line",
    evidence="\"Other\" ≥ 25 % of the step, its owner from the stack samples",
    supersedes=frozenset())
