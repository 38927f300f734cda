"""Evidence handed to the diagnosis engine: the contract between analyses and rules.

Two producers fill these, each independently optional:

- :class:`MacroSignals` — from the sidecar sampler's samples joined with the steps
  (``stepscope.analysis.run.signals.compute_signals``).
- :class:`TraceEvidence` — from torch.profiler (Kineto) traces
  (``stepscope.analysis`` trace views, via ``stepscope analyze`` or ``stepscope run``'s windows).

Every field is ``None`` when it could not be measured; rules must treat ``None`` as "no evidence",
never as zero. Ratios are 0..1, rates per second, sizes in bytes. Fields may be added (never
renamed or removed without a schema note): ``report.json`` carries ``to_dict()`` of both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerLoad:
    """CPU load of one process of the training tree over the steady state."""

    pid: int
    role: str  # "main" | "dataloader_worker" | "other"
    cpu_util: float  # mean share of one core, 0..1 (can exceed 1 for multi-threaded processes)
    rss_bytes: int | None = None
    threads: int | None = None  # OS threads of the process (max over the steady state)
    #: threads it ran on, on average: its CPU over its main thread's (None: not measured)
    running_threads: float | None = None
    #: share of the window's time it was sampled in: below 1 for DataLoader workers restarted every
    #: epoch, each living part of the window (``cpu_util`` is over its own time)
    presence: float = 1.0


@dataclass(frozen=True)
class MacroSignals:
    """Derived signals of the machine during the run (sampler samples ⨝ steps)."""

    sample_count: int = 0
    interval_s: float | None = None
    cpu_count: int | None = None
    # CPU
    cpu_util_mean: float | None = None  # all cores, 0..1
    busiest_core_util: float | None = None  # mean utilisation of the busiest core
    idlest_core_util: float | None = None
    saturated_cores: int | None = None  # cores above 90% on average
    iowait_share: float | None = None  # mean iowait share of CPU time, 0..1
    steal_share: float | None = None  # share of CPU time the hypervisor gave other guests, 0..1
    load_per_core: float | None = None  # runnable load average / cores
    runnable_threads_per_core: float | None = None
    # processes of the training tree
    main_cpu_util: float | None = None
    worker_count: int | None = None
    workers: tuple[WorkerLoad, ...] = ()
    worker_cpu_util_mean: float | None = None  # mean over DataLoader workers
    worker_saturation: float | None = None  # share of workers above 90% of a core
    # CPU of the loading processes (main when num_workers=0, else workers; share of one core)
    # while the main process waited for data: separates CPU-bound from storage/latency-bound input
    data_wait_cpu_util: float | None = None
    # share of the DataLoader workers' samples inside the window in which the worker was running or
    # runnable (scheduler state R): with little CPU, a low share means blocked (reads, a slow
    # source, an empty index queue), not starved of cores; None under LOADER_STATE_MIN samples
    loader_runnable_share: float | None = None
    thread_count_max: int | None = None
    #: the DataLoader workers' threads they ran on, pooled over every worker process of the window
    #: (their CPU over their main threads'): for workers too short-lived to be read one by one
    worker_running_threads: float | None = None
    # storage
    disk_read_bytes_per_s: float | None = None
    disk_read_bytes_per_s_early: float | None = None  # first part of the run
    disk_read_bytes_per_s_late: float | None = None  # last part of the run
    page_cache_warming: bool | None = None  # reads high early, low late
    # memory
    memory_used_share_max: float | None = None
    memory_total_bytes: int | None = None  # host RAM
    # the training process's memory trend over the window: anonymous resident bytes (heap and
    # stacks) where the sampler read them, else the RSS (``rss_growth_basis`` says which); the
    # slopes of the first and second half tell a steady leak from a ramp that levels off
    rss_growth_bytes_per_s: float | None = None
    rss_growth_first_half_bytes_per_s: float | None = None
    rss_growth_second_half_bytes_per_s: float | None = None
    rss_growth_points: int | None = None
    rss_growth_basis: str | None = None  # "anonymous" | "rss"
    swap_in_bytes_per_s: float | None = None
    swap_out_bytes_per_s: float | None = None
    # network
    net_bytes_per_s: float | None = None
    # GPU (None without NVML)
    gpu_count: int | None = None
    gpu_util_mean: float | None = None
    gpu_util_oscillation: float | None = None  # spread of utilisation within the step period, 0..1
    gpu_memory_used_share_max: float | None = None
    # processes outside the training tree that used the most CPU: (pid, name, share of one core)
    foreign_processes: tuple[tuple[int, str, float], ...] = ()
    # the run's own CPU the per-process rows miss: children that started and ended between two
    # samples (cores, mean over the window; None unmeasured)
    unseen_tree_cores: float | None = None
    # the job's other processes on this machine (the launcher, the other ranks): cores, None outside a job
    job_cores: float | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StepShares:
    """The TensorBoard plugin's step-time categories, each a share of the mean step (they add up to 1
    with "Other")."""

    kernel: float | None = None
    memcpy: float | None = None
    memset: float | None = None
    communication: float | None = None
    runtime: float | None = None
    dataloader: float | None = None
    cpu_exec: float | None = None


@dataclass(frozen=True)
class GpuIdle:
    """Device idle time — one definition, HTA's: the gaps in the union of all GPU rows, as a share of
    ``kernel_time`` (first to last GPU activity) — split by what the host did meanwhile
    (:class:`~stepscope.traces.timeline.GpuTimeline`); the four causes add up to ``share``. HTA's
    per-stream idle categories are a view for parity (``trace_analysis``), not evidence."""

    share: float | None = None
    dataloader: float | None = None  # host inside a DataLoader range: waiting for data
    sync: float | None = None  # host inside a synchronising runtime call
    launch: float | None = None  # host in other runtime calls / kernel-issuing operators
    other: float | None = None  # none of these (Python, host-only work, untraced)


@dataclass(frozen=True)
class DeviceUse:
    """How well the busy device was used (the plugin's GPU summary, mean over devices)."""

    utilization: float | None = None
    sm_efficiency: float | None = None
    achieved_occupancy: float | None = None
    tensor_core_kernel_share: float | None = None  # share of kernel time on Tensor Cores
    tensor_core_eligible_op_share: float | None = None  # share of op time in TC-eligible ops


@dataclass(frozen=True)
class KernelLaunches:
    """Kernels per step and how their launches compare with them."""

    kernels_per_step: float | None = None
    median_kernel_us: float | None = None
    small_kernel_share: float | None = None  # kernels shorter than their launch call
    launch_delay_us_median: float | None = None


@dataclass(frozen=True)
class HostTime:
    """Shares of host thread time in the steps (exclusive)."""

    python: float | None = None
    aten: float | None = None


@dataclass(frozen=True)
class SyncsAndCopies:
    """Host–device synchronisations and copies in the traced steps."""

    syncs_per_step: float | None = None  # cudaDeviceSynchronize / StreamSynchronize / item()
    sync_share: float | None = None  # of the steps' time
    pageable_memcpy_share: float | None = None  # of memcpy time


@dataclass(frozen=True)
class DeviceMemoryUse:
    """The device memory the trace saw allocated at its peak, and the device's capacity."""

    peak_bytes: int | None = None
    capacity_bytes: int | None = None


@dataclass(frozen=True)
class CompiledGraphs:
    """torch.compile in the trace (``stepscope.analysis.trace.compiled_regions``)."""

    graphs_per_step: float
    recompiled_frames: tuple[str, ...] = ()  # frames with a variant F/N, N > 0
    variants: tuple[str, ...] = ()
    between_graphs_us_per_step: float = 0.0  # time between the graphs of one compiled call (graph breaks)
    step_us: float | None = None  # the profiled steps' mean duration


@dataclass(frozen=True)
class CriticalPathShares:
    """What bounds the traced steps: shares of their critical path
    (:mod:`stepscope.analysis.trace.critical_path`; they add up to 1)."""

    cpu: float = 0.0  # CPU operators and the Python between them
    data_loading: float = 0.0  # inside DataLoader ranges
    launch: float = 0.0  # from a launch call's start to its kernel's start, the stream empty
    kernel_gaps: float = 0.0  # idle stream between two kernels on the path
    gpu_compute: float = 0.0
    memory_copies: float = 0.0  # memcpy / memset rows
    communication: float = 0.0  # collectives
    sync_wait: float = 0.0  # a blocking call's own time no device work in the trace explains
    after_sync: float = 0.0  # device idle while the path is on the host right after a sync
    syncs: tuple[str, ...] = ()  # what the path waited on ("cudaStreamSynchronize waited for stream 7")
    length_us: float = 0.0  # mean path length per step
    span_us: float = 0.0  # mean duration of the steps analysed

    def of_step(self, share: float) -> float:
        """A share of the path as a share of the step (they differ where the path is longer than the
        step — device work outliving it — or shorter); the share itself when a length is unknown."""
        return share * self.length_us / self.span_us if self.length_us > 0 and self.span_us > 0 else share


@dataclass(frozen=True)
class TraceEvidence:
    """What a torch.profiler trace says about one rank, as typed parts (plugin/HTA-defined numbers)."""

    source: str = ""  # trace file(s)
    rank: int = 0
    rank_source: str = ""
    steps: int = 0
    device: str | None = None  # e.g. "NVIDIA H200"; None for CPU-only traces
    step_time_s: float | None = None
    shares: StepShares = StepShares()
    idle: GpuIdle = GpuIdle()
    device_use: DeviceUse = DeviceUse()
    launches: KernelLaunches = KernelLaunches()
    host: HostTime = HostTime()
    syncs: SyncsAndCopies = SyncsAndCopies()
    memory: DeviceMemoryUse = DeviceMemoryUse()
    comm_overlap: float | None = None  # share of communication overlapped by computation
    #: collectives' share of the step less what computation hides: shares.communication × (1 − comm_overlap)
    exposed_communication: float | None = None
    compiled: CompiledGraphs | None = None  # None without compiled code
    critical_path: CriticalPathShares | None = None  # None without a graph to build (no operators)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
