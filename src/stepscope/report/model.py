"""The Report: everything a renderer shows, computed once; renderers only format it.

One :class:`Report` serves ``stepscope run``, ``stepscope report`` and ``stepscope analyze``: its
numbers come from the evidence bundle (:class:`~stepscope.analysis.bundle.RunEvidence`, one per
rank) and the diagnosis (:class:`~stepscope.diagnosis.engine.Diagnosis`). ``report.json`` and
``analyze --format json`` are :meth:`Report.to_dict`: one envelope (``summary``, ``findings``,
``diagnosis``, ``warnings``) plus the source's sections (schema in ``docs/report-json.md``).

:func:`build_report` (a run record) and :func:`build_trace_report` (a trace analysis) are pure:
the same inputs give the same report, so a saved run re-renders exactly.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from stepscope.analysis.bundle import RunEvidence, build_evidence
from stepscope.analysis.evidence import MacroSignals, TraceEvidence
from stepscope.analysis.run.steady import StepStats, step_stats
from stepscope.analysis.run.timelines import SystemTimelines, system_timelines
from stepscope.analysis.trace.trace_evidence import TraceAnalysis
from stepscope.diagnosis.engine import Diagnosis, rank_findings, run_rules
from stepscope.diagnosis.findings import Finding
from stepscope.record.run import LoaderInfo, RunMeta, RunRecord, SkippedSamples, StepTable

REPORT_KIND = "stepscope.report"
REPORT_SCHEMA_VERSION = 3

logger = logging.getLogger(__name__)

Source = Literal["run", "trace"]

_EMPTY_STATS = step_stats(StepTable.empty())


@dataclass(frozen=True)
class RankReport:
    """One rank of a multi-rank report: its evidence and its diagnosis."""

    rank: int
    evidence: RunEvidence
    diagnosis: Diagnosis

    def to_dict(self) -> dict[str, Any]:
        steady = self.evidence.steady
        return {"rank": self.rank, "steady_state": steady.steady.to_dict() if steady is not None else None,
                "trace": self.evidence.trace.to_dict() if self.evidence.trace is not None else None,
                "evidence": self.evidence.to_dict(), "diagnosis": self.diagnosis.to_dict(),
                "findings": [item.to_dict() for item in self.diagnosis.findings]}


@dataclass(frozen=True)
class SkipSummary:
    """Samples the script's ``SkipBadSamples`` datasets replaced because they failed to load."""

    total: int
    delivered: int | None  # samples in the recorded steps' batches (None when not inferred)
    datasets: tuple[SkippedSamples, ...]

    @property
    def share(self) -> float | None:
        """Skipped per delivered sample: each skip trained on a neighbour's sample instead."""
        return self.total / self.delivered if self.delivered else None

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "delivered": self.delivered, "share": self.share,
                "datasets": [asdict(item) for item in self.datasets]}


@dataclass(frozen=True)
class Report:
    """Everything a renderer shows about one run (or one set of traces)."""

    source: Source
    evidence: RunEvidence  # the rank the summary describes
    diagnosis: Diagnosis
    findings: tuple[Finding, ...]  # the job's findings (all ranks' for traces, each naming its rank)
    warnings: tuple[str, ...] = ()
    trace_analysis: TraceAnalysis | None = None
    ranks: tuple[RankReport, ...] = ()
    #: the views of a run's own torch.profiler window (``stepscope run --trace``); not in to_dict()
    window_analysis: TraceAnalysis | None = field(default=None, compare=False)
    #: a multi-rank job merged by :func:`stepscope.report.job.build_job_report`: the rank table,
    #: the spread, the missing ranks (a :class:`stepscope.report.job.JobSummary`)
    job: Any = None
    #: ``stepscope run --verify``: the trials of the prescriptions (``stepscope.verify.Verification.to_dict()``)
    verification: dict[str, Any] | None = None

    # -- what renderers read ------------------------------------------------------------------
    @property
    def meta(self) -> RunMeta | None:
        return self.evidence.record.meta if self.evidence.record is not None else None

    @property
    def loaders(self) -> tuple[LoaderInfo, ...]:
        return self.evidence.loaders

    @property
    def signals(self) -> MacroSignals | None:
        return self.evidence.signals

    @property
    def trace(self) -> TraceEvidence | None:
        return self.evidence.trace

    @property
    def total_steps(self) -> int:
        return self.evidence.steady.step_count if self.evidence.steady is not None else 0

    @property
    def warmup_steps(self) -> int:
        return self.evidence.steady.warmup_steps if self.evidence.steady is not None else 0

    @property
    def excluded_steps(self) -> tuple[int, ...]:
        return self.evidence.steady.excluded if self.evidence.steady is not None else ()

    @property
    def steady(self) -> StepStats:
        return self.evidence.steady.steady if self.evidence.steady is not None else _EMPTY_STATS

    @property
    def warmup(self) -> StepStats:
        return self.evidence.steady.warmup if self.evidence.steady is not None else _EMPTY_STATS

    @property
    def measured_phases(self) -> tuple[str, ...]:
        """Phases measured in the run (the others are "not measured", never 0 %)."""
        steady = self.evidence.steady
        return steady.measured_phases if steady is not None else ()

    @property
    def samples_per_step(self) -> int | None:
        """The batch size actually used: the mode of samples per steady step."""
        return self.evidence.steady.samples_per_step if self.evidence.steady is not None else None

    @property
    def inference(self) -> bool:
        record = self.evidence.record
        return bool(record is not None and record.facts.inference and not record.facts.training_in_children)

    @property
    def training_in_children(self) -> bool:
        """The training ran in child processes: this record's steps are not it (not diagnosed)."""
        record = self.evidence.record
        return bool(record is not None and record.facts.training_in_children)

    @property
    def skipped_samples(self) -> SkipSummary | None:
        """What ``stepscope.data.SkipBadSamples`` skipped, over every rank's record (None when the
        script used none)."""
        records = [item.evidence.record for item in self.ranks if item.evidence.record is not None]
        if not records and self.evidence.record is not None:
            records = [self.evidence.record]
        datasets = tuple(item for record in records for item in record.facts.skipped_samples)
        if not datasets:
            return None
        delivered: int | None = 0
        for record in records:
            samples = record.steps.samples
            if delivered is None or not len(samples) or (samples < 0).any():
                delivered = None
            else:
                delivered += int(samples.sum())
        return SkipSummary(sum(item.total for item in datasets), delivered, datasets)

    @property
    def top_finding(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def trace_views(self) -> TraceAnalysis | None:
        """The trace views to show: the analyzed traces, or a run's own profiler window."""
        return self.trace_analysis if self.trace_analysis is not None else self.window_analysis

    @cached_property
    def timelines(self) -> SystemTimelines | None:
        """The sampler's per-interval machine series (None without samples), computed on first use."""
        record = self.evidence.record
        return system_timelines(record.samples) if record is not None else None

    def to_dict(self) -> dict[str, Any]:
        ev = self.evidence
        return {
            "kind": REPORT_KIND,
            "schema_version": REPORT_SCHEMA_VERSION,
            "source": self.source,
            "summary": self._summary(),
            "verdict": _verdict(self.findings),
            "findings": [finding.to_dict() for finding in self.findings],
            "diagnosis": self.diagnosis.to_dict(),
            "warnings": list(self.warnings),
            "run": _run_info(self.meta),
            "loaders": [asdict(loader) for loader in self.loaders],
            "facts": asdict(ev.facts),
            "evidence": ev.to_dict(),
            "signals": ev.signals.to_dict() if ev.signals is not None else None,
            "trace": ev.trace.to_dict() if ev.trace is not None else None,
            "ranks": [item.to_dict() for item in self.ranks],
            "trace_analysis": self.trace_analysis.to_dict() if self.trace_analysis is not None else None,
            "job": self.job.to_dict() if self.job is not None else None,
            "verification": self.verification,
        }

    def _summary(self) -> dict[str, Any]:
        steady = self.evidence.steady
        return {
            "steps": {"total": self.total_steps, "warmup": self.warmup_steps,
                      "steady": steady.steady_count if steady is not None else 0,
                      "excluded": list(self.excluded_steps)},
            "steady_state": self.steady.to_dict(),
            "warmup": self.warmup.to_dict(),
            "fetch_wait_share": steady.fetch_wait_share if steady is not None else None,
            "samples_per_step": steady.samples_per_step if steady is not None else None,
            "measured_phases": list(self.measured_phases),
            "step_source": self.meta.step_source if self.meta is not None else None,
            "inference": self.inference,
            "training_in_children": self.training_in_children,
            "mfu": asdict(self.evidence.mfu) if self.evidence.mfu is not None else None,
            "mfu_note": self.evidence.mfu_note,
            "skipped_samples": skipped.to_dict() if (skipped := self.skipped_samples) is not None else None,
        }


def _verdict(findings: tuple[Finding, ...]) -> dict[str, Any] | None:
    if not findings:
        return None
    top = findings[0]
    return {"family": top.family, "rule_id": top.rule_id, "title": top.title,
            "severity": top.severity.name.lower(), "impact": top.impact}


def _run_info(meta: RunMeta | None) -> dict[str, Any] | None:
    if meta is None:
        return None
    info = asdict(meta)
    info["wall_s"] = meta.wall_s
    return info


def _diagnosis_warnings(diagnosis: Diagnosis) -> tuple[str, ...]:
    return tuple(f"diagnosis incomplete: rule {item}" for item in diagnosis.failed_rules)


def run_trace_evidence(record: RunRecord, run_dir: str | Path | None) -> tuple[TraceEvidence | None, list[str]]:
    """TraceEvidence from the run's torch.profiler window (``stepscope run --trace``), with notes."""
    analysis, notes = run_trace_window(record, run_dir)
    return (analysis.evidence() if analysis is not None else None), notes


def run_trace_window(record: RunRecord, run_dir: str | Path | None) -> tuple[TraceAnalysis | None, list[str]]:
    """The trace views of the run's torch.profiler window (``stepscope run --trace``), with notes."""
    windows = [window for window in record.profiler_windows if window.trace_path]
    if not windows or run_dir is None:
        return None, []
    from stepscope.analysis.trace.trace_evidence import analyze_traces
    from stepscope.errors import StepscopeError

    path = Path(run_dir) / str(windows[-1].trace_path)
    try:
        return analyze_traces(path), []
    except (StepscopeError, OSError) as exc:
        return None, [f"profiler window trace not analyzed: {exc}"]


def build_report(record: RunRecord, *, trace: TraceEvidence | None = None, run_dir: str | Path | None = None,
                 ranks: tuple[RunRecord, ...] = ()) -> Report:
    """The report of a run (pure: same record and files, same report).

    Args:
        record: the run record (with its samples attached, when it has them).
        trace: TraceEvidence to use; by default the run's own profiler window is analyzed when
            ``run_dir`` is given.
        run_dir: the run directory (where the profiler window's trace lives).
        ranks: every rank's record of the job, for cross-rank rules (stragglers).
    """
    notes: list[str] = []
    window: TraceAnalysis | None = None
    if trace is None:
        window, notes = run_trace_window(record, run_dir)
        trace = window.evidence() if window is not None else None
    evidence = build_evidence(record, trace=trace, ranks=ranks)
    diagnosis = run_rules(evidence)
    return Report(source="run", evidence=evidence, diagnosis=diagnosis, findings=diagnosis.findings,
                  warnings=(*record.warnings, *notes, *_diagnosis_warnings(diagnosis)), window_analysis=window)


def build_trace_report(analysis: TraceAnalysis, ranks: list[int] | None = None) -> Report:
    """The report of ``stepscope analyze``: each rank's trace evidence diagnosed; the job's findings
    are every rank's, each naming its rank when there are several."""
    if ranks is not None:
        keep = [index for index, item in enumerate(analysis.ranks) if item.rank in ranks]
        analysis = replace(analysis, ranks=tuple(analysis.ranks[i] for i in keep),
                           evidences=tuple(analysis.evidences[i] for i in keep) if analysis.evidences else ())
    shown = analysis.ranks
    per_rank = []
    for item in shown:
        evidence = build_evidence(trace=analysis.evidence(item.rank))
        per_rank.append(RankReport(item.rank, evidence, run_rules(evidence)))
    several = len(per_rank) > 1
    findings = tuple(rank_findings([
        replace(finding, extra={**finding.extra, "rank": part.rank}) if several else finding
        for part in per_rank for finding in part.diagnosis.findings]))
    first = per_rank[0] if per_rank else RankReport(0, RunEvidence(), Diagnosis(()))
    warnings = tuple(f"rank {part.rank}: {text}" if several else text
                     for part in per_rank for text in _diagnosis_warnings(part.diagnosis))
    return Report(source="trace", evidence=first.evidence, diagnosis=first.diagnosis, findings=findings,
                  warnings=warnings, trace_analysis=analysis, ranks=tuple(per_rank))
