"""Near ties: a verdict whose measured cost barely exceeds the next cause's is right about two times
in three, not 96 %.

The verdict is the first finding, and among measured costs the ranking is by cost alone. When the
next finding of another family costs nearly as much, which of the two the run loses more time to
is within what one run measures: on the blind evaluation's kept runs such verdicts named the
factor whose removal gained most (or one within noise of it) 11 times in 16, while the confidence
they showed was their rule's, up to 96 %. :func:`mark_near_tie` caps the first finding's
confidence at :data:`NEAR_TIE_CONFIDENCE` and makes it say which finding is that close
(``extra["near_tie"]``, a ``runner_up_margin`` evidence item and one sentence of its summary).

A cost stated with a lower end (``extra["impact_low"]``: ``{"value", "why"}``) is checked by that end
too, and against the next cause's upper end where that one states one (``extra["impact_high"]``: a
cost priced on part of what its cause took, such as a loader's reads priced on the training
thread's blocked part of the data wait, whose whole wait is its upper end). A lower end: the
foreign-load finding counts the intra-op threads' wait for a core, which came back in full
beside an always-busy neighbour (pytorch/examples mnist: 70.0 % charged, 70.6 % measured) and in part
beside neighbours that sleep between bursts (blind workloads: 47.6 % charged, 15.8 % measured; 56 %
and 18 %). Its lower end, the training thread's own wait in the model's phases (18.6 % and 20.7 %
there), is what comes back for certain; a verdict whose lower end does not clear the next cause by
:data:`NEAR_TIE_MARGIN` is capped the same way. The straggler states one where the slow rank slept
while the job's own processes kept the cores busy (:func:`stepscope.diagnosis.rules.straggler._capacity_low`),
and a finding capped at the DataLoader's floor does (:mod:`stepscope.diagnosis.loader_pace`): the cap is
what the step saves if it shrinks exactly to the workers' mean pace, less the steps' spread about it.

It applies only where the first finding is first *because of its measured cost* — the tier a
measured cost of at least ``MEASURED_FIRST`` of the step ranks in (the engine's predicate
``ranked_by_measured_cost``, passed in: the engine imports this module) — and costs at least as
much as every other finding of that tier. Not to a finding ranked first for another reason: by its
share of a trace's critical path (a ranking the kept runs, all records, never exercised), or as a
straggler placed ahead of the slow rank's own finding that causes it (it may cost less: the order
says one problem, not which of two). Not against a finding linked to it as cause and symptom
(``cause_of``): those are one problem seen twice, not two candidates. Not against a risk or an
estimate: they rank below every measured cost whatever their size, so their size is no rival to a
measured verdict. And not against a finding of the same family, whose fix is the same one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from stepscope.diagnosis.findings import Evidence, Finding

__all__ = ["NEAR_TIE_CONFIDENCE", "NEAR_TIE_MARGIN", "mark_near_tie", "runner_up"]

#: The first finding costs less than this share of the step more than the next finding of another
#: family: a near tie. From the blind evaluation's kept runs (five seeds, 193 answered verdicts,
#: re-diagnosed with the code of 137f1e9; BENCHMARKS.md, "Near ties"), in margin bands of 0.05,
#: 0.1 and 0.2 of the step: of the verdicts otherwise shown at 96 % (the ones a cap changes), those
#: within 0.05 of their runner-up were right 6 times in 8; 0.05-0.1, 2 in 2; 0.1-0.2, 16 in 17;
#: from 0.2, 58 in 58. Pooled until monotone, as :data:`~stepscope.diagnosis.engine.CONFIDENCE_MAP`'s
#: bands were: below 0.05, 6 in 8 (75 %); 0.05-0.2, 18 in 19; from 0.2, 58 in 58 — from 0.05 up, 76
#: in 77: the 96 % holds there, and below 0.05 it does not.
NEAR_TIE_MARGIN = 0.05
#: Near ties (margin below :data:`NEAR_TIE_MARGIN`) among those verdicts, and how many named the
#: right cause: every near tie, whatever confidence it showed (5 of the 8 below 96 % were right).
NEAR_TIE_SEEN = 16
NEAR_TIE_RIGHT = 11
#: The confidence a near tie shows at most: (right + 1) / (verdicts + 2) over every near tie, as for a
#: top finding that explains little (``engine.EXPLAINS_LITTLE_CONFIDENCE``): 0.67. Over the 8 it
#: lowers from 96 % alone it would be (6 + 1) / (8 + 2) = 0.70: the same within one verdict.
NEAR_TIE_CONFIDENCE = round((NEAR_TIE_RIGHT + 1) / (NEAR_TIE_SEEN + 2), 2)


def runner_up(findings: Sequence[Finding], by_cost: Callable[[Finding], bool]) -> Finding | None:
    """The finding the first one was ranked above by cost alone: the costliest of another family in
    the same tier (``by_cost``), not its cause or symptom; None when the first finding is not ranked
    by its measured cost (see the module docstring) or has no such rival."""
    if not findings:
        return None
    top = findings[0]
    # a finding linked to the first as cause or symptom is one problem with it (a slow rank's own
    # finding may cost more than the straggler listed first): neither a rival nor a reason for no tie
    rest = [item for item in findings[1:] if by_cost(item)
            and item.cause_of != top.rule_id and top.cause_of != item.rule_id]
    if top.family == "healthy" or not by_cost(top) or any(item.impact > top.impact for item in rest):
        return None
    return next((item for item in rest if item.family != top.family), None)


def mark_near_tie(findings: tuple[Finding, ...], by_cost: Callable[[Finding], bool]) -> tuple[Finding, ...]:
    """The findings with the first one capped at :data:`NEAR_TIE_CONFIDENCE` and saying so when its
    measured cost exceeds its :func:`runner_up`'s by less than :data:`NEAR_TIE_MARGIN` of the step.
    Findings below it keep theirs: the calibration is of the verdict."""
    rival = runner_up(findings, by_cost)
    if rival is None or "near_tie" in findings[0].extra:
        return findings
    top = findings[0]
    margin = round(top.impact - rival.impact, 4)
    low = _end(top, "impact_low")
    high = _end(rival, "impact_high")
    top_end = min(float(low["value"]), top.impact) if low is not None else top.impact
    rival_end = max(float(high["value"]), rival.impact) if high is not None else rival.impact
    end_margin = round(top_end - rival_end, 4)
    if margin >= NEAR_TIE_MARGIN and end_margin >= NEAR_TIE_MARGIN:
        return findings
    check = (f"on the blind evaluation's kept runs, verdicts within {NEAR_TIE_MARGIN * 100:.0f} points of the "
             f"next cause named the right one {NEAR_TIE_RIGHT} times in {NEAR_TIE_SEEN}: check both before "
             "acting (`stepscope try` measures the prescriptions it can apply).")
    if margin >= NEAR_TIE_MARGIN:
        # the costs clear each other; the first one's lower end, or the next one's upper end, does not
        margin = end_margin
        ours = (f"its cost's lower end, {top_end:.1%} of the step ({low['why']})" if low is not None
                else f"its cost, {top_end:.1%} of the step")
        theirs = (f"the {rival.family} finding's upper end, {rival_end:.1%} ({high['why']})" if high is not None
                  else f"the {rival.family} finding's {rival_end:.1%}")
        note = Evidence("runner_up_margin", margin, NEAR_TIE_MARGIN, "diagnosis", "ratio",
                        f"of {ours} over {theirs}")
        relation = "below" if margin < 0 else f"only {margin * 100:.1f} points above"
        sentence = f"Borderline: {ours}, is {relation} {theirs}; {check}"
    else:
        note = Evidence("runner_up_margin", margin, NEAR_TIE_MARGIN, "diagnosis", "ratio",
                        f"over the {rival.family} finding ({rival.impact:.1%} of the step)")
        sentence = (f"Borderline: the {rival.family} finding costs {rival.impact:.1%} of the step, "
                    f"{margin * 100:.1f} points less than this one; {check}")
    capped = replace(top, confidence=min(top.confidence, NEAR_TIE_CONFIDENCE),
                     summary=f"{top.summary} {sentence}".strip(), evidence=(*top.evidence, note),
                     extra={**top.extra, "near_tie": {"rule_id": rival.rule_id, "family": rival.family,
                                                      "impact": rival.impact, "margin": margin}})
    return (capped, *findings[1:])


def _end(finding: Finding, key: str) -> dict[str, Any] | None:
    """A finding's stated lower (``impact_low``) or upper (``impact_high``) end: ``{"value", "why"}``."""
    end = finding.extra.get(key)
    return end if isinstance(end, dict) else None
