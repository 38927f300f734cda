"""The parts of a record's :class:`~stepscope.record.facts.CaptureFacts`: what capture measured
besides the steps (the FLOP-counted step, the machine's CPU peak and operator price, `--set`
overrides, skipped samples, the training thread's account, the workers' batches).

Their own module so that the facts' container can be made without them: a trace's evidence holds
an empty :class:`~stepscope.record.facts.CaptureFacts` and never creates these classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepscope.record.phases import PHASES


@dataclass(frozen=True)
class OpCost:
    """What one tiny eager operator costs on this machine (host time: Python, module calls,
    dispatch, autograd), measured by :mod:`stepscope.capture.op_cost` or read from its cache:
    a small model's training step time over its aten operators. ``seconds_best`` is the fastest
    step's (the least disturbed), ``seconds_median`` the median's."""

    seconds_best: float
    seconds_median: float
    ops: int = 0  # operators in one step of the calibration model
    repetitions: int = 0
    source: str = "measured"  # "measured" | "cache"
    measured_wall_ns: int = 0


@dataclass(frozen=True)
class CpuPeak:
    """The float32 matmul rate this machine reaches (the CPU "peak" of MFU), with its spread.

    Measured by :mod:`stepscope.capture.cpu_peak` before the script's steps, or read from the
    per-machine cache; ``flops_best`` is the best repetition (the least disturbed), ``flops_median``
    the median, so ``flops_median / flops_best`` says how steady the machine was.
    """

    flops_best: float
    flops_median: float
    repetitions: int = 0
    threads: int | None = None
    source: str = "measured"  # "measured" | "cache" | "record" (migrated from schema 1)
    measured_wall_ns: int = 0
    dtype: str = "fp32"  # the matmul dtype measured: "fp32" or "bf16"
    #: the share of its threads' time the measurement spent waiting for a core (the run-queue delay
    #: of the process's threads over the timed repetitions / their wall time / the threads): other
    #: work held the cores; None: not known (no ``/proc`` schedstat, caches kept before it was)
    core_wait_share: float | None = None

    @property
    def spread(self) -> float:
        """Relative spread ``1 - median/best`` (0 for a perfectly steady machine)."""
        return max(0.0, 1.0 - self.flops_median / self.flops_best) if self.flops_best > 0 else 0.0


@dataclass(frozen=True)
class DeviceCopy:
    """Copies between devices that one line of the script made in the FLOP-counted step.

    ``source``/``target`` are device types (``"cpu"``, ``"cuda"``); ``pinned`` tells whether the
    host side was page-locked (a copy from pageable memory is synchronous and goes through a staging
    buffer on the CPU); ``non_blocking`` is what the call asked for. ``file``/``line``/``function``
    are the innermost frame of the user's code that made the copy (as the stack samples fold it),
    ``file`` empty when none was found. ``in_data_wait``: made inside ``next(loader)``. The counted
    step is slowed by the counting, the copies are not: ``wall_ns`` is timed around the copy alone.
    """

    file: str
    line: int
    function: str
    source: str
    target: str
    count: int
    bytes: int
    pinned: bool
    non_blocking: bool
    in_data_wait: bool = False
    #: the time the copy calls took on the training thread (a blocking copy returns when it is done)
    wall_ns: int = 0

    @property
    def to_device(self) -> bool:
        """A host-to-device copy."""
        return self.source == "cpu" and self.target != "cpu"


@dataclass(frozen=True)
class ComputeFacts:
    """What the FLOP-counted step ran (``FlopCounterMode`` and a dispatch counter over one step).

    ``ops`` counts the aten operators of the model's own work (forward, backward, optimizer and the
    rest of the step) and leaves out those run inside ``next(loader)`` (``data_ops``).
    ``matmul_flops_by_dtype`` splits the step's FLOPs by the dtype of the matmul/convolution inputs
    (``"fp32"``, ``"bf16"``, …); ``autocast`` names the autocast state seen (``"cpu:bf16"``,
    ``"cuda:fp16"``) or None.
    """

    step_index: int
    flops: int
    ops: int
    data_ops: int = 0
    matmul_flops_by_dtype: dict[str, int] = field(default_factory=dict)
    autocast: str | None = None
    param_dtypes: tuple[str, ...] = ()
    #: the copies between devices the step made, per line (largest first)
    copies: tuple[DeviceCopy, ...] = ()

    @property
    def compute_dtype(self) -> str | None:
        """The dtype that carried most of the FLOPs, or None when unknown."""
        if not self.matmul_flops_by_dtype:
            return None
        return max(self.matmul_flops_by_dtype.items(), key=lambda item: item[1])[0]


@dataclass(frozen=True)
class Override:
    """One ``stepscope run --set KEY=VALUE``: what was asked and where it took effect.

    ``applied`` counts where the value was used (DataLoaders constructed with it; for
    ``torch.num_threads``, 1 once set); ``skipped`` lists, one line each, where it could not be
    (a loader without workers for ``prefetch_factor``, a custom ``batch_sampler`` for ``batch_size``)
    and what the script asked that the override replaced (``torch.set_num_threads(4) → kept 1``).
    """

    key: str
    value: int | bool
    applied: int = 0
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Overrides:
    """The settings ``stepscope run`` changed (``--set``) and its step bound (``--max-steps``)."""

    settings: tuple[Override, ...] = ()
    max_steps: int | None = None
    stopped_at_max_steps: bool = False  # the script was stopped after max_steps steps


@dataclass(frozen=True)
class SkippedSamples:
    """Samples of one :class:`stepscope.data.SkipBadSamples` dataset that failed to load and were
    replaced by the next index's: ``total``, and per process (``by_process[0]`` is the training
    process, ``by_process[1 + i]`` DataLoader worker ``i``)."""

    dataset: str
    total: int
    by_process: tuple[int, ...] = ()


@dataclass(frozen=True)
class ThreadInfo:
    """One thread of the training process at the end of capture, with its scheduler totals since it
    started (``/proc/<pid>/task/<tid>/schedstat``). Python threads carry their name and target
    function; native ones (intra-op, runtime) their OS name."""

    native_id: int
    name: str
    function: str = ""
    cpu_ns: int = 0  # on a CPU
    runq_ns: int = 0  # runnable, waiting for a core
    python: bool = False
    training: bool = False  # the thread that ran the steps
    #: a thread that ended before capture did: when it was last seen (``perf_counter_ns``), so its
    #: rate is its CPU over the time it was seen; 0: alive when capture ended
    until_ns: int = 0
    #: a thread started during capture: when it started (``perf_counter_ns``); 0: before capture
    since_ns: int = 0


#: What a sleeping thread waits in, by the kernel function it sleeps in (``/proc/<pid>/task/<tid>/
#: wchan``; the disk also by the thread's state D): a futex (a lock: the GIL, a condition variable),
#: a sleep, a poll or select, a pipe or socket read, the disk, another function, or none readable.
#: The order is the C sampler's (``stepscope/capture/_fastrec.c``, ``wait_class``).
WAIT_CLASSES: tuple[str, ...] = ("lock", "sleep", "poll", "pipe", "disk", "other", "unknown")


@dataclass(frozen=True)
class ThreadAccount:
    """The training thread's time on sampled steps, per phase (see :mod:`stepscope.capture.account`).

    One row per accounted step (``steps``: committed step indexes); each of ``wall_ns``, ``cpu_ns``
    (the thread on a CPU), ``runq_ns`` (runnable, waiting for a core) and ``process_cpu_ns`` (every
    thread of the process, the training one included) holds one value per phase of :data:`PHASES`.
    Off CPU (blocked) is ``wall - cpu - runq``. ``peer_runq_ns``, one value per accounted step (empty
    in records before it): the longest wait for a core over the step of the process's busiest other
    non-Python threads (intra-op) — a parallel operator waits for such a thread at its barrier, on
    CPU in the training thread.
    """

    every: int
    every_early: int
    tid: int
    steps: tuple[int, ...] = ()
    wall_ns: tuple[tuple[int, ...], ...] = ()
    cpu_ns: tuple[tuple[int, ...], ...] = ()
    runq_ns: tuple[tuple[int, ...], ...] = ()
    process_cpu_ns: tuple[tuple[int, ...], ...] = ()
    threads: tuple[ThreadInfo, ...] = ()
    peer_runq_ns: tuple[int, ...] = ()
    #: what the training thread slept in, sampled on the wall clock every ``wait_interval_ns``
    #: while it was off CPU (every step, not only the accounted ones): (step, phase index in
    #: :data:`PHASES`, class index in :data:`WAIT_CLASSES`, samples). Empty in records before it
    #: and where it was not measured (no C core, no ``/proc``).
    waits: tuple[tuple[int, int, int, int], ...] = ()
    wait_interval_ns: int = 0

    def __post_init__(self) -> None:
        rows = len(self.steps)
        if self.peer_runq_ns and len(self.peer_runq_ns) != rows:
            raise ValueError(f"ThreadAccount.peer_runq_ns: expected {rows} values")
        for item in self.waits:
            if len(item) != 4 or not 0 <= item[1] < len(PHASES) or not 0 <= item[2] < len(WAIT_CLASSES) or item[3] < 0:
                raise ValueError(f"ThreadAccount.waits: {item!r} is not (step, phase, class, samples)")
        for name in ("wall_ns", "cpu_ns", "runq_ns", "process_cpu_ns"):
            table = getattr(self, name)
            if len(table) != rows or any(len(row) != len(PHASES) for row in table):
                raise ValueError(f"ThreadAccount.{name}: expected {rows} rows of {len(PHASES)} phases")


@dataclass(frozen=True)
class WorkerBatches:
    """DataLoader workers' batches, timed in each worker (see :mod:`stepscope.capture.worker_batches`).

    One entry per batch in each column, in the order written: ``pid`` (the worker), ``end_ns``
    (monotonic clock, as the steps), ``wall_ns`` (making the batch), ``cpu_ns`` (the worker on a
    CPU meanwhile), ``runq_ns`` (runnable, waiting for a core; -1 where not measured). Off CPU
    (reads, sleeps, locks) is ``wall - cpu - runq``.
    """

    pid: tuple[int, ...] = ()
    end_ns: tuple[int, ...] = ()
    wall_ns: tuple[int, ...] = ()
    cpu_ns: tuple[int, ...] = ()
    runq_ns: tuple[int, ...] = ()

    COLUMNS = ("pid", "end_ns", "wall_ns", "cpu_ns", "runq_ns")

    def __post_init__(self) -> None:
        lengths = {len(getattr(self, name)) for name in self.COLUMNS}
        if len(lengths) > 1:
            raise ValueError(f"WorkerBatches columns differ in length: {sorted(lengths)}")
        if any(value < 0 for value in (*self.wall_ns, *self.cpu_ns)):
            raise ValueError("WorkerBatches: negative wall or CPU time")

    def __len__(self) -> int:
        return len(self.pid)
