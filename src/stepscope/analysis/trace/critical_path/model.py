"""The critical path's vocabulary: edge types, what bounds a path edge, the calls each pass
recognises, where the default mode departs from HTA, and the result types."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from stepscope.lazy_rows import LazyRows

IntArray = npt.NDArray[np.int64]

# edge types (HTA's CPEdgeType, short)
OPERATOR, DEPENDENCY, LAUNCH, KERNEL_GAP, SYNC = "operator", "dependency", "launch", "kernel_gap", "sync"
WAIT = "wait"  # default mode: a blocking call's own time, when no device work explains more of it
HTA_EDGE_TYPES = {
    OPERATOR: "critical_path_operator", DEPENDENCY: "critical_path_dependency",
    LAUNCH: "critical_path_kernel_launch_delay", KERNEL_GAP: "critical_path_kernel_kernel_delay",
    SYNC: "critical_path_sync_dependency", WAIT: "stepscope_blocking_wait",
}
# what bounds a path edge
CPU, DATA_LOADING, LAUNCH_OVERHEAD, GAP, GPU_COMPUTE, GPU_MEMORY, COMM, SYNC_WAIT = (
    "cpu", "data_loading", "launch_overhead", "kernel_gap", "gpu_compute", "gpu_memory", "communication", "sync_wait")
BOUND_KINDS = (CPU, DATA_LOADING, LAUNCH_OVERHEAD, GAP, GPU_COMPUTE, GPU_MEMORY, COMM, SYNC_WAIT)
BOUND_LABELS = {
    CPU: "CPU (Python / framework)", DATA_LOADING: "data loading", LAUNCH_OVERHEAD: "kernel launch",
    GAP: "gaps between kernels", GPU_COMPUTE: "GPU compute", GPU_MEMORY: "memory copies",
    COMM: "communication", SYNC_WAIT: "waiting on the device",
}
#: HTA's summary names for ours (``gpu_compute_bound`` covers compute and memory rows).
HTA_BOUND = {CPU: "cpu_bound", DATA_LOADING: "data_loading", LAUNCH_OVERHEAD: "gpu_kernel_launch_overhead",
             GAP: "gpu_kernel_kernel_overhead", GPU_COMPUTE: "gpu_compute_bound", GPU_MEMORY: "gpu_compute_bound",
             COMM: "gpu_communication_bound", SYNC_WAIT: "cpu_bound"}

#: A path edge attributed to no event: the time between two top-level operators of a thread.
BETWEEN_OPS = -3
KERNEL_GAP_LIMIT_US = 1500.0  # HTA: a longer gap on a stream is an unrecognised dependency
#: A blocking call's wait is named among what the path waited on from this long (a poll such as
#: ``cudaEventQuery`` returns in microseconds).
WAIT_WORTH_NAMING_US = 100.0
RUNTIME_LOCK_CALLS = frozenset(("cudaHostAlloc", "cudaLaunchKernel", "cudaMemcpyAsync"))
BLOCKING_CALLS = frozenset(("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventQuery",
                            "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync"))
LAUNCH_CALLS = frozenset((
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaMemcpyAsync",
    "cudaMemsetAsync", "runFunction - job_prep_and_submit_for_execution", "hipLaunchKernel",
    "hipExtModuleLaunchKernel", "hipMemsetAsync", "hipMemcpyAsync", "hipMemcpyWithStream"))
#: The launches of kernels (asynchronous: never taken for a blocking call)
KERNEL_LAUNCH_CALLS = frozenset(("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                                 "hipLaunchKernel", "hipExtModuleLaunchKernel"))
#: ... and, in the default mode, a CUDA graph's replay (HTA does not count it as a launch)
GRAPH_LAUNCH_CALLS = frozenset(("cudaGraphLaunch", "hipGraphLaunch"))
NODE_CATS = ("cpu_op", "cuda_runtime", "cuda_driver")

#: Where the default mode departs from HTA (``hta=True`` turns all of them off).
DIFFERENCES = {
    "python_gaps": "the time between two top-level operators on a thread (Python, the framework, "
                   "untraced work) weighs what it lasted, less the time other threads of the process ran "
                   "operators then (the path may go through those instead: the main thread inside "
                   "loss.backward() waits for the autograd thread); HTA gives it 0, so its path misses that CPU time",
    "data_loading": "data loading is everything under a DataLoader range (its children included); HTA "
                    "counts only the gaps between the range's children, and only for patterns the caller passes",
    "graph_launches": "a cudaGraphLaunch launches every kernel with its correlation (HTA keeps one: #290)",
    "ill_nested": "a CPU event that outlives its parent (out-of-order stacks) is cut at the parent's end; "
                  "HTA's walk then builds a cycle and fails (#113)",
    "blocking_calls": "a blocking call's own time is a wait drawn after the device's edges, split by what "
                      "the device did meanwhile; a sync edge weighs the call's return after the work it "
                      "waited for; copies and submissions that return after their row ran go through it; "
                      "without cuda_sync rows a blocking call waits for the row that ended last within it",
}


class PathEdge(NamedTuple):
    kind: str  # edge type
    weight_us: float
    src: int  # event rows (of the event table)
    dst: int
    src_start: bool
    dst_start: bool
    event: int  # the row the edge is attributed to, -1 for none
    bound: str  # BOUND_KINDS, "" for a weightless dependency
    #: a blocking call's wait, split by what the device did meanwhile: (bound, µs) adding up to the weight
    parts: tuple[tuple[str, float], ...] = ()
    src_us: float = 0.0  # the two nodes' times (HTA's rounded µs)
    dst_us: float = 0.0


@dataclass(frozen=True)
class Segment:
    """Path time of one event (or one kind of gap), for the top-segments table."""

    name: str
    stream: int  # -1 on the CPU
    bound: str
    why: str
    us: float  # over the steps analysed
    count: int
    share: float = 0.0  # of the path
    per_step_us: float = 0.0


#: Edge types as small codes in the edge columns (the index into this tuple).
KINDS = (OPERATOR, DEPENDENCY, LAUNCH, KERNEL_GAP, SYNC, WAIT)
CODE = {kind: code for code, kind in enumerate(KINDS)}
#: What bounds a path edge, as codes in the bound column (the index into this tuple; "": nothing).
BOUNDS = ("", CPU, DATA_LOADING, LAUNCH_OVERHEAD, GAP, GPU_COMPUTE, GPU_MEMORY, COMM, SYNC_WAIT)
BOUND_CODE = {name: code for code, name in enumerate(BOUNDS)}


class PathColumns(NamedTuple):
    """A path's edges as columns (the summary's passes read these, not the rows)."""

    kind: IntArray  # codes of :data:`KINDS`
    weight: npt.NDArray[np.float64]
    src: IntArray  # event rows
    dst: IntArray
    event: IntArray  # the attributed row; -1 none; :data:`BETWEEN_OPS`
    bound: IntArray  # codes of :data:`BOUNDS`
    src_us: npt.NDArray[np.float64]
    dst_us: npt.NDArray[np.float64]
    parts: dict[int, tuple[tuple[str, float], ...]]  # a blocking call's wait, split: by edge, where any

    @staticmethod
    def of(edges: Sequence[PathEdge]) -> PathColumns:
        """The columns of path rows (for a path built without them)."""
        def column(i: int, dtype: Any) -> Any:
            return np.array([edge[i] for edge in edges], dtype=dtype)
        return PathColumns(np.array([CODE[edge.kind] for edge in edges], dtype=np.int64), column(1, np.float64),
                           column(2, np.int64), column(3, np.int64), column(6, np.int64),
                           np.array([BOUND_CODE[edge.bound] for edge in edges], dtype=np.int64), column(9, np.float64),
                           column(10, np.float64), {i: edge.parts for i, edge in enumerate(edges) if edge.parts})

    @staticmethod
    def join(parts: list[PathColumns]) -> PathColumns:
        if not parts:
            return PathColumns.of(())

        def joined(i: int) -> Any:
            return np.concatenate([p[i] for p in parts])
        waits: dict[int, tuple[tuple[str, float], ...]] = {}
        offset = 0
        for p in parts:
            waits.update((offset + i, split) for i, split in p.parts.items())
            offset += len(p.kind)
        return PathColumns(joined(0), joined(1), joined(2), joined(3), joined(4), joined(5), joined(6), joined(7), waits)


class PathEdges(LazyRows[PathEdge]):
    """A path's edges as :class:`PathColumns` and each node's start flag, made into
    :class:`PathEdge` rows on first read: a long step's path holds ~95,000 (MTIA's: ~50 ms of
    rows, which the summary, reading the columns, never needs)."""

    __slots__ = ()

    def __init__(self, columns: PathColumns, starts: np.ndarray) -> None:
        super().__init__(len(columns.kind), columns, starts)

    def make(self, columns: PathColumns, starts: np.ndarray) -> tuple[PathEdge, ...]:
        c = columns
        parts: list[tuple[tuple[str, float], ...]] = [()] * len(c.kind)
        for i, split in c.parts.items():
            parts[i] = split
        flags = starts.tolist()
        return tuple(map(partial(tuple.__new__, PathEdge),
                         zip(np.asarray(KINDS, dtype=object)[c.kind].tolist(), c.weight.tolist(), c.src.tolist(),
                             c.dst.tolist(), flags[:-1], flags[1:], c.event.tolist(),
                             np.asarray(BOUNDS, dtype=object)[c.bound].tolist(), parts, c.src_us.tolist(),
                             c.dst_us.tolist())))


@dataclass(frozen=True)
class CriticalPath:
    """The longest path through one step's dependency graph (or the whole trace's): its edges, length and what
    bounds it."""

    rank: int
    label: str  # "ProfilerStep#12", an annotation instance, or "whole trace"
    start_us: float
    end_us: float
    nodes: int
    edges: int
    edge_types: dict[str, int]
    length_us: float
    path: Sequence[PathEdge]  # a tuple, or PathEdges: rows made on first read
    bound_us: dict[str, float]
    syncs: tuple[str, ...]  # what the path waited on, e.g. "cudaStreamSynchronize waited for stream 7"
    mode: str  # "stepscope" or "hta"
    notes: tuple[str, ...] = ()
    ok: bool = True
    #: every edge (type, weight, source row, source is a start, destination row, ...), when asked for
    graph: tuple[tuple[str, float, int, bool, int, bool], ...] = ()
    #: the path's edges as columns (what the summary reads)
    columns: PathColumns | None = field(default=None, compare=False, repr=False)

    def path_columns(self) -> PathColumns:
        return self.columns if self.columns is not None else PathColumns.of(self.path)

    @property
    def span_us(self) -> float:
        return self.end_us - self.start_us

    def share(self, kind: str) -> float:
        return self.bound_us.get(kind, 0.0) / self.length_us if self.length_us > 0 else 0.0

    def hta_summary(self) -> dict[str, float]:
        """HTA's ``summary()`` (percent of path per bound type)."""
        out: dict[str, float] = defaultdict(float)
        for kind, us in self.bound_us.items():
            out[HTA_BOUND[kind]] += us
        return {k: 100.0 * v / self.length_us for k, v in out.items()} if self.length_us > 0 else {}
