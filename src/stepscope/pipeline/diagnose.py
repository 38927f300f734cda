"""The diagnosis: :func:`diagnose` turns :class:`~stepscope.pipeline.inputs.JobInputs` into a
:class:`~stepscope.report.model.Report`. It is the only caller of the diagnosis engine.

Step by step, for a run (one rank or a job):

1. Each rank's basis once (:func:`~stepscope.analysis.bundle.rank_basis`): its steady state, its
   steady window, the sampler's signals over that window, its code attribution, and how the other
   ranks see it.
2. Every rank's evidence (:func:`~stepscope.analysis.bundle.job_evidence`), all with the same
   facts about the others: the job's ranks for the cross-rank rules, the ranks on the same machine
   taken out of foreign load; each rank's ``--trace`` window as its trace evidence.
3. The engine (:func:`~stepscope.diagnosis.engine.diagnose_job`): the rules per rank, then the job
   step (one finding per rule naming its ranks, cross-rank causes first).
4. The view-model: the summary of the focus rank (the lowest, or ``ReportOptions.focus``), the
   job's rank table, the machine's timelines, the step series, the window's trace views, and —
   when an output asks for them — the Perfetto timeline and the folded stacks of a phase; and
   report.json's sections that serialise the analyses (:mod:`stepscope.pipeline.report_json`).
5. ``--verify``'s trials, when the run has them, replace estimated gains by measured ones.

For traces (``stepscope analyze``) steps 1–2 are each rank's trace evidence alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from stepscope.analysis.bundle import RunEvidence, job_evidence, rank_basis, trace_evidence
from stepscope.diagnosis.engine import Diagnosis, JobDiagnosis, diagnose_job
from stepscope.errors import UsageError
from stepscope.pipeline.inputs import JobInputs
from stepscope.pipeline.report_json import json_sections
from stepscope.pipeline.trace_views import trace_views
from stepscope.record.phases import PHASES
from stepscope.report.model import RankReport, Report

if TYPE_CHECKING:  # the trace analysis is imported where a trace is read (start-up of `run`), the run's
    # views where a run is reported (`analyze` builds none), the run record's classes where one is read
    from stepscope.record.run import RunRecord
    from stepscope.analysis.trace.trace_evidence import TraceAnalysis
    from stepscope.report.run_view import FlameView, PerfettoView


@dataclass(frozen=True)
class ReportOptions:
    """What a report is for: the rank it describes, and the costly sections an output needs.

    Args:
        focus: the rank the summary describes (default: the lowest); with ``analyze``, the only
            rank analysed and shown.
        perfetto: build the merged Perfetto timeline (reads the profiler windows' events).
        flame: the phase whose folded stacks ``--flame`` prints.
    """

    focus: int | None = None
    perfetto: bool = False
    flame: str | None = None


def diagnose(inputs: JobInputs, options: ReportOptions = ReportOptions()) -> Report:
    """The report of ``inputs`` (see the module docstring)."""
    if inputs.source == "trace":
        assert inputs.traces is not None
        return _trace_report(inputs.traces, options)
    return _run_report(inputs, options)


def _run_report(inputs: JobInputs, options: ReportOptions) -> Report:
    from stepscope.pipeline import views

    records = inputs.records
    ranks = inputs.ranks
    focus = _focus(options.focus, ranks)
    bases = [inputs.bases.get(record.meta.rank) or rank_basis(record) for record in records]
    windows = {rank: analysis.evidence() for rank, analysis in inputs.windows.items()}
    evidences = job_evidence(bases, windows)
    job = diagnose_job(list(zip(ranks, evidences)))
    index = ranks.index(focus)
    evidence, diagnosis = evidences[index], job.per_rank[index]
    several = inputs.is_job
    findings = job.findings if options.focus is None or not several else diagnosis.findings
    record = records[index]
    timelines = views.timelines_of(record)
    series = views.step_series(evidence, timelines)
    window = inputs.windows.get(focus)
    summary = views.run_summary(evidence, records, findings)
    rank_reports = tuple(RankReport(rank, ev, diag) for rank, ev, diag in zip(ranks, evidences, job.per_rank)) \
        if several else ()
    table = views.job_table(evidences, job.per_rank, inputs.missing, inputs.world_size) if several else None
    report = Report(
        source="run", focus_rank=focus, evidence=evidence, diagnosis=diagnosis, findings=findings,
        summary=summary, meta=record.meta, warnings=_run_warnings(inputs, job, several), ranks=rank_reports,
        job=views.job_summary(table) if table is not None else None,
        traces=trace_views(window, from_window=True) if window is not None else None,
        timelines=views.machine_timelines(timelines), steps=series, rank_steady=views.rank_steps(evidence.ranks),
        perfetto=_perfetto(inputs, evidences) if options.perfetto else None,
        flame=_flame(record, options.flame) if options.flame is not None else None,
        diagnosis_complete=diagnosis.complete,
        sections=json_sections(evidence, diagnosis, summary, meta=record.meta, ranks=rank_reports, job=table),
    )
    if inputs.verification is not None:
        from stepscope import verify

        report = verify.apply_to_report(report, inputs.verification)
    return report


def _trace_report(analysis: TraceAnalysis, options: ReportOptions) -> Report:
    if options.focus is not None:
        analysis.rank(options.focus)  # UsageError when absent
        keep = [index for index, item in enumerate(analysis.ranks) if item.rank == options.focus]
        analysis = replace(analysis, ranks=tuple(analysis.ranks[i] for i in keep),
                           evidences=tuple(analysis.evidences[i] for i in keep) if analysis.evidences else ())
    ranks = tuple(item.rank for item in analysis.ranks)
    evidences = [trace_evidence(analysis.evidence(rank)) for rank in ranks]
    job = diagnose_job(list(zip(ranks, evidences))) if ranks else JobDiagnosis((), (), ())
    first_evidence = evidences[0] if evidences else RunEvidence()
    first = job.per_rank[0] if ranks else Diagnosis(())
    several = len(ranks) > 1
    warnings = tuple(f"rank {rank}: {text}" if several else text
                     for rank, diagnosis in zip(ranks, job.per_rank) for text in _diagnosis_warnings(diagnosis))
    rank_reports = tuple(RankReport(rank, ev, diag) for rank, ev, diag in zip(ranks, evidences, job.per_rank))
    return Report(source="trace", focus_rank=ranks[0] if ranks else 0, evidence=first_evidence, diagnosis=first,
                  findings=job.findings, warnings=warnings, ranks=rank_reports,
                  traces=trace_views(analysis, from_window=False), diagnosis_complete=first.complete,
                  sections=json_sections(first_evidence, first, None, ranks=rank_reports, traces=analysis))


def _focus(asked: int | None, ranks: tuple[int, ...]) -> int:
    if asked is None:
        return ranks[0]
    if asked not in ranks:
        raise UsageError(f"no record for rank {asked} (ranks present: {', '.join(map(str, ranks))})")
    return asked


def _diagnosis_warnings(diagnosis: Diagnosis) -> tuple[str, ...]:
    return tuple(f"diagnosis incomplete: rule {item}" for item in diagnosis.failed_rules)


def _run_warnings(inputs: JobInputs, job: JobDiagnosis, several: bool) -> tuple[str, ...]:
    if not several:
        record = inputs.records[0]
        return (*record.warnings, *inputs.notes, *_diagnosis_warnings(job.per_rank[0]))
    warnings = [f"rank {item.rank} missing: {item.reason}" for item in inputs.missing]
    warnings += list(inputs.notes)
    for record, diagnosis in zip(inputs.records, job.per_rank):
        rank = record.meta.rank
        warnings += [f"rank {rank}: {text}" for text in (*record.warnings, *_diagnosis_warnings(diagnosis))]
    return tuple(dict.fromkeys(warnings))


def _perfetto(inputs: JobInputs, evidences: tuple[RunEvidence, ...]) -> PerfettoView:
    from stepscope.pipeline import views

    series = [views.step_series(evidence, None) for evidence in evidences]
    return views.perfetto_view(inputs.records, [item for item in series if item is not None], inputs.run_dir)


def _flame(record: RunRecord, phase: str) -> FlameView:
    from stepscope.analysis.run.code_locations import collapse_stacks
    from stepscope.report.run_view import FlameView, StackLine

    try:
        stacks = collapse_stacks(record, phase)
        return FlameView(phase, tuple(StackLine(item.frames, item.samples) for item in stacks))
    except ValueError as exc:
        raise UsageError(f"--flame: {exc}") from None


def predict_step(evidence: RunEvidence, workers: int, threads: int) -> float | None:
    """The step the input pipeline's loading model predicts with ``workers`` DataLoader workers and
    ``threads`` intra-op threads (None when the run lacks what the model needs): ``run --verify``'s
    gain model reads it here, since only this module reaches the rules."""
    from stepscope.diagnosis.rules.input_pipeline import predict_step as predict

    return predict(evidence, workers, threads)


__all__ = ["PHASES", "ReportOptions", "diagnose", "predict_step"]
