"""The run's part of the report's view-model: the summary of a captured run, its job, its machine,
its charts' series and its exports' views (what only a run record brings).

Each type here is plain typed data computed by the pipeline (:mod:`stepscope.pipeline.views`) and
held by :class:`~stepscope.report.model.Report`; the same contract as :mod:`stepscope.report.model`,
whose docstring says it. They live apart from the trace views so that ``stepscope analyze``, which
builds none of them, does not create them (about a tenth of a small trace's run went to defining
classes it never used).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["AccountSummary", "CompileLine", "EagerFrame", "FlameView", "GcLine", "JobRankRow", "JobSpread",
           "JobSummary", "LoaderLine", "MachineTimelines", "MachineView", "MfuLine", "MissingRankLine",
           "OverriddenSetting", "OverridesLine", "PerfettoRank", "PerfettoView", "RankSteps", "RunSummary",
           "SkipSummary", "SkippedDataset", "StackLine", "StepSeries", "StepTimes", "VerificationView",
           "verification_view"]


@dataclass(frozen=True)
class SkippedDataset:
    """One ``SkipBadSamples`` dataset's skipped samples: in all, and per process (``by_process[0]``
    the training process, ``by_process[1 + i]`` DataLoader worker ``i``)."""

    dataset: str
    total: int
    by_process: tuple[int, ...]


@dataclass(frozen=True)
class SkipSummary:
    """Samples the script's ``SkipBadSamples`` datasets replaced because they failed to load."""

    total: int
    delivered: int | None  # samples in the recorded steps' batches (None when not inferred)
    datasets: tuple[SkippedDataset, ...]
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
class StepTimes:
    """What the summary shows of the steady steps: their count, step time and rates, and each
    phase's share and mean (a share of 0.0 for a phase that did not run)."""

    count: int
    mean_s: float | None
    median_s: float | None
    p90_s: float | None
    max_s: float | None
    steps_per_s: float | None
    samples_per_s: float | None
    phase_shares: dict[str, float]  # phase -> share of the step (PHASES)
    phase_mean_s: dict[str, float]  # phase -> mean seconds per step


@dataclass(frozen=True)
class RankSteps:
    """Another rank's steady step, for the per-rank chart of a job."""

    rank: int
    mean_s: float | None
    phase_mean_s: dict[str, float]
    phase_shares: dict[str, float]


@dataclass(frozen=True)
class MfuLine:
    """The model FLOPs utilisation with its range, and the peak it is a share of."""

    value: float
    low: float
    high: float
    dtype: str
    peak_source: str  # "NVIDIA H100 80GB HBM3 datasheet bf16", "measured fp32 matmul peak of this CPU"


@dataclass(frozen=True)
class EagerFrame:
    """A compiled frame that hit the recompile limit and runs eager from then on."""

    function: str
    limit_hit_step: int | None  # the step it runs eager from (negative: before the steps)
    limit: int | None


@dataclass(frozen=True)
class CompileLine:
    """torch.compile over the run, as the summary's line shows it."""

    frames: int  # frames dynamo compiled
    compilations: int
    recompiles: int
    compile_s: float
    compile_share: float  # of the steps' time
    eager_frames: tuple[EagerFrame, ...]
    graph_break_count: int
    speedup: float | None  # eager step time / compiled step time


@dataclass(frozen=True)
class GcLine:
    """The garbage collector's pauses, when they take a share of the step worth a line."""

    share_of_step_time: float | None
    pauses_per_step: float | None
    largest_s: float | None  # the longest pause


@dataclass(frozen=True)
class LoaderLine:
    """One DataLoader: the settings the summary lists (those in effect) and what it delivered."""

    loader_id: int
    dataset_type: str  # the dataset's class, qualified
    batch_size: int | None
    num_workers: int
    prefetch_factor: int | None
    persistent_workers: bool
    pin_memory: bool
    drop_last: bool
    batches: int
    wait_ns: int  # the training loop's wait for its batches
    #: its workers' own time per batch over the steady window (one worker's; ``blocked_s`` of it off
    #: CPU) and the floor they set per step, when the workers were timed (evidence.loader_floor)
    worker_batch_s: float | None = None
    worker_blocked_s: float | None = None
    floor_s: float | None = None


@dataclass(frozen=True)
class OverriddenSetting:
    """One ``run --set KEY=VALUE`` and where it took effect."""

    key: str
    value: int | bool
    applied: int  # loaders (or torch settings) that used it
    notes: int  # places it could not be applied (the record says why)


@dataclass(frozen=True)
class OverridesLine:
    """``run --set`` and ``--max-steps``, as the summary's line shows them."""

    settings: tuple[OverriddenSetting, ...]
    max_steps: int | None
    stopped_at_max_steps: bool


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
    steady: StepTimes
    warmup_s: float  # the warm-up steps' time in all
    measured_phases: tuple[str, ...]
    samples_per_step: int | None
    fetch_wait_share: float | None
    mfu: MfuLine | None
    #: MFU worth a line in the summary: the model computes a real part of the step (an input-bound
    #: run's MFU measures the wait, not the model) and it reads above 0.0 %
    mfu_shown: bool
    mfu_note: str | None
    compile: CompileLine | None
    gc: GcLine | None  # None when the pauses take too small a share of the step to be worth a line
    loaders: tuple[LoaderLine, ...]
    overrides: OverridesLine | None
    skipped: SkipSummary | None
    machine: MachineView | None  # what the sampler saw (None without a sampler)
    machine_notes: tuple[str, ...] = ()  # the sampler's notes worth a line (not NVML's absence on a CPU run)
    account: AccountSummary | None = None  # the training thread's account (None unmeasured)
    interrupted_by: str | None = None  # the signal that ended the run, when one did
    mode: str = "script"  # how capture ran: "script", "module" or "api" (a library session: no exit status)


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
    gpu_starved: bool  # mean utilisation below GPU_UTIL_LOW (pipeline.views)
    gpu_util_oscillation: float | None
    gpu_memory_used_share_max: float | None


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
class MachineTimelines:
    """The sampler's series per interval, for the machine's charts and exported scalars (NaN: not
    measured; every series ``len(t_ns)`` long, per core or per GPU as a column)."""

    t_ns: np.ndarray  # interval end, on the run's monotonic clock
    core_busy: np.ndarray  # (intervals, cores) busy share
    cpu_busy_mean: np.ndarray  # busy share of all cores (NaN where no core was measured)
    cpu_ids: tuple[int, ...]
    main_cpu: np.ndarray  # cores (1.0 = one core)
    workers_cpu: np.ndarray  # the DataLoader workers together, cores
    has_workers: bool  # a DataLoader worker was alive at some interval
    disk_read: np.ndarray  # bytes/s
    disk_write: np.ndarray  # bytes/s
    mem_used: np.ndarray  # bytes (machine)
    mem_total_bytes: int
    main_rss: np.ndarray  # bytes
    has_gpu: bool  # a GPU's utilisation was measured
    gpu_util: np.ndarray  # (intervals, gpus) share
    gpu_mem_used: np.ndarray  # (intervals, gpus) bytes
    gpu_names: tuple[str, ...]
    gpu_mem_total_bytes: tuple[int, ...]

    def __len__(self) -> int:
        return int(self.t_ns.shape[0])


@dataclass(frozen=True)
class JobRankRow:
    """One rank of the job's table: its step and where the step went, per step."""

    rank: int
    node: int
    step_time_s: float | None
    data_wait_s: float | None
    compute_s: float | None
    communication_s: float | None  # waiting in collectives
    overlapped_s: float | None  # communication hidden under backward
    cpu_util: float | None
    rss_bytes: int | None


@dataclass(frozen=True)
class JobSpread:
    """How far apart the ranks' steps are, and the rank with the most work of its own."""

    step_time_min_s: float
    step_time_max_s: float
    step_time_spread: float
    slowest_rank: int


@dataclass(frozen=True)
class MissingRankLine:
    """A rank of the job without a record, and why."""

    rank: int
    reason: str


@dataclass(frozen=True)
class JobSummary:
    """A multi-rank job: one row per rank with a record, the spread, the ranks without a record."""

    world_size: int
    rows: tuple[JobRankRow, ...]
    spread: JobSpread | None
    missing: tuple[MissingRankLine, ...]
    several_nodes: bool
    failure: str | None = None  # how the rank that failed first ended, when one did


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
