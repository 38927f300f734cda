"""The Report: summary + findings of one run, computed once; renderers only format it.

``report.json`` is :meth:`Report.to_dict` (schema documented in ``docs/report-json.md``). A saved
run re-renders exactly: :func:`build_report` is a pure function of the record (and its samples).
"""

from __future__ import annotations

import logging
from pathlib import Path
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stepscope.analysis.run.steady import StepStats, excluded_steps, step_stats, steady_mask, warmup_count
from stepscope.diagnosis.findings import Finding
from stepscope.record.run import RunRecord

REPORT_KIND = "stepscope.report"
REPORT_SCHEMA_VERSION = 1

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    """Everything a renderer shows about one run."""

    run: dict[str, Any]
    total_steps: int
    warmup_steps: int
    excluded_steps: tuple[int, ...]
    steady: StepStats
    warmup: StepStats
    loaders: tuple[dict[str, Any], ...]
    findings: tuple[Finding, ...]
    signals: Any = None
    warnings: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def top_finding(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": REPORT_KIND,
            "schema_version": REPORT_SCHEMA_VERSION,
            "run": self.run,
            "steps": {"total": self.total_steps, "warmup": self.warmup_steps,
                      "steady": self.steady.count, "excluded": list(self.excluded_steps)},
            "steady_state": self.steady.to_dict(),
            "warmup": self.warmup.to_dict(),
            "loaders": list(self.loaders),
            "findings": [finding.to_dict() for finding in self.findings],
            "verdict": _verdict(self.findings),
            "signals": self.signals.to_dict() if self.signals is not None else None,
            "warnings": list(self.warnings),
            "extra": self.extra,
        }


def _verdict(findings: tuple[Finding, ...]) -> dict[str, Any] | None:
    if not findings:
        return None
    top = findings[0]
    return {"family": top.family, "rule_id": top.rule_id, "title": top.title,
            "severity": top.severity.name.lower(), "impact": top.impact}


def _run_info(record: RunRecord) -> dict[str, Any]:
    meta = record.meta
    info = asdict(meta)
    info["wall_s"] = meta.wall_s
    return info


def compute_signals(record: RunRecord) -> Any:
    """The sampler's derived signals for this record, or None without samples."""
    if record.samples is None:
        return None
    from stepscope.analysis.run.signals import compute_signals as derive

    return derive(record.samples, record.steps)


def run_diagnosis(record: RunRecord, signals: Any, trace: Any = None) -> list[Finding]:
    from stepscope.diagnosis.engine import build_context, diagnose

    return diagnose(build_context(record, signals, trace))


def trace_evidence(record: RunRecord, run_dir: str | Path | None) -> tuple[Any, list[str]]:
    """TraceEvidence from the run's torch.profiler window (``stepscope run --trace``), with notes."""
    windows = [window for window in record.profiler_windows if window.trace_path]
    if not windows or run_dir is None:
        return None, []
    from stepscope.analysis.trace.rank_analysis import analyze_rank, rank_evidence
    from stepscope.errors import StepscopeError
    from stepscope.traces.load import load_trace

    path = Path(run_dir) / windows[-1].trace_path
    try:
        return rank_evidence(analyze_rank(load_trace(path))), []
    except (StepscopeError, OSError) as exc:
        return None, [f"profiler window trace not analyzed: {exc}"]


def build_report(record: RunRecord, *, trace: Any = None, run_dir: str | Path | None = None) -> Report:
    """Compute the report of a run (pure: same record and files, same report).

    Args:
        record: the run record.
        trace: TraceEvidence to use; by default the run's own profiler window is analyzed when
            ``run_dir`` is given.
        run_dir: the run directory (where the profiler window's trace lives).
    """
    notes: list[str] = []
    if trace is None:
        trace, notes = trace_evidence(record, run_dir)
    steps = record.steps
    warm = warmup_count(steps.duration_ns)
    mask = steady_mask(record)
    warm_mask = np.zeros(len(steps), dtype=bool)
    warm_mask[:warm] = True
    signals = compute_signals(record)
    findings = tuple(run_diagnosis(record, signals, trace))
    return Report(
        run=_run_info(record),
        total_steps=len(steps),
        warmup_steps=warm,
        excluded_steps=tuple(excluded_steps(record)),
        steady=step_stats(steps.select(mask)),
        warmup=step_stats(steps.select(warm_mask)),
        loaders=tuple(asdict(loader) for loader in record.loaders),
        findings=findings,
        signals=signals,
        warnings=(*record.warnings, *notes),
        extra={"facts": asdict(record.facts), "trace": trace.to_dict() if trace is not None else None},
    )
