"""The diagnosis engine: evidence in, ranked findings out — per rank, then for the job.

A rule is a plain function ``(RunEvidence) -> Finding | None`` over the evidence bundle
(:class:`~stepscope.analysis.bundle.RunEvidence`); it reads no files, prints nothing and never
imports another rule. :func:`run_rules` runs every rule of the registry
(:data:`~stepscope.diagnosis.rules.REGISTRY`) on one rank and then settles, in this order:

1. **Failures.** A rule that raises is a bug in stepscope, not in the run: its name and error go
   into :attr:`Diagnosis.failed_rules`, the report shows a warning, and the diagnosis is marked
   incomplete — a run whose rules failed is never called healthy.
2. **Precedence** (:data:`SUPERSEDES`): one table says which family's finding makes another's moot
   because it names the cause of the other's symptom (oversubscribed cores look input-bound; a rank
   that waits for others looks compute-bound). Superseded findings are kept apart, with the
   finding that superseded them, so the report can say why they are not shown.
3. **Costs that do not overlap.** Findings are taken most costly first; each claims parts of the
   step (``Finding.claims``: ``data_wait``, ``compute``, ``other``, ``step``) and its measured impact
   is capped by what is left of those parts, so the impacts of one run add up to at most the step.
4. **A crowded machine**: when the ``foreign_load`` finding is present, CPU-based findings
   (:data:`CPU_BASED`) lose confidence; when the training thread's account leaves part of the
   step unexplained (off CPU, no measured cause), every other finding's confidence is scaled by
   the share it does explain.
5. **Ranking** by impact — measured costs of at least :data:`MEASURED_FIRST` of the step before any
   estimate, risks (memory running out) after every estimate of step time —, then severity, then
   confidence; when nothing but a risk reaches :data:`HEALTHY_BELOW` and the diagnosis is
   complete, the healthy verdict heads the list — after such a risk, which is then the first thing
   to say. Otherwise the verdict answers "why is it slow" and a risk stands beside it
   (:func:`risk_of`).
6. **Calibration**: the confidence shown is how often a verdict of that rule-confidence was right
   on generated workloads no rule was tuned on (:data:`CONFIDENCE_MAP`); a verdict that explains
   little of the step (:func:`explains_little`), or whose measured cost barely exceeds the next
   cause's (a near tie, :mod:`stepscope.diagnosis.near_tie`), shows at most how often such verdicts
   were right there, and says why.

:func:`diagnose_job` is the one entry the pipeline calls: every rank's rules, then the job step
(:func:`merge_findings`) for several ranks — one finding per rule naming the ranks it fired on,
ranked by cost, the families that explain other ranks' symptoms (:data:`JOB_FIRST`: a straggler,
communication) ahead of the slow rank's own finding that causes them, marked as its cause.

The precedence tables are the registry's: each family's entry says which families it supersedes,
whether its evidence is CPU time, and whether it explains other ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry, Rule, Verdict
from stepscope.diagnosis.findings import Evidence, Finding, Severity, lowered_severity
from stepscope.diagnosis.loader_pace import paced_by_the_loader
from stepscope.diagnosis.near_tie import mark_near_tie
from stepscope.diagnosis.rules import REGISTRY, RULES

__all__ = ["Diagnosis", "HEALTHY_BELOW", "JobDiagnosis", "SUPERSEDES", "diagnose", "diagnose_job",
           "merge_findings", "rank_findings", "ranked_by_measured_cost", "risk_of", "run_rules"]

#: family -> the families whose findings it makes moot when both fire (cause over symptom): the
#: registry's ``supersedes`` (oversubscribed cores look input-bound; a rank waiting for others
#: looks compute-bound; recompilations look like periodic stalls).
SUPERSEDES: dict[str, frozenset[str]] = {entry.family: entry.supersedes for entry in REGISTRY if entry.supersedes}

#: Families whose evidence is CPU time or CPU-relative rates: other processes on the machine make
#: them less certain (their confidence is scaled by :data:`CROWDED_CONFIDENCE`).
CPU_BASED = frozenset(entry.family for entry in REGISTRY if entry.cpu_based)
CROWDED_CONFIDENCE = 0.7
#: Families that explain other ranks' symptoms: listed first among a job's findings.
JOB_FIRST = tuple(entry.family for entry in REGISTRY if entry.explains_other_ranks)


@dataclass(frozen=True)
class Tables:
    """What the engine reads of a registry: its rules, families, precedence and verdict."""

    rules: tuple[Rule, ...]
    families: frozenset[str]
    supersedes: dict[str, frozenset[str]]
    #: (cause, symptom) -> the test a symptom's finding must pass to be moot (registry's supersedes_when)
    moot_when: dict[tuple[str, str], Callable[[Finding, Finding], bool]]
    cpu_based: frozenset[str]
    job_first: tuple[str, ...]
    verdict: Verdict | None

    @classmethod
    def of(cls, registry: Sequence[FamilyEntry]) -> Tables:
        return cls(rules=tuple(rule for entry in registry for rule in entry.rules),
                   families=frozenset(entry.family for entry in registry),
                   supersedes={entry.family: entry.supersedes for entry in registry if entry.supersedes},
                   moot_when={(entry.family, symptom): test for entry in registry
                              for symptom, test in entry.supersedes_when},
                   cpu_based=frozenset(entry.family for entry in registry if entry.cpu_based),
                   job_first=tuple(entry.family for entry in registry if entry.explains_other_ranks),
                   verdict=next((entry.verdict for entry in registry if entry.verdict is not None), None))


def _tables(registry: Sequence[FamilyEntry] | None, rules: tuple[Rule, ...] | None) -> Tables:
    tables = DEFAULT_TABLES if registry is None else Tables.of(registry)
    if registry is None and RULES != DEFAULT_TABLES.rules:  # RULES replaced (tests monkeypatch it)
        tables = replace(tables, rules=RULES)
    return replace(tables, rules=rules) if rules is not None else tables

#: A run whose findings all stay below this severity gets the healthy verdict.
HEALTHY_BELOW = Severity.MEDIUM

#: The parts of the step findings claim, and the steady-state phases each is made of.
CLAIM_PHASES: dict[str, tuple[str, ...]] = {
    "data_wait": ("data_wait",),
    "compute": ("forward", "backward", "optimizer"),
    "other": ("other",),
    "communication": ("communication",),
    "compile": ("compile",),
}


@dataclass(frozen=True)
class Diagnosis:
    """What the rules concluded about one rank."""

    findings: tuple[Finding, ...]
    superseded: tuple[tuple[Finding, str], ...] = ()  # (finding, rule_id of the one that superseded it)
    failed_rules: tuple[str, ...] = ()  # "rule_name: ErrorType: message"

    @property
    def complete(self) -> bool:
        return not self.failed_rules

    def to_dict(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "failed_rules": list(self.failed_rules),
            "superseded": [{"rule_id": item.rule_id, "title": item.title, "superseded_by": by}
                           for item, by in self.superseded],
        }


#: A measured cost from this share of the step ranks above every estimate.
MEASURED_FIRST = 0.05


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Most costly first: by the share of the critical path the finding owns when a trace gives
    one (:func:`on_the_path`), else by its impact; then severity, confidence. A cost measured on
    the run (≥ :data:`MEASURED_FIRST` of the step) ranks above every estimate — a neighbour by the
    cores it held — whatever the estimate's size: the top finding is where the run measurably loses
    time. A *risk* (``extra["risk"]``: memory that runs out, a heap near capacity) costs no step
    time: it ranks below every estimate of step time, and the report shows it on a line of its own
    (:func:`risk_of`) rather than as the answer to "why is it slow"."""
    def key(item: Finding) -> tuple[int, float, int, float, str]:
        return _tier(item), -_cost(item), -int(item.severity), -item.confidence, item.rule_id

    return sorted(findings, key=key)


def _cost(item: Finding) -> float:
    """What :func:`rank_findings` orders by: the critical-path share when a trace gives one, else the impact."""
    return item.path_share if item.path_share is not None else item.impact


def _tier(item: Finding) -> int:
    """:func:`rank_findings`' tier: 0 a measured cost of at least :data:`MEASURED_FIRST`, 1 an
    estimate, 2 a risk, 3 a smaller measured cost."""
    measured = item.path_share is not None or item.impact_basis.startswith("measured")
    return 0 if measured and _cost(item) >= MEASURED_FIRST else 2 if item.extra.get("risk") else 1 if not measured else 3


def ranked_by_measured_cost(item: Finding) -> bool:
    """Whether ``item`` ranks in :func:`rank_findings`' first tier by its measured share of the step
    (≥ :data:`MEASURED_FIRST`), not by a critical-path share, and is no risk: the findings among
    which the order is the measured cost alone, so a near tie between two of them is a tie between
    causes (:mod:`stepscope.diagnosis.near_tie`)."""
    return item.path_share is None and _tier(item) == 0 and not item.extra.get("risk")


def risk_of(findings: tuple[Finding, ...] | list[Finding]) -> Finding | None:
    """The most pressing risk to the run (memory runs out within the hour first) when it is not the
    verdict itself: what the report shows beside the speed verdict."""
    risks = [item for item in findings[1:] if item.extra.get("risk")]
    return min(risks, key=lambda item: (not item.extra.get("urgent"), -int(item.severity))) if risks else None


#: The parts of a traced step's critical path each family's cause owns (CriticalPathShares fields).
PATH_OWNERS: dict[str, tuple[str, ...]] = {
    "input_pipeline": ("data_loading",),
    "launch_overhead": ("cpu", "launch"),
    "host_device_sync": ("after_sync", "sync_wait", "memory_copies"),
    "compute": ("gpu_compute", "kernel_gaps"),
    "communication": ("communication",),
}
#: A trace finding whose cause owns less of the critical path than this is LOW at most.
PATH_SHARE_FLOOR = 0.01


def on_the_path(findings: list[Finding], evidence: RunEvidence) -> list[Finding]:
    """Findings of a trace (no run record) whose family owns part of the critical path carry that
    share (``path_share``, and as evidence) and rank by it; one whose cause owns none of the path is
    LOW at most: shortening what is off the path does not shorten the step."""
    trace = evidence.trace
    shares = trace.critical_path if trace is not None else None
    if shares is None or evidence.record is not None:
        return findings
    out = []
    for item in findings:
        kinds = PATH_OWNERS.get(item.family)
        if kinds is None:
            out.append(item)
            continue
        share = min(1.0, sum(float(getattr(shares, kind)) for kind in kinds))
        severity = item.severity if share >= PATH_SHARE_FLOOR else min(item.severity, Severity.LOW)
        note = Evidence("critical_path_share", round(share, 4), None, "trace", "ratio",
                        "of the steps' critical path: " + " + ".join(kind.replace("_", " ") for kind in kinds))
        out.append(replace(item, path_share=round(share, 4), severity=severity, evidence=(*item.evidence, note)))
    return out


def run_rules(evidence: RunEvidence, rules: tuple[Rule, ...] | None = None, verdict: bool = True,
              registry: Sequence[FamilyEntry] | None = None, near_tie: bool = True) -> Diagnosis:
    """Run every rule of the registry (default :data:`~stepscope.diagnosis.rules.REGISTRY`; or only
    ``rules``), settle failures, precedence and overlapping costs (see the module docstring).
    ``near_tie=False`` leaves the first finding unmarked as a near tie: a job marks its own verdict,
    after merging the ranks' findings (:func:`diagnose_job`)."""
    tables = _tables(registry, rules)
    findings: list[Finding] = []
    failed: list[str] = []
    for rule in tables.rules:
        name = getattr(rule, "__name__", repr(rule))
        try:
            finding = rule(evidence)
        except Exception as exc:  # noqa: BLE001 - isolate rule bugs, see docstring
            import logging  # only here: a rule that fails is rare, and logging costs every report ~5 ms to import

            logging.getLogger(__name__).debug("diagnosis rule %s failed", name, exc_info=True)
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if finding is not None and rules is None and finding.family not in tables.families:
            failed.append(f"{name}: its finding's family {finding.family!r} is not in the registry")
            continue
        if finding is not None:
            findings.append(finding)
    if _no_steps_to_diagnose(evidence):
        findings = [item for item in findings if not (item.impact_measured and item.impact > 0)]
        verdict = False
    kept, superseded = _apply_precedence(findings, tables)
    kept, absorbed = _partition_costs(rank_findings(paced_by_the_loader(kept, evidence)), evidence)
    superseded += absorbed
    kept = rank_findings(_unexplained_left(on_the_path(_crowded(kept, tables), evidence), evidence))
    # a risk (memory running out) is no cost of the step: it stands beside a healthy verdict
    if verdict and not failed and not any(item.severity >= HEALTHY_BELOW and not item.extra.get("risk")
                                          for item in kept):
        healthy = _healthy(evidence, tuple(kept), failed, tables)
        if healthy is not None:
            # the verdict heads a healthy run; a risk that matters (memory running out) before it:
            # with nothing slow, what may end the run is the first thing to say
            risks = [item for item in kept if item.extra.get("risk") and item.severity >= HEALTHY_BELOW]
            kept = [*risks, healthy, *(item for item in kept if item not in risks)]
    shown = explains_little(tuple(calibrated(item) for item in kept))
    if near_tie:
        shown = mark_near_tie(shown, ranked_by_measured_cost)
    return Diagnosis(shown, tuple(superseded), tuple(failed))


#: The rules' own confidence -> how often a top finding of that confidence was right on workloads
#: the rules were not written for: the blind evaluation's generated scripts (two seeds, 76
#: workloads, re-diagnosed with the current rules by benchmarks/blind_rescore.py --calibration;
#: BENCHMARKS.md, "Blind evaluation"), (right + 1) / (verdicts + 2) per band, adjacent bands pooled
#: until monotone: below 0.75, 3 of 5 right; from 0.75, 69 of 71. The zoo's own table (80 runs of
#: the scenarios the rules were tuned on, benchmarks/confidence_calibration.py) had the low band
#: right 17 times in 19: too kind a judge of the rules' weaker verdicts.
CONFIDENCE_MAP: tuple[tuple[float, float], ...] = ((0.0, 0.57), (0.75, 0.96))


#: A top finding whose measured cost is below this share of the step (below HIGH severity) explains
#: little of it: the rest is the model's, as far as any measured cause goes. As the top finding of
#: the blind evaluation's workloads such a finding was right 0 times in 4 (two seeds, 79 workloads,
#: every verdict re-diagnosed with the rules of this table: four "make each sample cheaper" at
#: 9-13 % of the step while a neighbour or a Python thread that slowed the model's own compute
#: gained 22-68 % when removed); from 25 % of the step up, 71 of 76 were right. Such a top finding
#: gets at most :data:`EXPLAINS_LITTLE_CONFIDENCE`, (0 + 1) / (4 + 2), and says why. Findings below
#: a costlier one keep theirs: the calibration is of the verdict, the first finding.
EXPLAINS_LITTLE_BELOW = 0.2
EXPLAINS_LITTLE_CONFIDENCE = 0.17


def calibrated(finding: Finding) -> Finding:
    """The finding with its confidence mapped through :data:`CONFIDENCE_MAP` (the rule's own
    value is kept in ``rule_confidence``)."""
    if finding.rule_confidence is not None:
        return finding  # already calibrated (a job report merges per-rank findings)
    value = next(mapped for low, mapped in reversed(CONFIDENCE_MAP) if finding.confidence >= low)
    return replace(finding, confidence=value, rule_confidence=finding.confidence)


def explains_little(findings: tuple[Finding, ...]) -> tuple[Finding, ...]:
    """The findings with the first one's confidence capped at :data:`EXPLAINS_LITTLE_CONFIDENCE`
    (``extra["explains_little"]``) when it is a measured cost of the step below
    :data:`EXPLAINS_LITTLE_BELOW` (not the healthy verdict, not a risk, not an estimate)."""
    if not findings:
        return findings
    top = findings[0]
    if (not top.impact_measured or top.impact >= EXPLAINS_LITTLE_BELOW or top.family == "healthy"
            or top.extra.get("risk") or top.extra.get("explains_little")):
        return findings
    capped = replace(top, confidence=min(top.confidence, EXPLAINS_LITTLE_CONFIDENCE),
                     extra={**top.extra, "explains_little": True})
    return (capped, *findings[1:])


def _no_steps_to_diagnose(evidence: RunEvidence) -> bool:
    """A run whose steps cannot carry a share of step time: none were captured, or the training
    ran in child processes and this process's steps are not it. Measured shares of step time are
    then dropped (estimates such as a memory growth rate stay) and no healthy verdict is given."""
    record = evidence.record
    if record is None:
        return False
    return evidence.steady is None or bool(getattr(record.facts, "training_in_children", False))


def diagnose(evidence: RunEvidence, rules: tuple[Rule, ...] | None = None, verdict: bool = True) -> list[Finding]:
    """The ranked findings of :func:`run_rules` (most costly first)."""
    return list(run_rules(evidence, rules, verdict).findings)


def _healthy(evidence: RunEvidence, findings: tuple[Finding, ...], failed: list[str],
             tables: Tables) -> Finding | None:
    if tables.verdict is None:
        return None
    try:
        return tables.verdict(evidence, findings)
    except Exception as exc:  # noqa: BLE001 - same isolation as the rules
        failed.append(f"verdict: {type(exc).__name__}: {exc}")
        return None


def _apply_precedence(findings: list[Finding], tables: Tables) -> tuple[list[Finding], list[tuple[Finding, str]]]:
    """A cause makes its symptom moot (:data:`SUPERSEDES`) unless the cause is minor: a LOW
    finding (near its threshold, a few percent of the step) explains no larger finding, so both stay.
    A finding that explains only part of the symptom (``extra["partial"]``: the cold first epoch of
    an input pipeline that still waits once warm) supersedes nothing. A cause whose entry narrows
    ``supersedes_when`` makes the symptom moot only where its test holds."""
    by_family = {item.family: item for item in findings}
    kept, superseded = [], []
    for item in findings:
        winner = next((other for family, other in by_family.items()
                       if item.family in tables.supersedes.get(family, ()) and other is not item
                       and not other.partial and tables.moot_when.get((family, item.family), _always)(other, item)
                       and (other.severity >= Severity.MEDIUM or other.impact >= item.impact)), None)
        if winner is None:
            kept.append(item)
        else:
            superseded.append((item, winner.rule_id))
    return kept, superseded


def _always(cause: Finding, symptom: Finding) -> bool:
    return True


def _crowded(findings: list[Finding], tables: Tables) -> list[Finding]:
    """Lower the confidence of CPU-based findings when other processes loaded the machine."""
    if not any(item.family == "foreign_load" for item in findings):
        return findings
    return [replace(item, confidence=round(item.confidence * CROWDED_CONFIDENCE, 2), crowded_machine=True)
            if item.family in tables.cpu_based else item for item in findings]


def _unexplained_left(findings: list[Finding], evidence: RunEvidence) -> list[Finding]:
    """When the training thread's account leaves part of the step unexplained (off CPU, no measured
    cause), the other findings explain less of the step: their confidence is scaled by the share
    the account does explain, and they say so (``unexplained_share``)."""
    account = evidence.account
    left = account.unexplained if account is not None else 0.0
    if left < UNEXPLAINED_CONFIDENCE_FROM:
        return findings
    return [item if item.family == "unexplained" else
            replace(item, confidence=round(item.confidence * (1.0 - left), 2),
                    extra={**item.extra, "unexplained_share": round(left, 4)}) for item in findings]


#: Unexplained off-CPU time (share of the step) from which the other findings lose confidence.
UNEXPLAINED_CONFIDENCE_FROM = 0.1


#: A finding whose whole cost is already counted by costlier ones (what is left of it is below
#: this share of the step) is listed as superseded by them rather than shown at ~0 %.
ABSORBED_BELOW = 0.005


def _partition_costs(findings: list[Finding],
                     evidence: RunEvidence) -> tuple[list[Finding], list[tuple[Finding, str]]]:
    """Cap measured impacts by what is left of the parts of the step they claim."""
    steady = evidence.steady
    left: dict[str, float] = {"step": 1.0}
    if steady is not None:
        for claim, phases in CLAIM_PHASES.items():
            left[claim] = sum(steady.shares.get(phase, 0.0) for phase in phases)
    out: list[Finding] = []
    absorbed: list[tuple[Finding, str]] = []
    spent_by: dict[str, str] = {}
    for item in findings:
        if not item.impact_measured or item.impact <= 0:
            out.append(item)
            continue
        parts = [claim for claim in item.claims if claim in left and claim != "step"]
        room = min(left["step"], sum(left[claim] for claim in parts) if parts else left["step"])
        impact = min(item.impact, max(0.0, room))
        spend = impact
        for claim in parts:
            used = min(spend, left[claim])
            left[claim] -= used
            spend -= used
            if used > 0:
                spent_by.setdefault(claim, item.rule_id)
        left["step"] -= impact
        if impact < ABSORBED_BELOW <= item.impact:
            owner = next((spent_by[claim] for claim in parts if claim in spent_by), "the costlier findings")
            absorbed.append((item, owner))
            continue
        if impact < item.impact - 1e-9:
            item = replace(item, impact=round(impact, 4), severity=lowered_severity(item, impact),
                           impact_before_overlap=item.impact)
        out.append(item)
    return out, absorbed


DEFAULT_TABLES = Tables.of(REGISTRY)


# -- the job step ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobDiagnosis:
    """Every rank's diagnosis and the job's findings (one rank: that rank's findings)."""

    ranks: tuple[int, ...]
    per_rank: tuple[Diagnosis, ...]  # in the order of ``ranks``
    findings: tuple[Finding, ...]

    def of(self, rank: int) -> Diagnosis:
        return self.per_rank[self.ranks.index(rank)]


def diagnose_job(evidences: Sequence[tuple[int, RunEvidence]],
                 registry: Sequence[FamilyEntry] | None = None) -> JobDiagnosis:
    """The rules on every rank's evidence, then, for several ranks, :func:`merge_findings`. A rank's
    near tie is marked on its own diagnosis only after the merge, which takes the ranks' findings
    unmarked: a finding that tied on its rank need not be the job's verdict, nor tie there."""
    ranks = tuple(rank for rank, _ in evidences)
    several = len(evidences) > 1
    per_rank = tuple(run_rules(evidence, registry=registry, near_tie=not several) for _, evidence in evidences)
    if not several:
        return JobDiagnosis(ranks, per_rank, per_rank[0].findings)
    job_first = JOB_FIRST if registry is None else Tables.of(registry).job_first
    merged = merge_findings(list(zip(ranks, per_rank)), job_first)
    marked = tuple(replace(diagnosis, findings=mark_near_tie(diagnosis.findings, ranked_by_measured_cost))
                   for diagnosis in per_rank)
    return JobDiagnosis(ranks, marked, merged)


def merge_findings(per_rank: list[tuple[int, Diagnosis]],
                   job_first: tuple[str, ...] = JOB_FIRST) -> tuple[Finding, ...]:
    """One finding per rule for the job, naming its ranks (``ranks``; ``rank``: the costliest),
    with the costliest rank's numbers, most costly first; a family of :data:`JOB_FIRST` (from medium
    severity up) before the slow rank's own finding that causes it; a rule healthy on
    some ranks only is left out (the others' findings speak for the job). The job's verdict is
    capped as a rank's is (:func:`explains_little`; a near tie,
    :func:`~stepscope.diagnosis.near_tie.mark_near_tie`), from the ranks' findings before their own
    near ties were marked."""
    groups: dict[str, list[tuple[int, Finding]]] = {}
    for rank, diagnosis in per_rank:
        for finding in diagnosis.findings:
            groups.setdefault(finding.rule_id, []).append((rank, finding))
    merged: list[Finding] = []
    for items in groups.values():
        ranks = tuple(sorted(rank for rank, _ in items))
        worst_rank, worst = max(items, key=lambda item: (item[1].impact, -item[0]))
        if worst.family == "healthy" and len(ranks) < len(per_rank):
            continue
        title = worst.title
        if worst.rank is None:  # a finding about its own rank (a straggler names the slow one itself)
            title = f"{title} — rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        merged.append(replace(worst, title=title, ranks=ranks, rank=worst.rank if worst.rank is not None else worst_rank))
    ranked = rank_findings(_link_causes(merged))
    # cost decides, as on one rank: a straggler's chore that costs the job less than what every rank
    # loses to its own loading is not the first thing to fix. A job-first family (from medium
    # severity) goes ahead of the slow rank's own finding that causes it: one problem, the job's view
    # of it first (a LOW one — a wait in collectives that is the other ranks' loading — stays put)
    out = list(ranked)
    for item in ranked:
        if item.family not in job_first or item.severity < Severity.MEDIUM:
            continue
        causes = [out.index(other) for other in out if other.cause_of == item.rule_id]
        if causes and min(causes) < out.index(item):
            out.remove(item)
            out.insert(min(causes), item)
    return mark_near_tie(explains_little(tuple(out)), ranked_by_measured_cost)


def _link_causes(merged: list[Finding]) -> list[Finding]:
    """A finding about another rank (a straggler) names the families that would be its cause
    (``cause_families``); that rank's own finding of such a family, fired on it alone, says it is
    the cause (``cause_of``, and "why rank R straggles" in its title): both costs are true, each of
    its own rank's step, but they are one problem."""
    about_a_rank = [item for item in merged if item.cause_families and item.rank is not None]
    out = []
    for item in merged:
        cause_of = next((other for other in about_a_rank
                         if item.family in other.cause_families and item.ranks == (other.rank,)), None)
        if cause_of is not None:
            item = replace(item, title=f"{item.title} (why rank {cause_of.rank} straggles)", cause_of=cause_of.rule_id)
        out.append(item)
    return out
