"""Time outside the model: the step is dominated by work that is neither data loading nor the model.

The "other" phase is everything in a step outside ``next(loader)``, the model's forward, backward
and the optimizer: logging, metric computation, Python bookkeeping, checkpoints, evaluation, and
(on GPUs) host syncs from ``.item()``/``.cpu()``. When it dominates, the finding names the code that
owns it from the stack samples (the top user-code lines of "other", library frames folded into
the user line that called them). When that line copies the step's tensors to the device (the
FLOP-counted step records every copy between devices with its line, bytes and whether the host
memory was pinned), the fix is the copy's — pinned memory and a non-blocking copy — not moving
the line out of a step that needs its input. The collector's pauses that fall in "other" are taken out first
(they are the ``garbage_collection`` finding's cost). Without stack samples it still fires and says
how to get them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common
from stepscope.units import format_bytes, format_duration

if TYPE_CHECKING:  # a run record's evidence only
    from stepscope.analysis.run.code_locations import CodeLocation
    from stepscope.record.run import DeviceCopy

#: Share of the step in "other" that makes it the bottleneck (XProf's HIGH level for its
#: "all others" category is 15 %; we want "other" to dominate, not just to be visible).
OTHER_HIGH = 0.25
#: Share of its line's time a copy between devices must take (timed in the FLOP-counted step) for
#: the line's fix to be the copy's: a line that builds a tensor in Python and then copies it spends
#: its time building.
COPY_OWNS_LINE = 0.5


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
    copy = common.device_copy_at(ev, locations[0]) if locations else None
    line_s = locations[0].share_of_step * steady.step_time_mean_s if locations else 0.0
    if copy is not None and copy.wall_ns * 1e-9 < COPY_OWNS_LINE * line_s:
        evidence.append(Evidence("device_copy_s", round(copy.wall_ns * 1e-9, 6), None, "record", "s",
                                 f"the copy at {locations[0].label}: less than {common.pct(COPY_OWNS_LINE)} of "
                                 f"the line's {format_duration(line_s)}, the rest of the line is not the copy"))
        copy = None
    if copy is not None:
        where, prescriptions = _input_copy(ev, locations[0], copy, line_s, evidence)
    elif locations:
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
    if copy is None:
        prescriptions.append(Prescription(
            "Log scalars every N steps (loss.detach(), .item() only when printing); keep metrics on the "
            "device and reduce them rarely; checkpoint and evaluate off the hot path",
            "work done every step outside the model is paid every step"))
    title = f"{common.pct(share)} of the step is outside the model: {where}"
    summary = (f"The step spends {common.pct(share)} of its time in neither data loading nor the model "
               "(forward, backward, optimizer): Python bookkeeping, logging, metrics, syncs or checkpoints.")
    return common.finding("outside_model.other_dominates", "outside_model", title, share, 0.8 if locations else 0.6,
                          evidence, prescriptions, summary, claims=("other",))


def _input_copy(ev: RunEvidence, top: CodeLocation, copy: DeviceCopy, line_s: float,
                evidence: list[Evidence]) -> tuple[str, list[Prescription]]:
    """The top line of "other" copies the step's tensors to the device (measured in the FLOP-counted
    step): the copy's own fix — pinned memory and a non-blocking copy — not moving the line out of a
    step that needs its input."""
    kind = "pinned" if copy.pinned else "pageable"
    evidence.append(Evidence("device_copy_bytes", copy.bytes, None, "record", "bytes",
                             f"{copy.count} {kind} {copy.source}→{copy.target} copies at {top.label}"
                             f"{'' if copy.non_blocking else ', blocking'} (the FLOP-counted step)"))
    copy_s = copy.wall_ns * 1e-9
    evidence.append(Evidence("device_copy_s", round(copy_s, 6), round(COPY_OWNS_LINE * line_s, 6), "record", "s",
                             f"the copy's calls in the FLOP-counted step, of the line's {format_duration(line_s)} a step"))
    where = (f"`{top.label}` takes {common.pct(top.share_of_phase)} of it, copying "
             f"{format_bytes(copy.bytes)} a step from {kind} host memory to {copy.target} "
             f"(the copy: {format_duration(copy_s)} of the line's {format_duration(line_s)})")
    most = (f"the copy's line holds ~{common.pct(top.share_of_step)} of the step: the most it can save, "
            "less the copy itself where the device cannot overlap it")
    if not copy.pinned:
        first = common.pin_memory_prescription(
            ev, f"a copy from pageable memory is synchronous: the host stages it through its own CPU "
                f"and waits, where a pinned, non-blocking one is queued and overlaps ({most})")
    elif not copy.non_blocking:
        first = Prescription("tensor.to(device, non_blocking=True)",
                             f"the memory is pinned already but the copy blocks the host ({most})")
    else:
        first = Prescription("Move less data each step: send uint8 and normalise on the device, keep tensors "
                             "on the device between steps", most)
    return where, [first]


FAMILY = FamilyEntry(
    "outside_model", (other_dominates,),
    diagnoses="The step spends its time in neither data loading nor the model: bookkeeping, metrics, logging, "
              "named by line; an input copy from pageable memory when that line's copy takes most of its time",
    evidence="\"Other\" ≥ 25 % of the step, its owner from the stack samples; the copies between devices "
             "the FLOP-counted step timed at that line",
    supersedes=frozenset())
