"""The run's sections of the :class:`~stepscope.report.model.Report` view-model, computed from analyses.

Every number an output shows is computed here, once, and handed to the renderers as plain typed
data of the view's own types (:mod:`stepscope.report.run_view`): the run's summary (and whether its
MFU is worth a line), the job's rank table, the step series with per-step shares, the machine's
timelines and the sampler intervals mapped onto steps, the merged Perfetto timeline with its clock
alignment. Only the values shown are carried over from the analyses (a loader's settings, not its
worker pids). The trace views (each traced rank's shares, idle and launch statistics and critical
path) are :mod:`stepscope.pipeline.trace_views`'s, report.json's sections
:mod:`stepscope.pipeline.report_json`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stepscope.analysis.bundle import RankSteady, RunEvidence
from stepscope.analysis.evidence import MacroSignals
from stepscope.analysis.host_cpu import STEAL_SHOWN
from stepscope.analysis.run.loader_floor import LoaderFloor
from stepscope.analysis.run.steady import StepStats, model_split_by_device, step_stats
from stepscope.diagnosis.engine import Diagnosis
from stepscope.diagnosis.findings import Finding
from stepscope.record.run import PHASES, LoaderInfo, Overrides, RunRecord, StepTable
from stepscope.report.run_view import (AccountSummary, CompileLine, EagerFrame, GcLine, JobRankRow, JobSpread,
                                       JobSummary, LoaderLine, MachineTimelines, MachineView, MfuLine,
                                       MissingRankLine, OverriddenSetting, OverridesLine, PerfettoRank, PerfettoView,
                                       RankSteps, RunSummary, SkipSummary, SkippedDataset, StepSeries, StepTimes)
from stepscope.units import SHARE_SHOWN_MIN

if TYPE_CHECKING:  # only a trace brings the trace analysis in (start-up of `run`), only a record the rest
    from stepscope.analysis.run.compile_summary import CompileSummary
    from stepscope.analysis.run.ranks import JobFailure, MissingRank, RankRow, RankSpread
    from stepscope.analysis.run.timelines import SystemTimelines

#: The statistics of no steps (a run whose steady state could not be found).
EMPTY_STATS = step_stats(StepTable.empty())
#: MFU gets a line in the summary when the model's own phases take at least this share of the step
#: (below it, an MFU measures the waiting, not the model) ...
MFU_SHOWN_COMPUTE_SHARE = 0.25
#: ... and it reads at least this much (a 0.0 % line says nothing).
MFU_SHOWN_MIN = SHARE_SHOWN_MIN
#: Collector pauses get a line in the summary from this share of the step time.
GC_SHOWN = 0.005
#: A GPU's mean utilisation below this reads as starved (TraceML calls under 30 % "LOW", shared/reference).
GPU_UTIL_LOW = 0.3


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
    gc = evidence.gc if evidence.gc is not None and (evidence.gc.share_of_step_time or 0.0) >= GC_SHOWN else None
    stats = steady.steady if steady is not None else EMPTY_STATS
    return RunSummary(
        target=meta.target, argv=tuple(meta.argv), rank=meta.rank, world_size=meta.world_size, wall_s=meta.wall_s,
        exit_code=meta.exit_code, step_source=meta.step_source,
        inference=bool(record.facts.inference and not record.facts.training_in_children),
        training_in_children=bool(record.facts.training_in_children),
        total_steps=steady.step_count if steady is not None else 0,
        warmup_steps=steady.warmup_steps if steady is not None else 0,
        steady_steps=steady.steady_count if steady is not None else 0,
        excluded_steps=steady.excluded if steady is not None else (),
        steady=step_times(stats), warmup_s=(steady.warmup if steady is not None else EMPTY_STATS).total_s,
        measured_phases=steady.measured_phases if steady is not None else (),
        samples_per_step=steady.samples_per_step if steady is not None else None,
        fetch_wait_share=steady.fetch_wait_share if steady is not None else None,
        mfu=None if mfu is None else MfuLine(mfu.value, mfu.low, mfu.high, mfu.dtype, mfu.peak_source),
        mfu_shown=mfu is not None and mfu.value >= MFU_SHOWN_MIN and compute_share >= MFU_SHOWN_COMPUTE_SHARE,
        mfu_note=evidence.mfu_note, compile=compile_line(evidence.compile),
        gc=None if gc is None else GcLine(gc.share_of_step_time, gc.pauses_per_step,
                                          gc.largest.duration_s if gc.largest is not None else None),
        loaders=tuple(loader_line(loader, evidence.loader_floor) for loader in record.loaders),
        overrides=overrides_line(record.facts.overrides), skipped=skip_summary(records or (record,)),
        machine=machine_view(evidence.signals), machine_notes=machine_notes(evidence),
        account=account_summary(evidence, findings[0] if findings else None),
        interrupted_by=meta.interrupted_by, mode=meta.mode,
    )


def step_times(stats: StepStats) -> StepTimes:
    """What the summary shows of a set of steps' statistics."""
    return StepTimes(stats.count, stats.mean_s, stats.median_s, stats.p90_s, stats.max_s, stats.steps_per_s,
                     stats.samples_per_s, stats.phase_shares, stats.phase_mean_s)


def rank_steps(ranks: Sequence[RankSteady]) -> tuple[RankSteps, ...]:
    """The other ranks' steady steps, for the per-rank chart."""
    return tuple(RankSteps(item.rank, item.steady.steady.mean_s, item.steady.steady.phase_mean_s,
                           item.steady.steady.phase_shares) for item in ranks)


def compile_line(summary: CompileSummary | None) -> CompileLine | None:
    if summary is None:
        return None
    eager = tuple(EagerFrame(frame.function, frame.limit_hit_step, frame.limit) for frame in summary.limit_hits)
    return CompileLine(len(summary.frames), summary.compilations, summary.recompiles, summary.compile_s,
                       summary.compile_share, eager, summary.graph_break_count, summary.speedup)


def loader_line(loader: LoaderInfo, floor: LoaderFloor | None = None) -> LoaderLine:
    """The summary's line of ``loader``, with its workers' measured pace when ``floor`` is its."""
    line = LoaderLine(loader.loader_id, loader.dataset_type, loader.batch_size, loader.num_workers,
                      loader.prefetch_factor, loader.persistent_workers, loader.pin_memory, loader.drop_last,
                      loader.batches, loader.wait_ns)
    if floor is None or floor.loader_id != loader.loader_id:
        return line
    return replace(line, worker_batch_s=floor.wall_s, worker_blocked_s=floor.blocked_s, floor_s=floor.floor_s)


def overrides_line(overrides: Overrides | None) -> OverridesLine | None:
    if overrides is None:
        return None
    return OverridesLine(tuple(OverriddenSetting(item.key, item.value, item.applied, len(item.skipped))
                               for item in overrides.settings), overrides.max_steps, overrides.stopped_at_max_steps)


def machine_view(signals: MacroSignals | None) -> MachineView | None:
    """What the summary shows of the sampler's signals, the levels judged (None without a sampler)."""
    if signals is None:
        return None
    from stepscope.analysis.run.signals import SATURATED

    return MachineView(
        sample_count=signals.sample_count, cpu_count=signals.cpu_count, cpu_util_mean=signals.cpu_util_mean,
        busiest_core_util=signals.busiest_core_util,
        busiest_core_saturated=signals.busiest_core_util is not None and signals.busiest_core_util > SATURATED,
        idlest_core_util=signals.idlest_core_util, saturated_cores=signals.saturated_cores,
        iowait_share=signals.iowait_share, steal_share=signals.steal_share,
        steal_shown=signals.steal_share is not None and signals.steal_share >= STEAL_SHOWN,
        runnable_threads_per_core=signals.runnable_threads_per_core, main_cpu_util=signals.main_cpu_util,
        worker_count=signals.worker_count, worker_cpu_util_mean=signals.worker_cpu_util_mean,
        workers_saturated=signals.worker_cpu_util_mean is not None and signals.worker_cpu_util_mean > SATURATED,
        worker_saturation=signals.worker_saturation, thread_count_max=signals.thread_count_max,
        disk_read_bytes_per_s=signals.disk_read_bytes_per_s,
        disk_read_bytes_per_s_early=signals.disk_read_bytes_per_s_early,
        disk_read_bytes_per_s_late=signals.disk_read_bytes_per_s_late,
        page_cache_warming=bool(signals.page_cache_warming), net_bytes_per_s=signals.net_bytes_per_s,
        memory_used_share_max=signals.memory_used_share_max, rss_growth_bytes_per_s=signals.rss_growth_bytes_per_s,
        rss_growth_basis=signals.rss_growth_basis, swap_in_bytes_per_s=signals.swap_in_bytes_per_s,
        swap_out_bytes_per_s=signals.swap_out_bytes_per_s, gpu_count=signals.gpu_count,
        gpu_util_mean=signals.gpu_util_mean,
        gpu_starved=signals.gpu_util_mean is not None and signals.gpu_util_mean < GPU_UTIL_LOW,
        gpu_util_oscillation=signals.gpu_util_oscillation, gpu_memory_used_share_max=signals.gpu_memory_used_share_max)


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
    return SkipSummary(total, delivered, tuple(SkippedDataset(item.dataset, item.total, item.by_process)
                                               for item in datasets), total / delivered if delivered else None)


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
    if record is None:
        return None
    from stepscope.analysis.run.timelines import system_timelines

    return system_timelines(record.samples)


def machine_timelines(timelines: SystemTimelines | None) -> MachineTimelines | None:
    """The series the machine's charts draw (the all-core mean and whether workers ran, computed)."""
    if timelines is None:
        return None
    return MachineTimelines(
        t_ns=timelines.t_ns, core_busy=timelines.core_busy, cpu_busy_mean=timelines.cpu_busy_mean,
        cpu_ids=timelines.cpu_ids, main_cpu=timelines.main_cpu, workers_cpu=timelines.workers_cpu,
        has_workers=timelines.has_workers, disk_read=timelines.disk_read, disk_write=timelines.disk_write,
        mem_used=timelines.mem_used, mem_total_bytes=timelines.mem_total_bytes, main_rss=timelines.main_rss,
        has_gpu=timelines.has_gpu, gpu_util=timelines.gpu_util, gpu_mem_used=timelines.gpu_mem_used,
        gpu_names=timelines.gpu_names, gpu_mem_total_bytes=timelines.gpu_mem_total_bytes)


@dataclass(frozen=True)
class JobTable:
    """A job's ranks as the analysis sees them: the rank table's rows, their spread, the ranks
    without a record, the rank that failed first (its view and report.json's ``job`` are made from it)."""

    world_size: int
    rows: tuple[RankRow, ...]
    spread: RankSpread | None
    missing: tuple[MissingRank, ...]
    failure: JobFailure | None


def job_table(evidences: Sequence[RunEvidence], diagnoses: Sequence[Diagnosis], missing: Sequence[MissingRank],
              world_size: int) -> JobTable:
    from stepscope.analysis.run.ranks import first_failure, rank_row, rank_spread

    rows = tuple(rank_row(evidence, diagnosis.findings[0].title if diagnosis.findings else None)
                 for evidence, diagnosis in zip(evidences, diagnoses))
    failure = first_failure([evidence.record for evidence in evidences if evidence.record is not None], list(missing))
    return JobTable(world_size, rows, rank_spread(list(rows)), tuple(missing), failure)


def job_summary(table: JobTable) -> JobSummary:
    """The job's rank table as the summary shows it."""
    spread = table.spread
    return JobSummary(
        table.world_size,
        tuple(JobRankRow(row.rank, row.node, row.step_time_s, row.data_wait_s, row.compute_s, row.communication_s,
                         row.overlapped_s, row.cpu_util, row.rss_bytes) for row in table.rows),
        None if spread is None else JobSpread(spread.step_time_min_s, spread.step_time_max_s,
                                              spread.step_time_spread, spread.slowest_rank),
        tuple(MissingRankLine(item.rank, item.reason) for item in table.missing),
        len({row.node for row in table.rows}) > 1, table.failure.text if table.failure is not None else None)


# -- the Perfetto timeline -------------------------------------------------------------------------
#: A ProfilerStep residual larger than this is not trusted (the wrong window): wall mapping only.
MAX_RESIDUAL_NS = 60_000_000_000


def perfetto_view(records: Sequence[RunRecord], series: Sequence[StepSeries], run_dir: Path | None) -> PerfettoView:
    """The merged timeline of a job's ranks (see :mod:`stepscope.report.render.perfetto` for the
    format): steps, the sampler's counters, and each rank's profiler window with its clock mapped
    onto the steps' (the window's ``ProfilerStep#N`` ranges matched to its steps, the median
    residual removed)."""
    from stepscope.analysis.run.timelines import system_timelines

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


__all__ = ["EMPTY_STATS", "MFU_SHOWN_COMPUTE_SHARE", "JobTable", "critical_path_view", "job_summary", "job_table",
           "machine_timelines", "machine_view", "perfetto_view", "rank_steps", "run_summary", "skip_summary", "step_series",
           "timelines_of", "trace_rank_view", "trace_views"]
