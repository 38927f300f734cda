"""Scoring a verdict against the ground truth: the mapping table, outcomes, summary, calibration.

The verdict is the top finding of the workload's ``stepscope run`` (``report.json``'s
``findings[0]``) and its primary prescription (the first one not withdrawn). ``MAPPING`` says which
planted factors the change it prescribes removes; the first entry that matches the finding's
family, rule and primary prescription decides. Some findings name code instead (a line, a
function, a thread): their entries map through ``CODE``, the factors whose identifiers
(``Factor.code_names``) appear in the finding's text. A healthy verdict, an "unexplained" account
or no finding at all is an **abstention**; a finding the table does not know is scored by the code
it names, else as wrong (``unmapped``: extend the table).

Outcomes: **right** when the verdict removes the bottleneck (or, when the top gains are within noise
of each other, any of them); **wrong** otherwise; **abstain**; **no bottleneck** when no factor
gains enough to be one (not scored). **Confidently wrong**: wrong with confidence >= 0.8.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from blind.factors import FACTORS
from blind.truth import Truth

#: Stands for "the factors whose code the finding's text names" in a mapping entry.
CODE = ("<named code>",)
CONFIDENTLY = 0.8
#: Families and rule ids that say the verdict is no bottleneck of the run (or none it can name).
ABSTAIN_FAMILIES = frozenset({"healthy"})
ABSTAIN_WORDS = ("unexplained",)
#: Confidence buckets of the calibration table: [low, high).
BUCKETS = ((0.0, 0.5), (0.5, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.01))


@dataclass(frozen=True)
class MapEntry:
    """One row of the mapping table: a finding (its family, optionally its rule, optionally a phrase
    of its primary prescription's action, lower case) → the planted factors that change removes."""

    family: str
    rule_id: str | None
    prescription: str | None
    factors: tuple[str, ...]
    why: str

    def matches(self, finding: dict, action: str) -> bool:
        return (finding.get("family") == self.family
                and (self.rule_id is None or finding.get("rule_id") == self.rule_id)
                and (self.prescription is None or self.prescription in action))


MAPPING: tuple[MapEntry, ...] = (
    MapEntry("input_pipeline", None, "persistent_workers", ("worker_restarts",),
             "workers kept across epochs are started once"),
    MapEntry("input_pipeline", None, "num_workers", ("costly_samples", "slow_reads"),
             "(more) workers overlap each sample's work or wait with the step"),
    MapEntry("input_pipeline", None, "cheaper to produce", ("costly_samples",),
             "cheaper samples remove their CPU work, not a read's latency"),
    MapEntry("input_pipeline", None, "stage it locally", ("slow_reads",), "local data removes the round trip"),
    MapEntry("input_pipeline", None, None, ("costly_samples", "slow_reads"), "the family's other advice is about "
             "producing samples"),
    MapEntry("storage_io", None, None, ("slow_reads",), "staging or prefetching the data hides the reads"),
    MapEntry("launch_overhead", None, None, ("tiny_ops",), "fewer, larger operators"),
    MapEntry("epoch_boundary", None, "persistent_workers", ("worker_restarts",),
             "workers kept across epochs are started once"),
    MapEntry("periodic_stall", None, "persistent_workers", ("worker_restarts",), "the stall is the workers' start"),
    MapEntry("periodic_stall", None, "checkpoint", ("periodic_saves",), "asynchronous or rarer checkpoints"),
    MapEntry("periodic_stall", None, None, CODE, "the stall's own code"),
    MapEntry("memory_pressure", None, None, ("memory_growth",), "what is kept across steps is dropped"),
    MapEntry("foreign_load", None, None, ("neighbour",), "the other process is moved off the machine"),
    MapEntry("garbage_collection", None, None, ("gc_pressure",), "fewer cyclic objects, gc.freeze, a higher "
             "threshold"),
    MapEntry("straggler", None, None, ("slow_rank",), "the slow rank's own work"),
    MapEntry("outside_model", None, None, CODE, "the line it names"),
    MapEntry("gil_contention", None, None, CODE, "the thread it names, which held the GIL"),
    MapEntry("compute", None, None, (), "a larger batch or torch.compile removes no planted factor"),
    MapEntry("communication", None, None, (), "no planted factor is communication: a wait for a peer is its cause"),
    MapEntry("cpu_oversubscription", None, None, (), "fewer threads or workers remove no planted factor"),
    MapEntry("compile", None, None, (), "nothing is compiled"),
    MapEntry("host_device_sync", None, None, (), "no device"),
)


@dataclass(frozen=True)
class Verdict:
    """The top finding of a run, as scored."""

    family: str | None
    rule_id: str | None
    title: str
    confidence: float | None
    impact: float | None
    action: str
    #: the factors the verdict's change removes; None for an abstention
    removes: tuple[str, ...] | None
    #: the mapping row that decided ("<family> [rule] [prescription]"), "abstain" or "unmapped"
    mapped_by: str

    def to_dict(self) -> dict:
        return {"family": self.family, "rule_id": self.rule_id, "title": self.title,
                "confidence": self.confidence, "impact": self.impact, "primary_prescription": self.action,
                "removes": None if self.removes is None else list(self.removes), "mapped_by": self.mapped_by}


def read_verdict(report: dict[str, Any]) -> Verdict:
    """The top finding of ``report.json`` and the factors its primary prescription removes."""
    findings = report.get("findings") or []
    if not findings:
        return Verdict(None, None, "(no finding)", None, None, "", None, "abstain")
    top = findings[0]
    prescriptions = [item for item in top.get("prescriptions") or [] if not item.get("withdrawn")]
    action = str(prescriptions[0].get("action", "")) if prescriptions else ""
    family, rule_id = top.get("family"), top.get("rule_id")
    common = (family, rule_id, str(top.get("title", "")), top.get("confidence"), top.get("impact"), action)
    if family in ABSTAIN_FAMILIES or any(word in f"{family} {rule_id}" for word in ABSTAIN_WORDS):
        return Verdict(*common, None, "abstain")
    removes, mapped_by = map_finding(top, action)
    return Verdict(*common, removes, mapped_by)


def map_finding(finding: dict, action: str) -> tuple[tuple[str, ...], str]:
    """The factors a finding's primary prescription removes, and the mapping row that said so."""
    lowered = action.lower()
    for entry in MAPPING:
        if entry.matches(finding, lowered):
            label = " ".join(part for part in (entry.family, entry.rule_id, entry.prescription and
                                               f"'{entry.prescription}'") if part)
            return (named_code(finding) if entry.factors == CODE else entry.factors), label
    named = named_code(finding)
    return named, "unmapped (by the code it names)" if named else "unmapped"


def named_code(finding: dict) -> tuple[str, ...]:
    """The factors whose code identifiers appear in the finding's title, summary or prescriptions."""
    prescriptions = finding.get("prescriptions") or []
    text = " ".join([str(finding.get("title", "")), str(finding.get("summary", "")),
                     *(f"{item.get('action', '')} {item.get('why', '')}" for item in prescriptions)])
    return tuple(name for name, factor in FACTORS.items()
                 if any(re.search(rf"(?<![\w.]){re.escape(ident)}(?!\w)", text) for ident in factor.code_names))


@dataclass(frozen=True)
class Score:
    outcome: str  # "right", "wrong", "abstain", "no bottleneck"
    confidently_wrong: bool


def score(truth: Truth, verdict: Verdict) -> Score:
    if truth.best is None:
        return Score("no bottleneck", False)
    if verdict.removes is None:
        return Score("abstain", False)
    if set(verdict.removes) & set(truth.tied):
        return Score("right", False)
    return Score("wrong", (verdict.confidence or 0.0) >= CONFIDENTLY)


def summarise(rows: list[dict]) -> dict:
    """Accuracy, abstentions and confidently wrong verdicts over the scored workloads (those with a
    bottleneck and a verdict), and the confidence calibration of the answered ones."""
    outcomes = [row["outcome"] for row in rows]
    scored = [row for row in rows if row["outcome"] in ("right", "wrong", "abstain")]
    answered = [row for row in scored if row["outcome"] != "abstain"]
    right = sum(row["outcome"] == "right" for row in scored)
    confident = sum(bool(row.get("confidently_wrong")) for row in scored)
    return {
        "workloads": len(rows), "scored": len(scored),
        "right": right, "wrong": len(answered) - right, "abstain": len(scored) - len(answered),
        "no_bottleneck": outcomes.count("no bottleneck"), "errors": outcomes.count("error"),
        "accuracy": _share(right, len(scored)), "accuracy_when_answered": _share(right, len(answered)),
        "abstention_rate": _share(len(scored) - len(answered), len(scored)),
        "confidently_wrong": confident, "confidently_wrong_rate": _share(confident, len(scored)),
        "top_within_noise": sum(len(row["truth"]["within_noise"]) > 1 for row in scored),
        "calibration": calibration(answered),
    }


def calibration(answered: list[dict]) -> list[dict]:
    """Per confidence bucket of the top finding: how many verdicts, how many right."""
    table = []
    for low, high in BUCKETS:
        inside = [row for row in answered if low <= (row["verdict"]["confidence"] or 0.0) < high]
        right = sum(row["outcome"] == "right" for row in inside)
        confidences = [row["verdict"]["confidence"] or 0.0 for row in inside]
        table.append({"bucket": f"{low:.0%}-{min(high, 1.0):.0%}", "verdicts": len(inside), "right": right,
                      "right_share": _share(right, len(inside)),
                      "mean_confidence": round(sum(confidences) / len(confidences), 3) if confidences else None})
    return table


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None
