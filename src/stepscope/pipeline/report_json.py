"""The sections of ``report.json`` that serialise analyses as they are: the summary's statistics, the
focus rank's evidence and diagnosis, the record's meta, every rank's, the job's table, ``analyze``'s
traces (schema in ``docs/report-json.md``).

They are computed here, with the rest of the view-model, so that :meth:`Report.to_dict
<stepscope.report.model.Report.to_dict>` only places plain data in its envelope: the JSON renderer
reads no analysis object, like every other renderer. What a section holds is each analysis's own
``to_dict`` (or its fields), unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from stepscope.analysis.bundle import RunEvidence
from stepscope.analysis.run.steady import StepStats
from stepscope.diagnosis.engine import Diagnosis
from stepscope.record.phases import PHASES
from stepscope.report.model import JsonSections, RankReport

if TYPE_CHECKING:  # only a trace brings the trace analysis in (start-up of `run`), only a run its views
    from stepscope.record.facts import CaptureFacts
    from stepscope.record.run import RunMeta
    from stepscope.analysis.trace.trace_evidence import TraceAnalysis
    from stepscope.pipeline.views import JobTable
    from stepscope.report.run_view import RunSummary

_EMPTY_PHASES = {phase: 0.0 for phase in PHASES}
#: What a report without a run (traces) says of MFU.
NO_RECORD_MFU = "no run record: MFU needs capture's FLOP count"


def json_sections(evidence: RunEvidence, diagnosis: Diagnosis, summary: RunSummary | None, *,
                  meta: RunMeta | None = None, ranks: Sequence[RankReport] = (), job: JobTable | None = None,
                  traces: TraceAnalysis | None = None) -> JsonSections:
    """report.json's sections of the focus rank's ``evidence`` and ``diagnosis`` (``summary``: its
    summary, None for traces), the record's ``meta``, every rank's report, the ``job``'s table and
    ``analyze``'s ``traces`` (not a run's own window)."""
    return JsonSections(
        summary=summary_json(summary, evidence),
        diagnosis=diagnosis.to_dict(),
        run=None if meta is None else {**asdict(meta), "wall_s": meta.wall_s},
        loaders=[asdict(loader) for loader in evidence.loaders],
        facts=facts_json(evidence.facts),
        evidence=evidence.to_dict(),
        signals=evidence.signals.to_dict() if evidence.signals is not None else None,
        trace=evidence.trace.to_dict() if evidence.trace is not None else None,
        ranks=[rank_json(item) for item in ranks],
        trace_analysis=traces.to_dict() if traces is not None else None,
        job=None if job is None else job_json(job),
    )


def facts_json(facts: CaptureFacts) -> dict[str, Any]:
    """``facts``: the record's facts, the workers' batches counted rather than listed (their rows
    stay in the record; ``evidence.loader_floor`` is their steady window)."""
    out = asdict(facts)
    timed = facts.worker_batches
    out["worker_batches"] = None if timed is None else {"batches": len(timed), "workers": len(set(timed.pid))}
    return out


def summary_json(summary: RunSummary | None, evidence: RunEvidence) -> dict[str, Any]:
    """``summary``: the steps' counts, the steady state's and the warm-up's statistics, MFU, skipped
    samples (all empty for traces)."""
    if summary is None:
        empty = StepStats(0, 0.0, None, None, None, None, None, None, None, dict(_EMPTY_PHASES),
                          dict(_EMPTY_PHASES), 0.0).to_dict()
        return {"steps": {"total": 0, "warmup": 0, "steady": 0, "excluded": []}, "steady_state": empty,
                "warmup": empty, "fetch_wait_share": None, "samples_per_step": None, "measured_phases": [],
                "step_source": None, "inference": False, "training_in_children": False, "mfu": None,
                "mfu_note": NO_RECORD_MFU, "skipped_samples": None}
    from stepscope.pipeline.views import EMPTY_STATS

    steady = evidence.steady
    return {
        "steps": {"total": summary.total_steps, "warmup": summary.warmup_steps, "steady": summary.steady_steps,
                  "excluded": list(summary.excluded_steps)},
        "steady_state": (steady.steady if steady is not None else EMPTY_STATS).to_dict(),
        "warmup": (steady.warmup if steady is not None else EMPTY_STATS).to_dict(),
        "fetch_wait_share": summary.fetch_wait_share,
        "samples_per_step": summary.samples_per_step,
        "measured_phases": list(summary.measured_phases),
        "step_source": summary.step_source,
        "inference": summary.inference,
        "training_in_children": summary.training_in_children,
        "mfu": asdict(evidence.mfu) if evidence.mfu is not None else None,
        "mfu_note": summary.mfu_note,
        "skipped_samples": summary.skipped.to_dict() if summary.skipped is not None else None,
    }


def rank_json(item: RankReport) -> dict[str, Any]:
    """One rank of ``ranks``: its steady state, trace evidence, evidence, diagnosis and findings."""
    steady = item.evidence.steady
    return {"rank": item.rank, "steady_state": steady.steady.to_dict() if steady is not None else None,
            "trace": item.evidence.trace.to_dict() if item.evidence.trace is not None else None,
            "evidence": item.evidence.to_dict(), "diagnosis": item.diagnosis.to_dict(),
            "findings": [finding.to_dict() for finding in item.diagnosis.findings]}


def job_json(job: JobTable) -> dict[str, Any]:
    """``job``: every rank's row, their spread, the ranks without a record, the first failure."""
    return {"world_size": job.world_size, "ranks": [row.to_dict() for row in job.rows],
            "spread": job.spread.to_dict() if job.spread is not None else None,
            "missing": [item.to_dict() for item in job.missing],
            "failure": job.failure.to_dict() if job.failure is not None else None}


__all__ = ["json_sections", "job_json", "rank_json", "summary_json"]
