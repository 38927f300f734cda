"""The views of the commands that report on something other than one run: ``try``, ``tune-loader``,
``gpu-procs``, ``monitor``, ``runs`` and ``demo --list``.

Each is plain typed data made by :mod:`stepscope.pipeline.commands` from its command's inputs, with
every number, choice and threshold already applied; the renderers of :mod:`stepscope.report.render`
(chosen from its table by the view's ``kind`` and the output's name) only format it. Nothing here
refers to an analysis, record or capture type: a renderer that imports this module sees only this.
A ``document`` field is the command's JSON output as plain data (what ``--json`` / ``--format json``
prints, from the same view).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


# -- try -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialRow:
    """One setting of ``stepscope try`` measured over its trials (the baseline first)."""

    name: str
    baseline: bool
    step_time_s: float | None  # median over trials of the mean steady step
    step_time_min_s: float | None
    step_time_max_s: float | None
    throughput: float | None
    throughput_min: float | None
    throughput_max: float | None
    speedup: float | None  # throughput / the baseline's
    speedup_low: float | None
    speedup_high: float | None
    expected_speedup: float | None  # what the diagnosis expected: 1 / (1 - its expected gain)
    verdict: str
    failed: int  # trials of this setting that failed
    settings: tuple[tuple[str, str], ...]  # the `run --set` keys and values that make it


@dataclass(frozen=True)
class TryView:
    """``stepscope try``: the trials' table, the best change (or why there is none), the
    prescriptions that need code changes."""

    kind: ClassVar[str] = "try"
    target: str
    steps: int
    repeats: int
    unit: str  # "samples/s" | "steps/s"
    rows: tuple[TrialRow, ...]
    best: TrialRow | None
    #: why no change is best: "no_trial", "no_baseline", "no_candidate" (nothing measured on one
    #: side) or "within_noise"; None when there is a best change or no row
    no_best: str | None
    failed: str | None  # the failures' summary
    show_failed: bool  # the summary gets a line of its own (a comparison was made)
    code_changes: tuple[tuple[str, str], ...]  # (action, source) of prescriptions not tried
    notes: tuple[str, ...]
    document: Mapping[str, Any]  # whatif.json


# -- tune-loader -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoaderTrialRow:
    """One trial of ``stepscope tune-loader``."""

    number: int
    stage: str
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    batch_size: int | None
    setting: str  # the setting as keyword arguments
    samples_per_s: float
    first_batch_s: float
    restart_s: float
    error: str | None
    best: bool  # the repeat of the best setting


@dataclass(frozen=True)
class TuneView:
    """``stepscope tune-loader``: the trials, the current and the best setting, the speed-up."""

    kind: ClassVar[str] = "tune"
    target: str
    rows: tuple[LoaderTrialRow, ...]
    current: str
    current_rate: float
    best: str
    best_rate: float
    best_workers: int
    speedup: float
    noise: float | None
    elapsed_s: float
    budget_exhausted: bool
    notes: tuple[str, ...]
    oversubscribed: bool  # the best workers plus the intra-op threads exceed the cores
    intra_op_threads: int
    cpu_count: int
    suggested_threads: int


@dataclass(frozen=True)
class LoaderProgress:
    """One trial of ``tune-loader`` as it ends (a progress line on stderr)."""

    kind: ClassVar[str] = "tune_progress"
    trial: LoaderTrialRow


# -- gpu-procs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuProcessRow:
    pid: int
    ppid: int | None
    user: str
    gpus: tuple[int, ...]
    gpu_memory_bytes: int | None
    age_s: float | None
    state: str
    stale: str | None  # why it looks stale; None when it does not


@dataclass(frozen=True)
class GpuProcsView:
    """``stepscope gpu-procs``: who holds GPU memory (or why no GPU is visible)."""

    kind: ClassVar[str] = "gpu_procs"
    gpu_count: int
    rows: tuple[GpuProcessRow, ...]
    commands: tuple[str, ...]  # each row's command line
    notes: tuple[str, ...]
    no_gpu: str | None  # why no NVIDIA GPU is visible (None: one is)
    document: Sequence[Mapping[str, Any]]  # the rows as --json prints them


@dataclass(frozen=True)
class LeftAlone:
    """A stale process ``--kill`` does not end, and why: ``other_user`` (``owner`` names it),
    ``zombie`` (``parent`` reaps it) or ``unconfirmed`` (``reason``)."""

    pid: int
    why: str
    owner: str = ""
    parent: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class KillPlan:
    """What ``gpu-procs --kill`` will do, before it asks."""

    kind: ClassVar[str] = "kill_plan"
    left_alone: tuple[LeftAlone, ...]
    to_end: tuple[int, ...]  # the pids it will end
    grace_s: float  # SIGTERM, then SIGKILL after this
    ask: bool  # the question comes next (no --yes)


@dataclass(frozen=True)
class KillOutcome:
    """What ``gpu-procs --kill`` did: each pid's outcome (``ended``, ``killed``, ``stuck``, ``gone``,
    ``reused``, ``released``, ``denied``), or ``declined`` when the answer was no."""

    kind: ClassVar[str] = "kill_outcome"
    declined: bool
    outcomes: tuple[tuple[int, str], ...]


# -- monitor ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceRow:
    kind: str  # "disk" or "net"
    name: str
    read_bytes_per_s: float | None  # or received
    write_bytes_per_s: float | None  # or sent


@dataclass(frozen=True)
class GpuRowView:
    index: int
    name: str
    util: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    sm_clock_mhz: int | None
    power_w: float | None
    temperature_c: int | None
    pcie_tx_bytes_per_s: int | None
    pcie_rx_bytes_per_s: int | None
    util_level: str = "low"  # how its bar reads (see MonitorView.core_levels)


@dataclass(frozen=True)
class ProcessRowView:
    pid: int
    user: str
    role: str
    state: str
    cpu_util: float | None
    rss_bytes: int | None
    threads: int | None
    gpu_memory_bytes: int | None
    command: str


@dataclass(frozen=True)
class MonitorView:
    """One frame of ``stepscope monitor``: every number from the sampler's arithmetic."""

    kind: ClassVar[str] = "monitor"
    hostname: str
    pid: int | None  # the process tree shown (None: the whole machine)
    interval_s: float
    live: bool  # refreshed on a terminal until q or Ctrl-C (the screen says how to quit)
    core_utils: tuple[float | None, ...]
    #: how each core's bar reads: "high" (saturated), "busy" or "low"
    core_levels: tuple[str, ...]
    cpu_util: float | None
    iowait_share: float | None
    load1: float | None
    runnable_threads: int | None
    mem_used_bytes: int
    mem_cached_bytes: int
    mem_total_bytes: int
    mem_used_share: float | None
    mem_level: str
    swap_used_bytes: int
    swap_total_bytes: int
    swap_used_share: float | None  # None without swap
    swap_level: str
    swap_in_bytes_per_s: float | None
    swap_out_bytes_per_s: float | None
    devices: tuple[DeviceRow, ...]
    gpus: tuple[GpuRowView, ...]
    processes: tuple[ProcessRowView, ...]
    with_roles: bool  # a process tree (roles shown), not the whole machine
    notes: tuple[str, ...]
    document: Mapping[str, Any]  # --once --json


@dataclass(frozen=True)
class MonitorEnded:
    """The process tree ``monitor --pid`` showed has ended."""

    kind: ClassVar[str] = "monitor_ended"
    pid: int


# -- runs ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunRow:
    """One run of the index."""

    run_dir: str  # as shown: relative to the current directory when below it
    full_dir: str
    exists: bool
    started_at: float  # 0: not known
    tags: tuple[str, ...]
    steps: int
    step_time_s: float | None
    samples_per_s: float | None
    script: str  # the script's file name ("?" unknown)
    top_title: str | None
    top_severity: str


@dataclass(frozen=True)
class PlotPoint:
    run: RunRow
    value: float
    fraction: float  # value / the largest value


@dataclass(frozen=True)
class RunsView:
    """``stepscope runs``: the runs of the index, or one metric over them (``plot``)."""

    kind: ClassVar[str] = "runs"
    index: str
    rows: tuple[RunRow, ...]
    metric: str | None  # the plotted metric (None: the list)
    metric_kind: str  # how its values read: "share", "duration" or "number"
    points: tuple[PlotPoint, ...]
    top: float  # the largest plotted value (1.0 without points)
    document: Mapping[str, Any]  # --format json


# -- demo ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScenarioRow:
    name: str
    default: bool
    planted: str
    title: str
    mechanism: str


@dataclass(frozen=True)
class ScenarioList:
    """``stepscope demo --list``."""

    kind: ClassVar[str] = "scenarios"
    rows: tuple[ScenarioRow, ...]


CommandView = (TryView | TuneView | LoaderProgress | GpuProcsView | KillPlan | KillOutcome | MonitorView
               | MonitorEnded | RunsView
               | ScenarioList)
