"""The sections of the :class:`~stepscope.report.model.Report` view-model, computed from analyses.

Every number an output shows is computed here, once, and handed to the renderers as plain typed
data: the run's summary (and whether its MFU is worth a line), the job's rank table, each trace
rank's category shares, idle and launch statistics, the step series with per-step shares, the
sampler intervals mapped onto steps, the merged Perfetto timeline with its clock alignment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stepscope.analysis.bundle import RunEvidence
from stepscope.analysis.run.ranks import MissingRank, first_failure, rank_row, rank_spread
from stepscope.analysis.run.steady import model_split_by_device, step_stats
from stepscope.analysis.run.timelines import SystemTimelines, system_timelines
from stepscope.diagnosis.engine import Diagnosis
from stepscope.diagnosis.findings import Finding
from stepscope.record.run import PHASES, RunRecord, StepTable
from stepscope.report.model import (AccountSummary, JobSummary, LaunchSummary, PerfettoRank, PerfettoView, RunSummary, SkipSummary,
                                    StepSeries, TABLE_ROWS, TraceRankView, TraceViews)
from stepscope.units import SHARE_SHOWN_MIN

if TYPE_CHECKING:  # only a trace brings the trace analysis in (start-up of `run`)
    from stepscope.analysis.trace.rank_analysis import RankAnalysis
    from stepscope.analysis.trace.trace_evidence import TraceAnalysis

_EMPTY_STATS = step_stats(StepTable.empty())
#: MFU gets a line in the summary when the model's own phases take at least this share of the step
#: (below it, an MFU measures the waiting, not the model) ...
MFU_SHOWN_COMPUTE_SHARE = 0.25
#: ... and it reads at least this much (a 0.0 % line says nothing).
MFU_SHOWN_MIN = SHARE_SHOWN_MIN
#: Collector pauses get a line in the summary from this share of the step time.
GC_SHOWN = 0.005


# -- a run -----------------------------------------------------------------------------------------
def run_summary(evidence: RunEvidence, records: Sequence[RunRecord], findings: Sequence[Finding] = ()) -> RunSummary:
    """The summary of the rank ``evidence`` describes; ``records``: every rank's (skipped samples);
    ``findings``: the verdict (the account's line is shown when its top finding rests on the account)."""
    record = evidence.record
    assert record is not None
    meta = record.meta
    steady = evidence.steady
    mfu = evidence.mfu
    compute_share = steady.compute_share if steady is not None else 0.0
    return RunSummary(
        target=meta.target, argv=tuple(meta.argv), rank=meta.rank, world_size=meta.world_size, wall_s=meta.wall_s,
        exit_code=meta.exit_code, step_source=meta.step_source,
        inference=bool(record.facts.inference and not record.facts.training_in_children),
        training_in_children=bool(record.facts.training_in_children),
        total_steps=steady.step_count if steady is not None else 0,
        warmup_steps=steady.warmup_steps if steady is not None else 0,
        steady_steps=steady.steady_count if steady is not None else 0,
        excluded_steps=steady.excluded if steady is not None else (),
        steady=steady.steady if steady is not None else _EMPTY_STATS,
        warmup=steady.warmup if steady is not None else _EMPTY_STATS,
        measured_phases=steady.measured_phases if steady is not None else (),
        samples_per_step=steady.samples_per_step if steady is not None else None,
        fetch_wait_share=steady.fetch_wait_share if steady is not None else None,
        mfu=mfu, mfu_shown=mfu is not None and mfu.value >= MFU_SHOWN_MIN and compute_share >= MFU_SHOWN_COMPUTE_SHARE,
        mfu_note=evidence.mfu_note, compile=evidence.compile,
        gc=evidence.gc if evidence.gc is not None and (evidence.gc.share_of_step_time or 0.0) >= GC_SHOWN else None,
        loaders=record.loaders, overrides=record.facts.overrides, skipped=skip_summary(records or (record,)),
        machine=evidence.signals, machine_notes=machine_notes(evidence),
        account=account_summary(evidence, findings[0] if findings else None),
    )


#: The account's line is shown when the training thread waited for a core or was off CPU outside
#: the DataLoader's queue for at least this share of the step.
ACCOUNT_SHOWN = 0.1
#: What each off-CPU cause is called in the summary.
OFF_CAUSES = {"workers": "waiting for the DataLoader's workers", "io": "blocked in the loader (reads, sleeps)",
              "peer": "waiting for a peer", "device": "waiting for the device", "gil": "waiting for the GIL",
              "unexplained": "not explained"}


#: Families whose verdict rests on the thread account: their line is shown when one of them leads.
ACCOUNT_FAMILIES = frozenset({"gil_contention", "unexplained", "foreign_load"})


def account_summary(evidence: RunEvidence, top: Finding | None = None) -> AccountSummary | None:
    """The summary's line of the thread account (see :class:`AccountSummary`); ``top``: the verdict's
    first finding (the line is shown when it rests on the account)."""
    account = evidence.account
    if account is None:
        return None
    waiting = tuple(pair for pair in account.waiting_split() if pair[1] >= 0.005)
    off = ((label, round(account.share_off(cause), 4)) for cause, label in OFF_CAUSES.items())
    off_by = tuple(sorted((pair for pair in off if pair[1] >= 0.005), key=lambda pair: -pair[1]))
    material = account.waiting_core + sum(share for cause, share in off_by if cause != OFF_CAUSES["workers"])
    leads = top is not None and top.family in ACCOUNT_FAMILIES
    return AccountSummary(account.accounted_steps, account.on_cpu, account.waiting_core, account.off_cpu,
                          account.spread, waiting, off_by, shown=leads or material >= ACCOUNT_SHOWN)


def machine_notes(evidence: RunEvidence) -> tuple[str, ...]:
    """The sampler's notes worth a line: not that NVML is missing on a run that used no GPU."""
    signals = evidence.signals
    if signals is None:
        return ()
    return tuple(note for note in signals.notes if evidence.gpu is not None or not note.startswith("GPU metrics"))


def skip_summary(records: Sequence[RunRecord]) -> SkipSummary | None:
    """What ``stepscope.data.SkipBadSamples`` skipped, over every rank's record (None when unused)."""
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
    total = sum(item.total for item in datasets)
    return SkipSummary(total, delivered, datasets, total / delivered if delivered else None)


def step_series(evidence: RunEvidence, timelines: SystemTimelines | None) -> StepSeries | None:
    """The rank's steps for charts, with each step's phase shares and the step of each sampler interval."""
    record = evidence.record
    if record is None:
        return None
    steps = model_split_by_device(record.steps)  # the summary's split of the model's time
    duration = steps.duration_ns.astype(np.float64)
    phases = {name: steps.phase(name) for name in PHASES}
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = {name: np.where(duration > 0, values / duration, np.nan) for name, values in phases.items()}
    sample_steps = np.zeros(0, dtype=np.int64)
    if timelines is not None and len(steps):
        sample_steps = np.maximum(np.searchsorted(steps.start_ns, timelines.t_ns, side="right") - 1, 0)
    steady = evidence.steady
    return StepSeries(
        rank=record.meta.rank, start_ns=steps.start_ns, duration_ns=steps.duration_ns, phases=phases,
        phase_shares=shares, warmup_steps=steady.warmup_steps if steady is not None else 0,
        excluded=steady.excluded if steady is not None else (),
        wall_offset_s=(record.meta.start_wall_ns - record.meta.start_ns) / 1e9, sample_steps=sample_steps)


def timelines_of(record: RunRecord | None) -> SystemTimelines | None:
    return system_timelines(record.samples) if record is not None else None


def job_summary(evidences: Sequence[RunEvidence], diagnoses: Sequence[Diagnosis], missing: Sequence[MissingRank],
                world_size: int) -> JobSummary:
    rows = tuple(rank_row(evidence, diagnosis.findings[0].title if diagnosis.findings else None)
                 for evidence, diagnosis in zip(evidences, diagnoses))
    failure = first_failure([evidence.record for evidence in evidences if evidence.record is not None], list(missing))
    return JobSummary(world_size, rows, rank_spread(list(rows)), tuple(missing),
                      len({row.node for row in rows}) > 1, failure)


# -- traces ----------------------------------------------------------------------------------------
def trace_views(analysis: TraceAnalysis, from_window: bool) -> TraceViews:
    comparison = tuple((item.rank, item.step_time_us, item.idle_share, item.compute_share)
                       for item in analysis.comparison.ranks)
    return TraceViews(tuple(trace_rank_view(item) for item in analysis.ranks), comparison,
                      analysis.comparison.stragglers, from_window, analysis)


def trace_rank_view(item: RankAnalysis) -> TraceRankView:
    from stepscope.analysis.trace.step_breakdown import CATEGORIES

    steps = item.steps
    temporal = item.temporal
    python = item.python
    launches = item.launches
    summary = launches.summary() if launches.count else None
    critical = item.critical
    path_shares = () if critical is None else tuple(
        (kind, critical.label(kind), share) for kind, share in critical.shown_shares().items())
    return TraceRankView(
        rank=item.rank, path=item.path, rank_source=item.rank_source, device_name=item.device_name,
        categories=tuple((category, steps.mean_us.get(category), steps.share(category)) for category in CATEGORIES),
        step_time_us=steps.mean_us.get("Total"),
        per_step_us=tuple((name, {key: value for key, value in values.items() if key != "Total"})
                          for name, values in zip(steps.step_names, steps.per_step_us)),
        devices=item.devices,
        temporal=None if temporal is None else (temporal.idle_share, temporal.compute_share,
                                                temporal.non_compute_share, temporal.kernel_time_us),
        idle_streams=item.idle.shares() if temporal is not None else None,
        comm_overlap=item.overlap.overlap_share,
        launches=None if summary is None else LaunchSummary(
            count=int(summary["count"]), delay_p50_us=float(summary["launch_delay_us"]["p50"]),
            short_kernels=int(summary["short_gpu_kernels"]), runtime_outliers=int(summary["runtime_outliers"]),
            delay_outliers=int(summary["launch_delay_outliers"])),
        host=None if python is None else {part: python.share(part) for part in ("python", "aten", "runtime")},
        memory=item.memory.devices, allocators=item.memory.top_operators,
        operators=item.operators.rows, operators_by_shape=item.operators.grouped_by_shape,
        kernels=item.kernels.rows, notes=(*steps.notes, *item.warnings), critical=item.critical,
        path_shares=path_shares, path_shares_ranked=tuple(sorted(path_shares, key=lambda row: (row[2], row[0]),
                                                                 reverse=True)),
        operators_shown=_largest(item.operators.rows, "host_total_us"), kernels_shown=_largest(item.kernels.rows, "total_us"))


def _largest(rows: tuple[Any, ...], key: str) -> tuple[Any, ...]:
    """A table's rows as a page holds them: all, or the TABLE_ROWS largest by ``key``."""
    if len(rows) <= TABLE_ROWS:
        return rows
    return tuple(sorted(rows, key=lambda row: -getattr(row, key))[:TABLE_ROWS])


# -- the Perfetto timeline -------------------------------------------------------------------------
#: A ProfilerStep residual larger than this is not trusted (the wrong window): wall mapping only.
MAX_RESIDUAL_NS = 60_000_000_000


def perfetto_view(records: Sequence[RunRecord], series: Sequence[StepSeries], run_dir: Path | None) -> PerfettoView:
    """The merged timeline of a job's ranks (see :mod:`stepscope.report.render.perfetto` for the
    format): steps, the sampler's counters, and each rank's profiler window with its clock mapped
    onto the steps' (the window's ``ProfilerStep#N`` ranges matched to its steps, the median
    residual removed)."""
    notes: list[str] = []
    origin = _origin(records)
    ranks = []
    top: dict[str, Any] = {}
    for record, steps in zip(records, series):
        events, alignment, extra = _kineto_events(record, run_dir, origin, notes)
        top.update(extra)
        timelines = system_timelines(record.samples)
        counters = _counter_series(timelines) if timelines is not None else {}
        ranks.append(PerfettoRank(record.meta.rank, steps, counters,
                                  timelines.t_ns if timelines is not None else np.zeros(0, dtype=np.int64),
                                  tuple(events), frozenset(event.get("pid") for event in events), alignment))
    return PerfettoView(origin, tuple(ranks), top, tuple(notes))


def _origin(records: Sequence[RunRecord]) -> int:
    starts = [int(record.steps.start_ns[0]) for record in records if len(record.steps)]
    if starts:
        return min(starts)
    samples = [int(record.samples.ts_ns[0]) for record in records
               if record.samples is not None and len(record.samples)]
    return min(samples) if samples else min((record.meta.start_ns for record in records), default=0)


def _counter_series(timelines: SystemTimelines) -> dict[str, dict[str, np.ndarray]]:
    """Counter track name → {series name: per-interval values}, in display units."""
    series: dict[str, dict[str, np.ndarray]] = {
        "CPU busy %": {"all cores": timelines.cpu_busy_mean * 100},
        "process CPU (cores)": {"main": timelines.main_cpu, "DataLoader workers": timelines.workers_cpu},
        "disk MiB/s": {"read": timelines.disk_read / 2**20, "write": timelines.disk_write / 2**20},
        "memory GiB": {"machine used": timelines.mem_used / 2**30, "main RSS": timelines.main_rss / 2**30},
    }
    if timelines.has_gpu:
        series["GPU utilisation %"] = {f"GPU {i}": timelines.gpu_util[:, i] * 100
                                       for i in range(timelines.gpu_util.shape[1])}
        series["GPU memory GiB"] = {f"GPU {i}": timelines.gpu_mem_used[:, i] / 2**30
                                    for i in range(timelines.gpu_mem_used.shape[1])}
    return series


def _kineto_events(record: RunRecord, run_dir: Path | None, origin: int,
                   notes: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any] | None, dict[str, Any]]:
    from stepscope.errors import StepscopeError
    from stepscope.pipeline.inputs import window_trace_path
    from stepscope.traces.load import load_raw_events

    path = window_trace_path(record, run_dir)
    if path is None:
        return [], None, {}
    window = [item for item in record.profiler_windows if item.trace_path][-1]
    try:
        events, document = load_raw_events(path)
    except (StepscopeError, OSError) as exc:
        notes.append(f"rank {record.meta.rank}: profiler window trace {path} left out ({exc})")
        return [], None, {}
    base = int(document.get("baseTimeNanoseconds") or 0)
    # wall (ns) -> monotonic (ns): the pair capture read at start; then relative to the origin.
    shift_ns = base - (record.meta.start_wall_ns - record.meta.start_ns) - origin
    residual = _step_residual(events, record, (window.first_step, window.last_step), shift_ns, origin)
    shift_ns -= residual if residual is not None else 0
    for event in events:
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] = round((event["ts"] * 1000.0 + shift_ns) / 1000.0, 3)
    extra: dict[str, Any] = {key: document[key] for key in ("deviceProperties", "distributedInfo", "schemaVersion")
                             if key in document}
    info: dict[str, Any] = {"trace": str(window.trace_path), "wall_to_monotonic_ns": record.meta.start_wall_ns - record.meta.start_ns,
            "profiler_step_residual_ns": residual}
    return events, info, extra


def _step_residual(events: list[dict[str, Any]], record: RunRecord, window_steps: tuple[int, int],
                   shift_ns: int, origin: int) -> int | None:
    """Median gap between the ``ProfilerStep#N`` starts (mapped) and the starts of the steps they record.

    The ranges are matched in order from the end: the last N ranges are the last N steps of the
    window (the window's first step is the profiler's warm-up, which may have no range), so a clock
    error of any size is found. None when nothing can be matched or the gaps disagree by more than
    a step (then the wall-clock mapping alone is used).
    """
    first, last = window_steps
    marks = sorted(float(event["ts"]) for event in events
                   if str(event.get("name", "")).startswith("ProfilerStep#") and isinstance(event.get("ts"), (int, float)))
    steps = record.steps
    window = np.arange(max(first, 0), min(last, len(steps) - 1) + 1)
    count = min(len(marks), len(window))
    if not count:
        return None
    starts = (steps.start_ns[window[-count:]] - origin).astype(np.float64)
    mapped = np.array(marks[-count:]) * 1000.0 + shift_ns  # ns relative to the origin
    residuals = mapped - starts
    median = float(np.median(residuals))
    if np.ptp(residuals) > float(np.median(steps.duration_ns[window[-count:]])) or abs(median) > MAX_RESIDUAL_NS:
        return None
    return int(round(median))


__all__ = ["MFU_SHOWN_COMPUTE_SHARE", "job_summary", "perfetto_view",
           "run_summary", "skip_summary", "step_series", "timelines_of", "trace_rank_view", "trace_views"]
