"""A finding family's registry entry: what the engine and the documentation know of a family.

Each rule module declares one :class:`FamilyEntry` (its ``FAMILY``); the registry
(:data:`stepscope.diagnosis.rules.REGISTRY`) lists them in order, and everything else is derived
from it: the rules the engine runs, the precedence table (a cause over its symptom), the families
whose evidence is CPU time, the families that explain other ranks' symptoms in a job, the list of
families in ``report.json``, and the family tables of the documentation (a test compares them).
Adding a family is one rule module with its entry, one line in the registry, and its test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.findings import Finding

#: A rule: a plain function of the evidence bundle (reads no files, prints nothing).
Rule = Callable[[RunEvidence], "Finding | None"]
#: The healthy family's verdict: the evidence and the minor findings that did not reach medium.
Verdict = Callable[[RunEvidence, "tuple[Finding, ...]"], "Finding | None"]


@dataclass(frozen=True)
class FamilyEntry:
    """One finding family.

    Args:
        family: the stable identifier (``findings[].family`` in ``report.json``).
        rules: its rules, in the order they run.
        diagnoses: one line, what the family says is wrong (documentation tables).
        evidence: one line, what it rests on (documentation tables).
        supersedes: families whose findings this one's make moot when both fire, because it names
            the cause of their symptom (oversubscribed cores look input-bound).
        supersedes_when: ``(family, test)`` pairs narrowing ``supersedes``: a finding of that family
            is moot only when ``test(cause, symptom)`` holds (the cause is what the symptom's fix
            would not remove, or the symptom prescribes the fix the cause turns against the run).
            Otherwise both are shown, ranked by their costs.
        cpu_based: its evidence is CPU time or a CPU-relative rate, less certain on a machine
            other processes crowd.
        explains_other_ranks: in a job, its finding explains the other ranks' symptoms (a
            straggler, communication): listed first among the job's findings.
        verdict: the healthy family only: the verdict the engine gives when no finding reached
            medium severity.
    """

    family: str
    rules: tuple[Rule, ...]
    diagnoses: str
    evidence: str
    supersedes: frozenset[str] = frozenset()
    supersedes_when: tuple[tuple[str, Callable[[Finding, Finding], bool]], ...] = ()
    cpu_based: bool = False
    explains_other_ranks: bool = False
    verdict: Verdict | None = None
