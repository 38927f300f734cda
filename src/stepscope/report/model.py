"""The Report view-model: everything any output shows, computed by the pipeline; renderers format it.

:func:`stepscope.pipeline.diagnose` builds one :class:`Report` for ``stepscope run``, ``report``,
``analyze``, the library API and the integrations. Every section is plain typed data computed
there — the run's summary, the job's rank table, the trace views with their shares and launch
statistics, the machine's timelines, the step series for charts — so a renderer
(:mod:`stepscope.report.render`) only formats fields and never computes a number of its own.

``report.json`` and ``analyze --format json`` are :meth:`Report.to_dict`: one envelope
(``summary``, ``findings``, ``diagnosis``, ``warnings``) plus the source's sections (schema in
``docs/report-json.md``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stepscope.analysis.bundle import MfuEstimate, RankSteady, RunEvidence
from stepscope.analysis.evidence import MacroSignals, WorkerLoad
from stepscope.analysis.host_cpu import STEAL_SHOWN
from stepscope.analysis.run.compile_summary import CompileSummary
from stepscope.analysis.run.gc_pauses import GcPauseSummary
from stepscope.analysis.run.ranks import JobFailure, MissingRank, RankRow, RankSpread
from stepscope.analysis.run.signals import SATURATED
from stepscope.analysis.run.steady import StepStats
from stepscope.analysis.run.timelines import SystemTimelines
from stepscope.diagnosis.engine import Diagnosis, risk_of
from stepscope.diagnosis.findings import Finding
from stepscope.record.run import PHASES as RECORD_PHASES
from stepscope.record.run import LoaderInfo, Overrides, RunMeta, SkippedSamples

if TYPE_CHECKING:  # trace types only annotate: a run without a trace never imports the trace analysis
    from stepscope.analysis.trace.critical_path import PathSummary
    from stepscope.analysis.trace.gpu_metrics import DeviceSummary
    from stepscope.analysis.trace.kernels import KernelRow
    from stepscope.analysis.trace.memory import AllocatingOperator, DeviceMemory
    from stepscope.analysis.trace.operators import OperatorRow
    from stepscope.analysis.trace.trace_evidence import TraceAnalysis

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
#: A GPU's mean utilisation below this reads as starved (TraceML calls under 30 % "LOW", shared/reference).
GPU_UTIL_LOW = 0.3

__all__ = ["PHASES", "AccountSummary", "Finding", "FlameView", "JobSummary", "MachineView", "MacroSignals", "StackLine", "WorkerLoad", "LaunchSummary", "PerfettoRank", "PerfettoView", "RankReport", "Report",
           "RunSummary", "SkipSummary", "StepSeries", "TraceRankView", "TraceViews"]


@dataclass(frozen=True)
class SkipSummary:
    """Samples the script's ``SkipBadSamples`` datasets replaced because they failed to load."""

    total: int
    delivered: int | None  # samples in the recorded steps' batches (None when not inferred)
    datasets: tuple[SkippedSamples, ...]
    share: float | None  # skipped per delivered sample

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "delivered": self.delivered, "share": self.share,
                "datasets": [asdict(item) for item in self.datasets]}


@dataclass(frozen=True)
class AccountSummary:
    """Where the training thread's steady step went (the thread account), as the summary shows it:
    three shares of the step with their uncertainty, what the wait for a core is charged to and what
    the off-CPU time is, each a share of the step, largest first."""

    accounted_steps: int
    on_cpu: float
    waiting_core: float
    off_cpu: float
    spread: float
    waiting_by: tuple[tuple[str, float], ...]  # ("other processes", 0.31), ...
    off_by: tuple[tuple[str, float], ...]  # ("waiting for the DataLoader's workers", 0.4), ...
    #: the line is worth showing: a finding of the verdict rests on the account, or the thread
    #: waited or was off CPU for a material share of the step
    shown: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunSummary:
    """What the summary says about the run the report describes (one rank: the lowest, or the one asked for)."""

    target: str
    argv: tuple[str, ...]
    rank: int
    world_size: int
    wall_s: float | None
    exit_code: int | None
    step_source: str | None
    inference: bool
    training_in_children: bool
    total_steps: int
    warmup_steps: int
    steady_steps: int
    excluded_steps: tuple[int, ...]
    steady: StepStats
    warmup: StepStats
    measured_phases: tuple[str, ...]
    samples_per_step: int | None
    fetch_wait_share: float | None
    mfu: MfuEstimate | None
    #: MFU worth a line in the summary: the model computes a real part of the step (an input-bound
    #: run's MFU measures the wait, not the model) and it reads above 0.0 %
    mfu_shown: bool
    mfu_note: str | None
    compile: CompileSummary | None
    gc: GcPauseSummary | None
    loaders: tuple[LoaderInfo, ...]
    overrides: Overrides | None
    skipped: SkipSummary | None
    machine: MacroSignals | None
    machine_notes: tuple[str, ...] = ()  # the sampler's notes worth a line (not NVML's absence on a CPU run)
    account: AccountSummary | None = None  # the training thread's account (None unmeasured)

    @property
    def machine_view(self) -> MachineView | None:
        """What the summary shows of the sampler's signals (None without a sampler)."""
        return machine_view(self.machine)


@dataclass(frozen=True)
class MachineView:
    """The machine's rows of the run summary: the sampler's signals the summary shows, with the
    levels already judged (a saturated core or worker, a starved GPU)."""

    sample_count: int
    cpu_count: int | None
    cpu_util_mean: float | None
    busiest_core_util: float | None
    busiest_core_saturated: bool  # above the sampler's saturation level (SATURATED)
    idlest_core_util: float | None
    saturated_cores: int | None
    iowait_share: float | None
    steal_share: float | None
    steal_shown: bool  # steal worth naming (STEAL_SHOWN)
    runnable_threads_per_core: float | None
    main_cpu_util: float | None
    worker_count: int | None
    worker_cpu_util_mean: float | None
    workers_saturated: bool  # the workers' mean is above SATURATED
    worker_saturation: float | None
    thread_count_max: int | None
    disk_read_bytes_per_s: float | None
    disk_read_bytes_per_s_early: float | None
    disk_read_bytes_per_s_late: float | None
    page_cache_warming: bool
    net_bytes_per_s: float | None
    memory_used_share_max: float | None
    rss_growth_bytes_per_s: float | None
    rss_growth_basis: str | None
    swap_in_bytes_per_s: float | None
    swap_out_bytes_per_s: float | None
    gpu_count: int | None
    gpu_util_mean: float | None
    gpu_starved: bool  # mean utilisation below GPU_UTIL_LOW
    gpu_util_oscillation: float | None
    gpu_memory_used_share_max: float | None


def machine_view(signals: MacroSignals | None) -> MachineView | None:
    """The :class:`MachineView` of the sampler's signals."""
    if signals is None:
        return None
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


@dataclass(frozen=True)
class VerificationView:
    """``run --verify``'s trials as the summary's line shows them, judged here: whether a comparison
    could be made (a measured baseline and at least one measured candidate) and, if not, why."""

    verified: bool
    #: why nothing was verified: "no_trial", "no_baseline" or "no_candidate" (None when verified)
    unmeasured: str | None
    failed: str | None  # the failures' summary
    elapsed_s: float
    steps: int | None  # steps per trial
    measured: int  # trials measured (failed ones are no measurement)
    per_setting_low: int  # fewest and most measured trials of one setting
    per_setting_high: int
    best: str | None
    notes: tuple[str, ...]


def verification_view(verification: dict[str, Any]) -> VerificationView:
    """The :class:`VerificationView` of ``run --verify``'s result (``report.json``'s ``verification``)."""
    rows = verification.get("trials", ())
    measured = [int(row.get("runs", 0)) - int(row.get("failed", 0)) for row in rows]
    baseline = bool(measured) and measured[0] > 0 and rows[0].get("verdict") not in ("failed", "not run")
    verified = baseline and sum(measured[1:]) > 0
    unmeasured = None if verified else "no_trial" if not sum(measured) else "no_baseline" if not baseline \
        else "no_candidate"
    return VerificationView(verified, unmeasured, verification.get("failed"), verification.get("elapsed_s", 0),
                            verification.get("steps"), sum(measured), min(measured, default=0),
                            max(measured, default=0), verification.get("best"),
                            tuple(str(item) for item in verification.get("notes", ())))


@dataclass(frozen=True)
class StepSeries:
    """One rank's steps, for charts and timelines (nanoseconds on the run's monotonic clock)."""

    rank: int
    start_ns: np.ndarray
    duration_ns: np.ndarray
    phases: dict[str, np.ndarray]  # phase -> ns per step (PHASES)
    phase_shares: dict[str, np.ndarray]  # phase -> share of each step (NaN for a step of 0 ns)
    warmup_steps: int
    excluded: tuple[int, ...]
    wall_offset_s: float  # wall clock = monotonic + this
    #: per sampler interval of :attr:`Report.timelines`: the index of the step running at its end
    sample_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return int(len(self.start_ns))


@dataclass(frozen=True)
class JobSummary:
    """A multi-rank job: one row per rank with a record, the spread, the ranks without a record."""

    world_size: int
    rows: tuple[RankRow, ...]
    spread: RankSpread | None
    missing: tuple[MissingRank, ...]
    several_nodes: bool
    failure: JobFailure | None = None  # the rank that failed first, when one did

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "ranks": [row.to_dict() for row in self.rows],
                "spread": self.spread.to_dict() if self.spread is not None else None,
                "missing": [item.to_dict() for item in self.missing],
                "failure": self.failure.to_dict() if self.failure is not None else None}


@dataclass(frozen=True)
class LaunchSummary:
    """HTA's kernel launch statistics of one rank, summarised."""

    count: int
    delay_p50_us: float | None
    short_kernels: int  # kernels shorter than their launch call
    runtime_outliers: int  # launch calls > 50 µs
    delay_outliers: int  # launch delays > 100 µs


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
    critical: PathSummary | None = None  # what bounds the steps: their critical path
    #: the critical path's shares worth showing: (kind, label, share) in display order, and largest first
    path_shares: tuple[tuple[str, str, float], ...] = ()
    path_shares_ranked: tuple[tuple[str, str, float], ...] = ()
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
class PerfettoRank:
    """One rank's part of the Perfetto timeline: its steps, counters and profiler-window events."""

    rank: int
    steps: StepSeries
    counters: dict[str, dict[str, np.ndarray]]  # track -> series -> per-interval values (display units)
    counter_ts_ns: np.ndarray
    kineto: tuple[dict[str, Any], ...]  # the window's events, ``ts`` already on the timeline (µs)
    kineto_pids: frozenset[Any]
    alignment: dict[str, Any] | None


@dataclass(frozen=True)
class PerfettoView:
    """The merged timeline of a job: ``ts`` in µs since the earliest first step (``origin_ns``)."""

    origin_ns: int
    ranks: tuple[PerfettoRank, ...]
    top: dict[str, Any]  # the window's deviceProperties / distributedInfo / schemaVersion
    notes: tuple[str, ...]


@dataclass(frozen=True)
class FlameView:
    """The folded stacks of one phase (``stepscope report --flame PHASE``), outermost frame first."""

    phase: str
    stacks: tuple[StackLine, ...]


@dataclass(frozen=True)
class StackLine:
    """One distinct folded stack (outermost frame first) and how many samples had it."""

    frames: tuple[str, ...]
    samples: int


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
    evidence: RunEvidence  # of the focus rank (report.json's evidence, facts, signals, trace)
    diagnosis: Diagnosis  # of the focus rank
    findings: tuple[Finding, ...]  # the job's (one rank: its own)
    summary: RunSummary | None = None  # a run's (None for traces)
    meta: RunMeta | None = None
    warnings: tuple[str, ...] = ()
    ranks: tuple[RankReport, ...] = ()  # every rank of a job or of several traces
    job: JobSummary | None = None
    traces: TraceViews | None = None
    timelines: SystemTimelines | None = None
    steps: StepSeries | None = None
    #: the other ranks' steady states (multi-rank runs), for the per-rank chart
    rank_steady: tuple[RankSteady, ...] = ()
    perfetto: PerfettoView | None = field(default=None, compare=False)
    flame: FlameView | None = field(default=None, compare=False)
    verification: dict[str, Any] | None = None

    @property
    def verification_view(self) -> VerificationView | None:
        """``run --verify``'s line, judged (None without trials)."""
        return verification_view(self.verification) if self.verification is not None else None

    @property
    def top_finding(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def risk(self) -> RiskLine | None:
        """The most pressing risk to the run (memory running out) when it is not the verdict: the
        verdict says why the run is slow, this says what may end it."""
        return risk_line(self.findings)

    def to_dict(self) -> dict[str, Any]:
        ev = self.evidence
        summary = self.summary
        trace_analysis = self.traces.analysis if self.traces is not None and not self.traces.from_window else None
        return {
            "kind": REPORT_KIND,
            "schema_version": REPORT_SCHEMA_VERSION,
            "source": self.source,
            "summary": _summary_dict(summary),
            "verdict": _verdict(self.findings),
            "risk": asdict(self.risk) if self.risk is not None else None,
            "findings": [finding.to_dict() for finding in self.findings],
            "diagnosis": self.diagnosis.to_dict(),
            "warnings": list(self.warnings),
            "run": None if self.meta is None else {**asdict(self.meta), "wall_s": self.meta.wall_s},
            "loaders": [asdict(loader) for loader in ev.loaders],
            "facts": asdict(ev.facts),
            "evidence": ev.to_dict(),
            "signals": ev.signals.to_dict() if ev.signals is not None else None,
            "trace": ev.trace.to_dict() if ev.trace is not None else None,
            "ranks": [item.to_dict() for item in self.ranks],
            "trace_analysis": trace_analysis.to_dict() if trace_analysis is not None else None,
            "job": self.job.to_dict() if self.job is not None else None,
            "verification": self.verification,
        }


_EMPTY_PHASES = {phase: 0.0 for phase in PHASES}


def _summary_dict(summary: RunSummary | None) -> dict[str, Any]:
    if summary is None:
        empty = StepStats(0, 0.0, None, None, None, None, None, None, None, dict(_EMPTY_PHASES),
                          dict(_EMPTY_PHASES), 0.0).to_dict()
        return {"steps": {"total": 0, "warmup": 0, "steady": 0, "excluded": []}, "steady_state": empty,
                "warmup": empty, "fetch_wait_share": None, "samples_per_step": None, "measured_phases": [],
                "step_source": None, "inference": False, "training_in_children": False, "mfu": None,
                "mfu_note": "no run record: MFU needs capture's FLOP count", "skipped_samples": None}
    return {
        "steps": {"total": summary.total_steps, "warmup": summary.warmup_steps, "steady": summary.steady_steps,
                  "excluded": list(summary.excluded_steps)},
        "steady_state": summary.steady.to_dict(),
        "warmup": summary.warmup.to_dict(),
        "fetch_wait_share": summary.fetch_wait_share,
        "samples_per_step": summary.samples_per_step,
        "measured_phases": list(summary.measured_phases),
        "step_source": summary.step_source,
        "inference": summary.inference,
        "training_in_children": summary.training_in_children,
        "mfu": asdict(summary.mfu) if summary.mfu is not None else None,
        "mfu_note": summary.mfu_note,
        "skipped_samples": summary.skipped.to_dict() if summary.skipped is not None else None,
    }


def _verdict(findings: tuple[Finding, ...]) -> dict[str, Any] | None:
    if not findings:
        return None
    top = findings[0]
    return {"family": top.family, "rule_id": top.rule_id, "title": top.title,
            "severity": top.severity.name.lower(), "impact": top.impact}
