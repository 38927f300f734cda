"""The run record: the contract between capture and everything downstream.

A :class:`RunRecord` is plain, frozen data and needs no torch to read. One record per rank.

Steps are stored **column-wise** (one numpy ``int64`` array per field) because a long run has
100k+ steps: columns cost 8 bytes per step per field in memory, vectorise every statistic, and
serialise to short JSON integer lists that gzip well (see :mod:`stepscope.record.store` and
``docs/run-record.md``).

Units live in names: ``*_ns`` are nanoseconds on the monotonic clock (``time.perf_counter_ns``,
which is ``CLOCK_MONOTONIC`` on Linux and therefore shared with the sidecar sampler process),
``*_bytes`` are bytes, ratios are 0..1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from stepscope.record.compile_facts import (CompileFacts as CompileFacts, Compilation as Compilation,
                                             GraphBreak as GraphBreak, RecompileLimitHit as RecompileLimitHit)
from stepscope.record.fact_parts import (WAIT_CLASSES as WAIT_CLASSES, ComputeFacts as ComputeFacts, CpuPeak as CpuPeak,
                                         DeviceCopy as DeviceCopy, OpCost as OpCost, Override as Override,
                                         Overrides as Overrides, SkippedSamples as SkippedSamples,
                                         ThreadAccount as ThreadAccount, ThreadInfo as ThreadInfo,
                                         WorkerBatches as WorkerBatches)
from stepscope.record.facts import CaptureFacts as CaptureFacts
from stepscope.record.phases import PHASES as PHASES

SCHEMA_VERSION = 2
RECORD_KIND = "stepscope.run_record"

#: Every step column and what it holds. ``-1`` means "unknown" where a value may be missing.
STEP_COLUMNS: dict[str, str] = {
    "start_ns": "step start, monotonic clock",
    "duration_ns": "step wall time (end - start)",
    "data_wait_ns": "time inside DataLoader __next__ and __iter__ (worker start-up)",
    "loader_init_ns": "part of data_wait spent in DataLoader __iter__ (worker start-up)",
    "data_wait_cpu_ns": "CPU time of the training thread inside DataLoader __next__ (loading done in "
                        "the main process), -1 when not measured",
    "forward_ns": "time inside the outermost module calls",
    "backward_ns": "time inside Tensor.backward / torch.autograd.backward",
    "optimizer_ns": "time inside optimizer.step",
    "communication_ns": "time the step waits in collectives: torch.distributed calls from Python (until "
                        "wait() for async ones) and the exposed part of DDP's gradient all-reduce",
    "communication_overlap_ns": "collective time that ran while another phase computed (DDP buckets during "
                                "backward); not part of the partition",
    "other_ns": "the rest of the step",
    "compile_ns": "time torch.compile spent compiling inside the step (dynamo's compilation callbacks); "
                  "not part of forward or backward; 0 in records written before it",
    "batches": "batches fetched from DataLoaders during the step (micro-batches)",
    "samples": "samples in those batches (-1 when it could not be inferred)",
    "optimizer_steps": "optimizer.step calls that ended in the step",
    "device_ns": "device (CUDA) time of the step from CUDA events, -1 when not measured",
    "device_forward_ns": "device time between the forward boundaries, -1 when not measured",
    "device_backward_ns": "device time between the backward boundaries, -1 when not measured",
    "device_optimizer_ns": "device time between the optimizer boundaries, -1 when not measured",
}


@dataclass(frozen=True)
class StepTable:
    """Column-wise steps. Every array has the same length (the step count)."""

    start_ns: np.ndarray
    duration_ns: np.ndarray
    data_wait_ns: np.ndarray
    loader_init_ns: np.ndarray
    data_wait_cpu_ns: np.ndarray
    forward_ns: np.ndarray
    backward_ns: np.ndarray
    optimizer_ns: np.ndarray
    communication_ns: np.ndarray
    communication_overlap_ns: np.ndarray
    other_ns: np.ndarray
    compile_ns: np.ndarray
    batches: np.ndarray
    samples: np.ndarray
    optimizer_steps: np.ndarray
    device_ns: np.ndarray
    device_forward_ns: np.ndarray
    device_backward_ns: np.ndarray
    device_optimizer_ns: np.ndarray

    @classmethod
    def from_columns(cls, columns: dict[str, Any]) -> StepTable:
        """Build from a mapping of column name -> sequence; missing columns become -1/0."""
        length = len(columns.get("start_ns", ()))
        arrays = {}
        for name in STEP_COLUMNS:
            if name in columns:
                arrays[name] = np.asarray(columns[name], dtype=np.int64).reshape(-1)
            else:
                fill = -1 if name.startswith("device") or name in ("samples", "data_wait_cpu_ns") else 0
                arrays[name] = np.full(length, fill, dtype=np.int64)
        return cls(**arrays)

    @classmethod
    def empty(cls) -> StepTable:
        return cls.from_columns({"start_ns": []})

    def __len__(self) -> int:
        return int(self.start_ns.shape[0])

    @property
    def end_ns(self) -> np.ndarray:
        end: np.ndarray = self.start_ns + self.duration_ns
        return end

    def columns(self) -> dict[str, np.ndarray]:
        return {item.name: self.column(item.name) for item in fields(self)}

    def column(self, name: str) -> np.ndarray:
        column: np.ndarray = getattr(self, name)
        return column

    def phase(self, name: str) -> np.ndarray:
        """The ``<name>_ns`` column of a phase from :data:`PHASES`."""
        return self.column(f"{name}_ns")

    def select(self, index: slice | np.ndarray) -> StepTable:
        """A subset of steps (slice or boolean/int index)."""
        return StepTable(**{name: column[index] for name, column in self.columns().items()})

    @property
    def has_device_time(self) -> bool:
        return bool(len(self) and (self.device_ns >= 0).any())


@dataclass(frozen=True)
class LoaderInfo:
    """A DataLoader seen during the run, with the settings that matter for speed."""

    loader_id: int
    cls: str
    dataset_type: str
    iterable_dataset: bool
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    drop_last: bool
    batches: int = 0
    iterators: int = 0
    worker_pids: tuple[int, ...] = ()
    first_seen_ns: int = 0
    wait_ns: int = 0
    init_ns: int = 0

    @property
    def restarts_workers(self) -> bool:
        """Whether it starts its worker processes anew with every iterator (every epoch): workers, and
        not ``persistent_workers``."""
        return self.num_workers > 0 and not self.persistent_workers


@dataclass(frozen=True)
class DeviceInfo:
    """One accelerator the run saw (or the CPU): its index, kind, name, memory and capability."""

    index: int
    kind: str
    name: str
    total_memory_bytes: int | None = None
    capability: str | None = None


@dataclass(frozen=True)
class RunMeta:
    """Environment and outcome of a run (one rank)."""

    stepscope_version: str = ""
    python_version: str = ""
    torch_version: str | None = None
    platform: str = ""
    hostname: str = ""
    cpu_model: str = ""
    cpu_count_logical: int = 0
    cpu_count_physical: int | None = None
    #: CPUs the process may run on (its affinity mask: taskset, cgroup cpusets); None in older records
    cpu_count_usable: int | None = None
    devices: tuple[DeviceInfo, ...] = ()
    argv: tuple[str, ...] = ()
    target: str = ""
    mode: str = "script"  # "script" | "module" | "api"
    cwd: str = ""
    pid: int = 0
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0  # torchrun's GROUP_RANK (the node's rank in a multi-node job)
    local_world_size: int = 1
    start_wall_ns: int = 0
    start_ns: int = 0
    end_wall_ns: int = 0
    end_ns: int = 0
    exit_code: int | None = None
    exception: str | None = None
    interrupted_by: str | None = None
    step_source: str = "none"  # "optimizer" | "backward" | "forward" | "batch" | "explicit" | "none"
    timing: str = "cpu"  # "cpu" | "cuda"
    clock: str = "perf_counter_ns (CLOCK_MONOTONIC)"
    intra_op_threads: int | None = None
    #: environment variables that change speed (threads, devices, NCCL, torch switches; see
    #: :data:`stepscope.capture.environment.SETUP_ENV_PREFIXES`), secret-looking ones masked
    env: dict[str, str] = field(default_factory=dict)
    git_commit: str | None = None  # commit of the git repository holding the script, when there is one
    #: content hashes (sha256, first 16 hex digits) of the script and of the local modules it imported
    #: (files under the script's git repository, else its directory), by path relative to that root;
    #: ``diff`` names the files that changed (:mod:`stepscope.capture.sources`)
    source_hashes: dict[str, str] = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class ProfilerWindow:
    """A short torch.profiler window and the trace it produced."""

    first_step: int
    last_step: int
    trace_path: str | None = None



#: Ranks of one job a record may declare: a record claiming more is damaged (a job report lists
#: every declared rank without a record, so a hostile world size must not reach it).
MAX_WORLD_SIZE = 1 << 17


#: Process roles of stack samples (the ``role`` column of :class:`StackSamples`).
STACK_ROLES: tuple[str, ...] = ("main", "worker")


@dataclass(frozen=True)
class StackFrame:
    """One interned code location: file, line and function."""

    file: str
    line: int
    function: str


def _int_column(values: Any = ()) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


#: Frames that are no file of anyone's: frozen modules, ``exec`` strings, the REPL, built-ins.
SYNTHETIC_PREFIXES = ("<frozen ", "<string>", "<stdin>", "<built-in")


def is_library_path(path: str, library: tuple[str, ...], user: tuple[str, ...]) -> bool:
    """Whether a frame's file is library code by :class:`StackSamples`' rule: synthetic, or under
    a ``library`` prefix (or an installed-packages folder) and under no ``user`` prefix. The stack
    samples fold by it, and capture names the user's line of a copy by it, so the two lines agree."""
    if path.startswith(SYNTHETIC_PREFIXES):
        return True
    if user and path.startswith(user):
        return False
    return bool(library) and path.startswith(library) or \
        f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


@dataclass(frozen=True)
class StackSamples:
    """Python stacks sampled during the run (see :mod:`stepscope.capture.stacks`).

    Frames and stacks are interned: ``frames[i]`` is a :class:`StackFrame`, ``stacks[j]`` a tuple
    of frame ids from the outermost frame to the innermost. One entry per sample in each column:
    ``ts_ns`` (monotonic clock), ``step`` (committed step index, -1 outside steps), ``phase``
    (index into :data:`PHASES`, -1 unknown; a worker sample takes the main thread's phase at that
    moment), ``role`` (index into :data:`STACK_ROLES`), ``pid``, ``stack`` (index into ``stacks``).
    ``library_paths`` are the path prefixes of library code at capture time (stdlib,
    site-packages, torch, stepscope) and ``user_paths`` those that win over them (stepscope's zoo).
    """

    rate_hz: float = 0.0
    mechanism: str = ""
    frames: tuple[StackFrame, ...] = ()
    stacks: tuple[tuple[int, ...], ...] = ()
    ts_ns: np.ndarray = field(default_factory=_int_column)
    step: np.ndarray = field(default_factory=_int_column)
    phase: np.ndarray = field(default_factory=_int_column)
    role: np.ndarray = field(default_factory=_int_column)
    pid: np.ndarray = field(default_factory=_int_column)
    stack: np.ndarray = field(default_factory=_int_column)
    library_paths: tuple[str, ...] = ()
    user_paths: tuple[str, ...] = ()
    sampler_cpu_ns: int = 0  # time the main process's sampler thread spent taking samples
    missed: int = 0  # ticks that found no frame of the sampled thread
    #: ns of the sampled thread's time each sample stands for (empty in older records: one tick each)
    weight_ns: np.ndarray = field(default_factory=_int_column)

    COLUMNS = ("ts_ns", "step", "phase", "role", "pid", "stack")
    #: Columns absent from records written before them.
    OPTIONAL_COLUMNS = ("weight_ns",)

    def weights(self) -> np.ndarray:
        """Per sample, the time it stands for (float ns): ``weight_ns`` where recorded, else one
        tick (``1 / rate_hz``) each."""
        if len(self.weight_ns) == len(self) and len(self):
            weights: np.ndarray = np.maximum(self.weight_ns, 0).astype(np.float64)
            return weights
        return np.full(len(self), 1e9 / self.rate_hz if self.rate_hz else 1.0)

    def __len__(self) -> int:
        return int(self.ts_ns.shape[0])

    def check(self) -> None:
        lengths = {len(getattr(self, name)) for name in self.COLUMNS}
        if len(self.weight_ns) and len(self.weight_ns) != len(self):
            lengths.add(len(self.weight_ns))
        if len(lengths) > 1:
            raise ValueError(f"stack sample columns differ in length: {sorted(lengths)}")
        if len(self) and (int(self.stack.max()) >= len(self.stacks) or int(self.stack.min()) < 0):
            raise ValueError("stack sample refers to an unknown stack")
        if any(frame_id >= len(self.frames) or frame_id < 0 for stack in self.stacks for frame_id in stack):
            raise ValueError("stack refers to an unknown frame")


@dataclass(frozen=True)
class GcPauses:
    """Garbage-collector pauses, timed exactly with ``gc.callbacks`` (one entry per collection).

    Columns: ``start_ns`` (monotonic clock), ``duration_ns``, ``generation`` (0-2), ``collected``,
    ``uncollectable``, ``step`` (committed step index, -1 outside steps) and ``phase`` (index into
    :data:`PHASES` of the phase it interrupted, -1 unknown). ``enabled`` says whether pauses were
    measured at all (an empty table is then "no collection happened").
    """

    enabled: bool = False
    start_ns: np.ndarray = field(default_factory=_int_column)
    duration_ns: np.ndarray = field(default_factory=_int_column)
    generation: np.ndarray = field(default_factory=_int_column)
    collected: np.ndarray = field(default_factory=_int_column)
    uncollectable: np.ndarray = field(default_factory=_int_column)
    step: np.ndarray = field(default_factory=_int_column)
    phase: np.ndarray = field(default_factory=_int_column)

    COLUMNS = ("start_ns", "duration_ns", "generation", "collected", "uncollectable", "step", "phase")

    def __len__(self) -> int:
        return int(self.start_ns.shape[0])

    def check(self) -> None:
        lengths = {len(getattr(self, name)) for name in self.COLUMNS}
        if len(lengths) > 1:
            raise ValueError(f"GC pause columns differ in length: {sorted(lengths)}")
        if len(self) and (self.duration_ns < 0).any():
            raise ValueError("negative GC pause duration")


def steps_of(ts_ns: np.ndarray, steps: StepTable) -> np.ndarray:
    """The committed step index each timestamp falls in (``start <= ts < end``), -1 outside steps."""
    ts_ns = _int_column(ts_ns)
    if not len(steps) or not len(ts_ns):
        return np.full(len(ts_ns), -1, dtype=np.int64)
    index = np.searchsorted(steps.start_ns, ts_ns, side="right") - 1
    inside = (index >= 0) & (ts_ns < steps.end_ns[np.clip(index, 0, None)])
    return np.where(inside, index, -1).astype(np.int64)


@dataclass(frozen=True)
class RunRecord:
    """Everything captured for one rank of one run.

    ``samples`` is the sidecar sampler's data when it ran (see :mod:`stepscope.record.samples`),
    attached by :func:`stepscope.record.store.load_record`; it is stored in its own file.
    """

    meta: RunMeta
    steps: StepTable
    loaders: tuple[LoaderInfo, ...] = ()
    warnings: tuple[str, ...] = ()
    profiler_windows: tuple[ProfilerWindow, ...] = ()
    samples: Any = None
    facts: CaptureFacts = field(default_factory=CaptureFacts)
    schema_version: int = SCHEMA_VERSION
    stack_samples: StackSamples = field(default_factory=StackSamples)
    gc_pauses: GcPauses = field(default_factory=GcPauses)

    def check(self) -> None:
        """Assert the record's invariants (used by tests and after loading)."""
        meta = self.meta
        if not (type(meta.world_size) is int and 1 <= meta.world_size <= MAX_WORLD_SIZE):
            raise ValueError(f"world_size {meta.world_size!r} is not between 1 and {MAX_WORLD_SIZE}")
        if not (type(meta.rank) is int and 0 <= meta.rank < MAX_WORLD_SIZE):
            raise ValueError(f"rank {meta.rank!r} is not between 0 and {MAX_WORLD_SIZE - 1}")
        steps = self.steps
        lengths = {len(column) for column in steps.columns().values()}
        if len(lengths) > 1:
            raise ValueError(f"step columns differ in length: {sorted(lengths)}")
        self.stack_samples.check()
        self.gc_pauses.check()
        if len(steps) == 0:
            return
        total = sum(steps.phase(name) for name in PHASES)
        if not np.array_equal(total, steps.duration_ns):
            bad = int(np.flatnonzero(total != steps.duration_ns)[0])
            raise ValueError(f"phases do not add up to the step duration at step {bad}")
        if (steps.duration_ns < 0).any() or any((steps.phase(p) < 0).any() for p in PHASES):
            raise ValueError("negative durations in steps")
        if (np.diff(steps.start_ns) < 0).any():
            raise ValueError("step start times are not ordered")
        if (steps.loader_init_ns > steps.data_wait_ns).any():
            raise ValueError("loader_init_ns exceeds data_wait_ns")
