"""What a diagnosis says: findings with evidence and prescriptions.

A :class:`Finding` answers *what is wrong, how much it costs, how sure we are, and exactly what to
change*. Findings are plain frozen data; rules build them, renderers format them.

Families are a closed, documented list (part of the ``report.json`` schema): the registry
(:data:`stepscope.diagnosis.rules.REGISTRY`) is that list; a family is added there, with its
module, and nowhere else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum
from typing import Any


class Severity(IntEnum):
    """How much a finding matters; ``--fail-on`` compares against these."""

    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            allowed = ", ".join(level.name.lower() for level in cls)
            from stepscope.errors import UsageError

            raise UsageError(f"unknown severity {text!r}; choose one of: {allowed}") from None


@dataclass(frozen=True)
class Evidence:
    """One measured fact a finding rests on.

    Args:
        metric: stable metric name, e.g. ``"data_wait_share"``.
        value: the measured value (ratios 0..1, durations in seconds, sizes in bytes).
        threshold: the value that made it count (``None`` for context-only evidence).
        source: where it came from: ``"steps"``, ``"sampler"``, ``"trace"``, ``"loader"``, ...
        unit: ``"ratio"``, ``"s"``, ``"bytes"``, ``"count"``, ``"%"``, ... for rendering.
        scope: what it is about, e.g. ``"steady state"``, ``"rank 1"``, ``"loader #0"``.
    """

    metric: str
    value: float | int | str | None
    threshold: float | int | None = None
    source: str = "steps"
    unit: str = "ratio"
    scope: str = ""


@dataclass(frozen=True)
class Prescription:
    """A concrete change: which knob, from what to what, why, and what it costs.

    ``expected_gain`` is the share of step time the change is expected to save, computed from
    the measured times *after* what it takes away (``cost``: e.g. workers take cores from the
    intra-op threads); None when it cannot be computed (then ``why`` says so). ``expected_range``
    is ``(low, high)`` around it: the model's measured error (BENCHMARKS.md, "Worker plan
    calibration"). ``set`` holds the ``stepscope run --set KEY=VALUE`` pairs that apply the
    change to an unmodified script (None for a code change). After ``run --verify``,
    ``measured_gain`` is ``{"median", "low", "high", "trials"}`` (share of the step saved, from
    interleaved trials), and ``withdrawn`` is True when the trials measured no gain beyond noise.
    """

    action: str
    why: str = ""
    setting: str | None = None
    current: Any = None
    suggested: Any = None
    expected_gain: float | None = None
    cost: str = ""
    set: dict[str, Any] | None = None
    expected_range: tuple[float, float] | None = None
    measured_gain: dict[str, float] | None = None
    withdrawn: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``report.json``'s prescription: ``expected_gain`` as ``{"low", "high", "estimate"}``."""
        data = asdict(self)
        expected = data.pop("expected_gain")
        span = data.pop("expected_range")
        data["expected_gain"] = None if expected is None else {
            "low": span[0] if span else expected, "high": span[1] if span else expected, "estimate": expected}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Prescription:
        """Reads both shapes: report schema 3 (``expected_gain`` an object) and older (a number)."""
        fields = dict(data)
        expected = fields.pop("expected_gain", None)
        span = None
        if isinstance(expected, dict):
            span = (float(expected["low"]), float(expected["high"]))
            expected = expected.get("estimate")
        known = {name for name in cls.__dataclass_fields__ if name not in ("expected_gain", "expected_range")}
        kept = {key: value for key, value in fields.items() if key in known}
        return cls(**kept, expected_gain=None if expected is None else float(expected), expected_range=span)


@dataclass(frozen=True)
class Finding:
    """A ranked diagnosis.

    ``impact`` is the share (0..1) of step time the problem costs: the ranking key. It is a
    measured share unless ``impact_basis`` says otherwise (``"estimate: …"`` names what the number
    is, e.g. for memory growth, which costs nothing until memory runs out). ``claims`` names the
    parts of the step the cost lies in (``data_wait``, ``compute``, ``other``, or ``step`` for the
    whole step): the engine keeps the costs of one run's findings from overlapping within them.

    What the engine and the renderers read is typed: ``rank`` (the rank the finding is about: the
    slow rank of a straggler, the costliest rank of a job's finding), ``ranks`` (a job's finding:
    the ranks it fired on), ``cause_of`` (the ``rule_id`` of the job finding this one explains),
    ``cause_families`` (a finding about another rank: the families of that rank's own findings
    that are its cause), ``partial`` (it explains only part of a symptom another family reports,
    which then stays), and the engine's own notes (``rule_confidence``, ``crowded_machine``,
    ``impact_before_overlap``), and ``path_share``, the share of the traced steps' critical path
    the finding's cause owns (the ranking key of a trace's findings). ``extra`` holds the rule's own details for ``report.json`` only.
    """

    rule_id: str
    family: str
    title: str
    severity: Severity
    impact: float
    confidence: float
    evidence: tuple[Evidence, ...] = ()
    prescriptions: tuple[Prescription, ...] = ()
    summary: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    impact_basis: str = "measured"
    claims: tuple[str, ...] = ("step",)
    rank: int | None = None
    ranks: tuple[int, ...] = ()
    cause_of: str | None = None
    cause_families: tuple[str, ...] = ()
    partial: bool = False
    rule_confidence: float | None = None
    crowded_machine: bool = False
    impact_before_overlap: float | None = None
    #: the share of the traced steps' critical path this finding's cause owns (None: no path)
    path_share: float | None = None

    @property
    def impact_measured(self) -> bool:
        return self.impact_basis == "measured"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity.name.lower()
        data["prescriptions"] = [item.to_dict() for item in self.prescriptions]
        data["ranks"] = list(self.ranks)
        data["cause_families"] = list(self.cause_families)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """Reads report schema 4 and older ones (where ``rank``, ``ranks``, ``cause_of``,
        ``partial``, ``rule_confidence``, ``crowded_machine`` and ``impact_before_overlap`` were
        keys of ``extra``)."""
        extra = dict(data.get("extra", {}))
        typed = {item.name for item in fields(cls)} & set(LEGACY_EXTRA_KEYS)
        moved = {key: extra.pop(key) for key in list(extra) if key in typed and key not in data}
        values = {**moved, **{key: data[key] for key in typed if key in data}}
        return cls(
            rule_id=data["rule_id"],
            family=data["family"],
            title=data["title"],
            severity=Severity[str(data["severity"]).upper()],
            impact=float(data["impact"]),
            confidence=float(data["confidence"]),
            evidence=tuple(Evidence(**item) for item in data.get("evidence", ())),
            prescriptions=tuple(Prescription.from_dict(item) for item in data.get("prescriptions", ())),
            summary=data.get("summary", ""),
            extra=extra,
            impact_basis=str(data.get("impact_basis", "measured")),
            claims=tuple(data.get("claims", ("step",))),
            rank=None if values.get("rank") is None else int(values["rank"]),
            ranks=tuple(int(rank) for rank in values.get("ranks") or ()),
            cause_of=values.get("cause_of"),
            cause_families=tuple(data.get("cause_families") or ()),
            partial=bool(values.get("partial", False)),
            rule_confidence=None if values.get("rule_confidence") is None else float(values["rule_confidence"]),
            crowded_machine=bool(values.get("crowded_machine", False)),
            impact_before_overlap=(None if values.get("impact_before_overlap") is None
                                   else float(values["impact_before_overlap"])),
            path_share=None if data.get("path_share") is None else float(data["path_share"]),
        )


#: Keys of ``extra`` in report schemas before 4 that are typed fields now.
LEGACY_EXTRA_KEYS = ("rank", "ranks", "cause_of", "partial", "rule_confidence", "crowded_machine",
                     "impact_before_overlap")


def severity_for_impact(impact: float) -> Severity:
    """Default severity from the share of step time lost (rules may override)."""
    if impact >= 0.5:
        return Severity.CRITICAL
    if impact >= 0.2:
        return Severity.HIGH
    if impact >= 0.05:
        return Severity.MEDIUM
    if impact >= 0.01:
        return Severity.LOW
    return Severity.INFO


def lowered_severity(item: Finding, impact: float) -> Severity:
    """The severity of ``item`` once its impact is lowered to ``impact``: never above what that
    impact warrants, never raised, and INFO (a note) stays INFO."""
    if item.severity == Severity.INFO:
        return item.severity
    return max(Severity.INFO, min(item.severity, severity_for_impact(impact)))
