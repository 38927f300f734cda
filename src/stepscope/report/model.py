"""The Report view-model: everything any output shows, computed by the pipeline; renderers format it.

:func:`stepscope.pipeline.diagnose` builds one :class:`Report` for ``stepscope run``, ``report``,
``analyze``, the library API and the integrations. Every section is plain typed data computed
there — the run's summary, the job's rank table, the trace views with their shares and launch
statistics, the critical path, the machine's timelines, the step series for charts — so a renderer
(:mod:`stepscope.report.render`) only formats fields and never computes a number of its own.

The view owns its types: each field a renderer reads is a dataclass of this module or of
:mod:`stepscope.report.run_view` (the run's part: its summary, job, machine and charts, e.g.
:class:`~stepscope.report.run_view.StepTimes`, which a trace's report never builds) holding only
what is shown, a builtin or a numpy array, never an analysis object whose methods or properties would compute in the renderer.
Two kinds of outside types remain, each on purpose: those passed on as they are — the findings
(report.json's schema) and the trace tables' rows (operators, kernels, devices, memory: plain
records with no method but ``to_dict``, thousands of rows a copy would only slow down) — and the
objects kept for library users (:attr:`Report.evidence`, :attr:`Report.diagnosis`,
:attr:`Report.meta`, :attr:`TraceViews.analysis`, each :class:`RankReport`'s), which no renderer
reads (``tests/unit/test_layers.py`` and ``tests/unit/report/test_view_purity.py`` check both).

``report.json`` and ``analyze --format json`` are :meth:`Report.to_dict`: one envelope
(``summary``, ``findings``, ``diagnosis``, ``warnings``) plus the source's sections (schema in
``docs/report-json.md``), the sections that serialise analyses computed by the pipeline
(:class:`JsonSections`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.engine import Diagnosis, risk_of
from stepscope.diagnosis.findings import Finding
from stepscope.lazy_rows import LazyRows
from stepscope.record.phases import PHASES as RECORD_PHASES

if TYPE_CHECKING:  # trace types only annotate: a run without a trace never imports the trace analysis
    from stepscope.record.run import RunMeta
    from stepscope.analysis.trace.gpu_metrics import DeviceSummary
    from stepscope.analysis.trace.kernels import KernelRow
    from stepscope.analysis.trace.memory import AllocatingOperator, DeviceMemory
    from stepscope.analysis.trace.operators import OperatorRow
    from stepscope.analysis.trace.trace_evidence import TraceAnalysis
    from stepscope.report.run_view import (FlameView, JobSummary, MachineTimelines, PerfettoView, RankSteps,
                                           RunSummary, StepSeries, VerificationView)

REPORT_KIND = "stepscope.report"
#: 4: findings carry ``rank``, ``ranks``, ``cause_of``, ``partial``, ``rule_confidence``,
#: ``crowded_machine`` and ``impact_before_overlap`` as keys of their own (they were in ``extra``),
#: and a multi-rank trace report merges one finding per rule naming its ranks (docs/report-json.md).
REPORT_SCHEMA_VERSION = 4

Source = Literal["run", "trace"]
#: The step's phases, in the order every view shows them (the record's columns).
PHASES: tuple[str, ...] = RECORD_PHASES
#: Rows of an operator or kernel table in a page (the largest when a trace has more).
TABLE_ROWS = 2000

__all__ = ["PHASES", "CriticalPathView", "Finding", "JsonSections", "LaunchSummary", "PathSegmentRow",
           "PathStretch", "RankReport", "Report", "RiskLine", "TraceRankView", "TraceViews"]


@dataclass(frozen=True)
class LaunchSummary:
    """HTA's kernel launch statistics of one rank, summarised."""

    count: int
    delay_p50_us: float | None
    short_kernels: int  # kernels shorter than their launch call
    runtime_outliers: int  # launch calls > 50 µs
    delay_outliers: int  # launch delays > 100 µs


@dataclass(frozen=True)
class PathSegmentRow:
    """One row of the critical path's top segments: an event (or a kind of gap) and its path time."""

    name: str
    stream: int  # -1: on the CPU
    label: str  # what bounds it
    why: str  # why it is on the path
    per_step_us: float
    share: float  # of the path
    count: int


@dataclass(frozen=True)
class PathStretch:
    """One stretch of the drawn step's critical path, on its thread or stream."""

    name: str
    bound: str  # what bounds it (a bound kind: the chart's colour)
    label: str  # the bound kind's label
    ts_us: float
    end_us: float
    pid: str
    tid: str  # the thread, or the stream's tid on a device
    stream: int  # -1: on the CPU


class PathStretches(LazyRows[PathStretch]):
    """The drawn step's path stretches as columns, made into :class:`PathStretch` rows on first
    read: the HTML page and the Perfetto overlay read them, the text and JSON outputs never do (a
    long step's path holds ~80,000: MTIA's took 0.15 s to make into rows). ``strings`` holds the
    names, processes and threads, ``kinds`` / ``labels`` the bound kinds and their labels; the
    int columns index them, one value per stretch."""

    __slots__ = ()

    def __init__(self, strings: tuple[str, ...], name: np.ndarray, kinds: tuple[str, ...], labels: tuple[str, ...],
                 kind: np.ndarray, ts_us: np.ndarray, end_us: np.ndarray, pid: np.ndarray, tid: np.ndarray,
                 stream: np.ndarray) -> None:
        super().__init__(len(name), strings, name, kinds, labels, kind, ts_us, end_us, pid, tid, stream)

    def make(self, strings: tuple[str, ...], name: np.ndarray, kinds: tuple[str, ...], labels: tuple[str, ...],
             kind: np.ndarray, ts_us: np.ndarray, end_us: np.ndarray, pid: np.ndarray, tid: np.ndarray,
             stream: np.ndarray) -> tuple[PathStretch, ...]:
        text, codes = strings.__getitem__, kind.tolist()
        return tuple(map(PathStretch, map(text, name.tolist()), map(kinds.__getitem__, codes),
                         map(labels.__getitem__, codes), ts_us.tolist(), end_us.tolist(),
                         map(text, pid.tolist()), map(text, tid.tolist()), stream.tolist()))


@dataclass(frozen=True)
class CriticalPathView:
    """What bounds a traced rank's steps: their critical path, as the views show it."""

    steps: int  # steps analysed
    length_us: float  # the path over those steps
    per_step_us: float
    #: every bound kind -> its label, in display order
    labels: dict[str, str]
    #: the shares worth showing: (kind, label, share) in display order, and largest first
    shares: tuple[tuple[str, str, float], ...]
    shares_ranked: tuple[tuple[str, str, float], ...]
    #: device idle while the path is on the host right after a sync: µs, and share of the path
    after_sync_us: float
    after_sync_share: float
    syncs: tuple[str, ...]  # what the path waited on
    notes: tuple[str, ...]
    segments: tuple[PathSegmentRow, ...]  # longest first
    shown_step: str  # the step drawn on the timeline (the longest path)
    stretches: PathStretches  # that step's path


@dataclass(frozen=True)
class TraceRankView:
    """One rank's trace views, every share computed."""

    rank: int
    path: str
    rank_source: str
    device_name: str | None
    #: (category, mean µs per step, share of the step) in the plugin's order
    categories: tuple[tuple[str, float | None, float | None], ...]
    step_time_us: float | None
    #: (step name, category -> µs) of each step, in order
    per_step_us: tuple[tuple[str, dict[str, float]], ...]
    devices: tuple[DeviceSummary, ...]
    #: HTA's temporal breakdown: (idle, compute, non-compute shares, kernel time µs)
    temporal: tuple[float, float, float, float] | None
    idle_streams: dict[str, float] | None  # HTA's per-stream idle categories, shares of the idle time
    comm_overlap: float | None
    launches: LaunchSummary | None
    host: dict[str, float | None] | None  # share of host time: python, aten, runtime
    memory: tuple[DeviceMemory, ...]
    allocators: tuple[AllocatingOperator, ...]
    operators: tuple[OperatorRow, ...]
    operators_by_shape: bool
    kernels: tuple[KernelRow, ...]
    notes: tuple[str, ...]
    critical: CriticalPathView | None = None  # what bounds the steps: their critical path
    #: the rows a page's operator and kernel tables hold: all of them, or the TABLE_ROWS largest
    #: (host total, total) when there are more
    operators_shown: tuple[OperatorRow, ...] = ()
    kernels_shown: tuple[KernelRow, ...] = ()


@dataclass(frozen=True)
class TraceViews:
    """The trace views a report shows: ``stepscope analyze``'s traces, or a run's profiler window."""

    ranks: tuple[TraceRankView, ...]
    #: (rank, step time µs, GPU idle share, GPU compute share) per rank
    comparison: tuple[tuple[int, float | None, float | None, float | None], ...]
    stragglers: tuple[int, ...]
    from_window: bool  # a run's own --trace window (not part of report.json)
    analysis: TraceAnalysis = field(repr=False, compare=False)  # what report.json serialises


@dataclass(frozen=True)
class RankReport:
    """One rank of a multi-rank report: its evidence and its diagnosis (for library users; no
    renderer reads them, report.json's ``ranks`` is :attr:`JsonSections.ranks`)."""

    rank: int
    evidence: RunEvidence
    diagnosis: Diagnosis


@dataclass(frozen=True)
class JsonSections:
    """The sections of ``report.json`` that serialise analyses, the diagnosis and the record as
    they are (schema in docs/report-json.md): plain data the pipeline computed, which
    :meth:`Report.to_dict` places in the envelope. A report built by hand has none."""

    summary: dict[str, Any] = field(default_factory=dict)  # the steps' counts and statistics, MFU, skips
    diagnosis: dict[str, Any] = field(default_factory=dict)  # of the focus rank
    run: dict[str, Any] | None = None  # the record's meta
    loaders: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    signals: dict[str, Any] | None = None
    trace: dict[str, Any] | None = None  # the focus rank's trace evidence
    ranks: list[dict[str, Any]] = field(default_factory=list)  # every rank's evidence and diagnosis
    trace_analysis: dict[str, Any] | None = None  # ``analyze``'s traces (not a run's own window)
    job: dict[str, Any] | None = None


@dataclass(frozen=True)
class RiskLine:
    """A risk beside the verdict: what it is (``memory runs out in ~4 min``), and the finding
    (1-based number in the report's list) that holds its evidence and prescriptions."""

    what: str
    finding: int
    rule_id: str
    title: str

    def text(self) -> str:
        return f"{self.what} (finding {self.finding}: {self.title})"


def risk_line(findings: tuple[Finding, ...]) -> RiskLine | None:
    item = risk_of(findings)
    if item is None:
        return None
    return RiskLine(str(item.extra["risk"]), findings.index(item) + 1, item.rule_id, item.title)


@dataclass(frozen=True)
class Report:
    """Everything a renderer shows about one run (or one set of traces)."""

    source: Source
    focus_rank: int  # the rank the summary describes
    #: the focus rank's evidence and diagnosis, and its record's meta: for library users (no
    #: renderer reads them; report.json has them as :attr:`sections`)
    evidence: RunEvidence
    diagnosis: Diagnosis
    findings: tuple[Finding, ...]  # the job's (one rank: its own)
    summary: RunSummary | None = None  # a run's (None for traces)
    meta: RunMeta | None = None
    warnings: tuple[str, ...] = ()
    ranks: tuple[RankReport, ...] = ()  # every rank of a job or of several traces
    job: JobSummary | None = None
    traces: TraceViews | None = None
    timelines: MachineTimelines | None = None
    steps: StepSeries | None = None
    #: the other ranks' steady steps (multi-rank runs), for the per-rank chart
    rank_steady: tuple[RankSteps, ...] = ()
    perfetto: PerfettoView | None = field(default=None, compare=False)
    flame: FlameView | None = field(default=None, compare=False)
    verification: dict[str, Any] | None = None
    #: every rule of the focus rank's diagnosis ran (False: one failed, and no verdict is given)
    diagnosis_complete: bool = True
    sections: JsonSections = field(default_factory=JsonSections, compare=False)

    @property
    def verification_view(self) -> VerificationView | None:
        """``run --verify``'s line, judged (None without trials)."""
        if self.verification is None:
            return None
        from stepscope.report.run_view import verification_view

        return verification_view(self.verification)

    @property
    def top_finding(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def risk(self) -> RiskLine | None:
        """The most pressing risk to the run (memory running out) when it is not the verdict: the
        verdict says why the run is slow, this says what may end it."""
        return risk_line(self.findings)

    def to_dict(self) -> dict[str, Any]:
        sections = self.sections
        return {
            "kind": REPORT_KIND,
            "schema_version": REPORT_SCHEMA_VERSION,
            "source": self.source,
            "summary": sections.summary,
            "verdict": _verdict(self.findings),
            "risk": asdict(self.risk) if self.risk is not None else None,
            "findings": [finding.to_dict() for finding in self.findings],
            "diagnosis": sections.diagnosis,
            "warnings": list(self.warnings),
            "run": sections.run,
            "loaders": sections.loaders,
            "facts": sections.facts,
            "evidence": sections.evidence,
            "signals": sections.signals,
            "trace": sections.trace,
            "ranks": sections.ranks,
            "trace_analysis": sections.trace_analysis,
            "job": sections.job,
            "verification": self.verification,
        }


def _verdict(findings: tuple[Finding, ...]) -> dict[str, Any] | None:
    if not findings:
        return None
    top = findings[0]
    return {"family": top.family, "rule_id": top.rule_id, "title": top.title,
            "severity": top.severity.name.lower(), "impact": top.impact}
