"""A finding family that exists only for the tests: one module, like every family of
``stepscope.diagnosis.rules`` — its rule, its threshold, its registry entry (``FAMILY``)."""

from __future__ import annotations

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription
from stepscope.diagnosis.rules import _common as common

#: The "other" phase's share of the step above which the fixture fires.
OTHER_HIGH = 0.3


def other_is_high(ev: RunEvidence) -> Finding | None:
    steady = ev.steady
    if steady is None or steady.shares.get("other", 0.0) < OTHER_HIGH:
        return None
    share = steady.shares["other"]
    return common.finding("fixture_family.other_is_high", "fixture_family", f"Fixture: other is {common.pct(share)}",
                          share, 0.9, [Evidence("other_share", round(share, 4), OTHER_HIGH)],
                          [Prescription("Do the fixture's change")], claims=("other",))


FAMILY = FamilyEntry(
    "fixture_family", (other_is_high,),
    diagnoses="The fixture's diagnosis", evidence="The fixture's evidence",
    supersedes=frozenset({"outside_model"}))
