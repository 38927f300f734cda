"""The previous implementation of ``stepscope.analysis.trace.critical_path`` (one module, before it
became a package of numpy passes), kept only as the baseline that ``bench_critical_path.py --before``
times the package against, output for output. Its cache on the event table has its own key.

The critical path of a traced step: which chain of CPU work, launches, kernels, synchronisations,
data loading and collectives, shortened, would shorten the step.

Contract: :func:`critical_path` builds, for one window of one rank (a ``ProfilerStep``, an
annotation's instance, or the whole trace), the dependency graph of Holistic Trace Analysis'
lightweight critical-path analysis (``hta/analyzers/critical_path_analysis.py``, 0.6.x) from the
rows HTA sees (:class:`~stepscope.traces.links.HtaRows`: HTA's filtering and rounded times), takes
its longest path and says what bounds it. In ``hta`` mode the graph is HTA's, edge for edge
(tested on HTA's own critical-path traces); the default mode differs where HTA's answer misleads a
user, each difference named in :data:`DIFFERENCES`.

The graph. Every CPU operator / CUDA runtime call (and data-loading range) in the window and every
GPU row launched from it has a start and an end node; times are HTA's (µs, rounded inward). Edges:

- per CPU thread, the nesting walk: parent start → first child start, child end → next sibling
  start, last child end → parent end (``operator``; between two top-level operators a
  ``dependency`` of weight 0 in HTA), op start → op end for a leaf; in HTA a blocking runtime call
  (``cudaStreamSynchronize``, ``cudaMemcpy``…) weighs 0: its time is the GPU's, reached through
  its sync edge (the default mode draws it last, as a ``wait``: see :data:`DIFFERENCES`). The
  backward thread is walked as part of the forward thread (HTA's remap) when exactly one thread
  has ``forward`` and one ``autograd`` operators;
- the CUDA runtime lock (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cudaHostAlloc`` across
  threads): each call's end waits for the calls that started before it (``dependency``);
- per kernel: kernel start → end (``operator``); then, when the stream was empty at the launch
  and the previous kernel ended before the launch, launch start → kernel start (``launch``);
  otherwise, previous kernel end on the stream → kernel start when under 1.5 ms
  (``kernel_gap``); a ``cudaStreamWaitEvent`` makes the next kernel on the waiting stream wait
  for the kernel before the matching ``cudaEventRecord`` (``sync``);
- ``Stream Sync`` / ``Context Sync`` / ``Event Sync``: the last kernel on the stream (all streams;
  the recorded event's kernel) → the end of the CPU call that waited (``sync``, weight 0 in HTA;
  the default mode weighs the call's return after that work).

The longest path is the classic dynamic programme over a topological order (linear in nodes and
edges; HTA calls networkx). Ties are broken as networkx does (first edge added, earliest end), so
the path is HTA's, not only its length. Each weighted edge is *attributed* to an event (HTA's
rule: the event it lies in; a gap between two children to their parent) and classified:
``cpu``, ``data_loading``, ``launch_overhead``, ``kernel_gap``, ``gpu_compute``, ``gpu_memory``,
``communication``, and (default mode) ``sync_wait``: a blocking call's time while the device ran
nothing the trace shows (HTA's ``gpu_compute_bound`` is ``gpu_compute`` + ``gpu_memory`` here).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from stepscope.traces import intervals
from stepscope.traces.events import EventTable, narrowed
from stepscope.traces.links import COMMUNICATION, COMPUTATION, MEMORY, is_dataloader, last_match, links_of, symbol_mask
from stepscope.traces.links import ANNOTATION as ANNOTATION_ROLE
from stepscope.traces.links import OPERATOR as OPERATOR_ROLE
from stepscope.traces.links import RUNTIME as RUNTIME_ROLE
from stepscope.traces.timeline import timeline_of

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
_NODE_CATS = ("cpu_op", "cuda_runtime", "cuda_driver")

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


@dataclass(frozen=True)
class CriticalPath:
    rank: int
    label: str  # "ProfilerStep#12", an annotation instance, or "whole trace"
    start_us: float
    end_us: float
    nodes: int
    edges: int
    edge_types: dict[str, int]
    length_us: float
    path: tuple[PathEdge, ...]
    bound_us: dict[str, float]
    syncs: tuple[str, ...]  # what the path waited on, e.g. "cudaStreamSynchronize waited for stream 7"
    mode: str  # "stepscope" or "hta"
    notes: tuple[str, ...] = ()
    ok: bool = True
    #: every edge (type, weight, source row, source is a start, destination row, ...), when asked for
    graph: tuple[tuple[str, float, int, bool, int, bool], ...] = ()

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


@dataclass
class _Graph:
    """Nodes are (event position, is_start); edges in insertion order, one per node pair."""

    node_ts: list[float] = field(default_factory=list)
    node_pos: list[int] = field(default_factory=list)
    node_start: list[bool] = field(default_factory=list)
    edges: dict[tuple[int, int], tuple[str, float, int]] = field(default_factory=dict)  # -> (type, weight, attributed pos)
    node_begin: list[float] = field(default_factory=list)  # the start of each node's event

    def add(self, u: int, v: int, kind: str, zero: bool = False, event: int = -2, timed: bool = False) -> None:
        """``timed``: a sync edge weighs the time from the device work's end to the call's return when
        the call was waiting for it (the work ended after the call began), else nothing."""
        if timed:
            waited = self.node_ts[u] >= self.node_begin[v]
            weight = max(self.node_ts[v] - self.node_ts[u], 0.0) if waited else 0.0
        else:
            weight = 0.0 if zero or kind in (DEPENDENCY, SYNC) else self.node_ts[v] - self.node_ts[u]
        # networkx keeps one edge per pair: the last one added, in the place of the first
        self.edges[(u, v)] = (kind, weight, event)


class _Rows:
    """The window's columns over HTA's kept rows (positions index the kept rows)."""

    def __init__(self, events: EventTable):
        links = links_of(events)
        hta = links.hta
        self.links, self.events, self.index = links, events, hta.index
        self.ts, self.end = hta.ts, hta.end
        self.dur = self.end - self.ts
        rows = hta.index
        self.name = events.name[rows]
        self.cat = events.cat[rows]
        self.stream = events.stream[rows]
        self.corr = events.correlation[rows]
        self.pid = events.pid[rows]
        self.tid = events.tid[rows]
        self.ktype = hta.ktype
        self.role = links.role[rows]
        symbols = events.symbols
        self.n_symbols = len(symbols.strings)
        self.strings = symbols.strings
        ids = symbols.ids
        self.sym = lambda text: ids.get(text, -2)
        sync_names = [i for i in (self.sym("Event Sync"), self.sym("Context Sync")) if i >= 0]
        self.is_gpu = ((self.stream >= 0) & (self.corr >= 0)) | symbol_mask(self.name, sync_names, self.n_symbols)
        self.ic = narrowed(self._index_correlation())
        wait_pos = np.searchsorted(rows, events.wait_rows)
        ok = np.zeros(len(wait_pos), dtype=bool)
        if len(rows):
            ok = rows[np.minimum(wait_pos, len(rows) - 1)] == events.wait_rows
        self.wait_stream = dict(zip(wait_pos[ok].tolist(), events.wait_on_stream[ok].tolist()))
        self.wait_record = dict(zip(wait_pos[ok].tolist(), events.wait_on_record[ok].tolist()))

    def _index_correlation(self) -> IntArray:
        """HTA's ``index_correlation`` (positions): -1 unlinked, a CPU row -> the last GPU row with its
        correlation, a GPU row (or Event/Context Sync) -> the last CPU row with it; -2 = correlated
        but the partner is not in the trace (HTA's 0)."""
        corr = self.corr
        ic = np.where(corr == -1, -1, -2).astype(np.int64)
        linked = np.flatnonzero(corr != -1)
        cpu = linked[~self.is_gpu[linked]]
        gpu = linked[self.is_gpu[linked]]
        for side, other in ((cpu, gpu), (gpu, cpu)):
            partner = last_match(corr[other], other, corr[side])
            found = partner >= 0
            ic[side[found]] = partner[found]
        return ic

    def device_during(self, start: float, end: float) -> tuple[tuple[str, float], ...]:
        """What the device did while a host call blocked in [start, end]: time computing, in
        collectives, copying (in that precedence where they overlap), and the rest (``sync_wait``:
        the device idle, or busy elsewhere than the trace shows)."""
        busy = self._device_busy()
        out = []
        left = end - start
        for kind in (GPU_COMPUTE, COMM, GPU_MEMORY):
            starts, ends = busy[kind]
            lo, hi = np.searchsorted(ends, start, side="right"), np.searchsorted(starts, end, side="left")
            us = float(np.sum(np.minimum(ends[lo:hi], end) - np.maximum(starts[lo:hi], start))) if hi > lo else 0.0
            if us > 0:
                out.append((kind, us))
                left -= us
        if left > 0:
            out.append((SYNC_WAIT, left))
        return tuple(out)

    def _device_busy(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The rank's device timeline (:func:`~stepscope.traces.timeline.timeline_of`, the busy
        unions every trace view reads) split without overlap: compute, then collectives, then the
        rest of the busy time."""
        found: dict[str, tuple[np.ndarray, np.ndarray]] | None = self.__dict__.get("_busy")
        if found is None:
            timeline = timeline_of(self.links)
            empty = (np.zeros(0), np.zeros(0))
            if timeline is None:
                found = {GPU_COMPUTE: empty, COMM: empty, GPU_MEMORY: empty}
            else:
                compute = timeline.kinds[COMPUTATION]
                comm = intervals.subtract(timeline.kinds[COMMUNICATION], compute)
                taken = intervals.merge(np.concatenate([compute[0], comm[0]]), np.concatenate([compute[1], comm[1]]))
                found = {GPU_COMPUTE: compute, COMM: comm, GPU_MEMORY: intervals.subtract(timeline.busy, taken)}
            self.__dict__["_busy"] = found
        return found

    @property
    def busy(self) -> tuple[np.ndarray, np.ndarray]:
        """The union of the device's rows (the rank's device timeline)."""
        timeline = timeline_of(self.links)
        return timeline.busy if timeline is not None else (np.zeros(0), np.zeros(0))

    def names_where(self, predicate: Callable[[str], bool]) -> npt.NDArray[np.int32]:
        """Symbol ids of the event names (only names) satisfying ``predicate``."""
        return self.links.names_where(predicate)

    def names(self, names: Iterable[str]) -> npt.NDArray[np.int32]:
        return np.array([i for i in (self.sym(n) for n in names) if i >= 0], dtype=np.int32)

    def name_in(self, names: Iterable[str], pos: IntArray | None = None) -> npt.NDArray[np.bool_]:
        values = self.name if pos is None else self.name[pos]
        return symbol_mask(values, self.names(names), self.n_symbols)

    def decode(self, pos: int) -> str:
        return self.strings[int(self.name[pos])] if pos >= 0 else ""


def _rows_of(events: EventTable) -> _Rows:
    """The critical path's columns of ``events``, built on first use and kept with the table (every
    step and every call reads the same, with their per-trace caches)."""
    found: _Rows | None = events.__dict__.get("_critical_rows_before")
    if found is None:
        found = events.__dict__["_critical_rows_before"] = _Rows(events)
    return found


def step_windows(events: EventTable) -> list[tuple[str, float, float]]:
    """The ``ProfilerStep`` windows HTA would analyse, in order: the linked table's step rows that
    HTA keeps (with two steps or more it drops the last one's), with HTA's rounded times."""
    rows = _rows_of(events)
    steps = rows.links.step_rows
    pos = np.minimum(np.searchsorted(rows.index, steps), max(len(rows.index) - 1, 0))
    pos = pos[rows.index[pos] == steps] if len(rows.index) else pos[:0]
    return [(rows.decode(int(p)), float(rows.ts[p]), float(rows.end[p])) for p in pos.tolist()]


def critical_path(events: EventTable, rank: int = 0, annotation: str = "ProfilerStep", instance: int | None = 0,
                  hta: bool = False, data_loading: tuple[str, ...] | None = None,
                  keep_graph: bool = False) -> CriticalPath | None:
    """The critical path of one window: the ``instance``-th row whose name contains ``annotation``
    (``annotation=""``: the whole trace). None when the annotation is not in the trace or the
    window holds no event. ``hta=True`` builds HTA's graph exactly; ``data_loading`` are regular
    expressions of data-loading event names (HTA's ``data_load_events``; default mode: the
    DataLoader ranges). ``keep_graph`` keeps every edge in :attr:`CriticalPath.graph`."""
    rows = _rows_of(events)
    if not len(rows.ts):
        return None
    if annotation:
        hits = np.flatnonzero(symbol_mask(rows.name, rows.names_where(lambda s: annotation in s), rows.n_symbols))
        first, last = (0, 0) if instance is None else (instance, instance)
        chosen = hits[first:last + 1]
        if not len(chosen):
            return None
        start, end = float(rows.ts[chosen].min()), float(rows.end[chosen].max())
        label = rows.decode(int(chosen[0]))
    else:
        start, end = float(rows.ts.min()), float(rows.end.max())
        label = "whole trace"
    return _analyse(rows, rank, label, start, end, hta, data_loading, keep_graph)


def step_paths(events: EventTable, rank: int = 0, hta: bool = False) -> list[CriticalPath]:
    """The critical path of every ``ProfilerStep`` of the trace (HTA's kept rows: with two steps or
    more, HTA drops the last one's host events)."""
    rows = _rows_of(events)
    out = []
    for label, start, end in step_windows(events):
        found = _analyse(rows, rank, label, start, end, hta, None)
        if found is not None:
            out.append(found)
    return out


def _analyse(rows: _Rows, rank: int, label: str, start: float, end: float, hta: bool,
             data_loading: tuple[str, ...] | None, keep_graph: bool = False) -> CriticalPath | None:
    window = _clip(rows, start, end, hta)
    if not len(window):
        return None
    notes: list[str] = []
    graph, pos_node = _nodes(rows, window, hta, data_loading)
    cpu = window[rows.stream[window] == -1]
    blocking = set(cpu[rows.name_in(BLOCKING_CALLS, cpu)].tolist())  # HTA: their own edge weighs 0
    synchronous = _synchronous_launches(rows, window) if not hta else (cpu[:0], cpu[:0])
    # default mode: blocking calls' own edges are deferred, then drawn last as waits
    deferring = set() if hta else blocking | set(synchronous[0].tolist())
    deferred: list[tuple[int, int, int]] = []
    _runtime_lock_edges(rows, graph, deferring, deferred)
    _call_stack_edges(rows, cpu, window, graph, pos_node, hta, notes, blocking, deferring, deferred)
    _kernel_edges(rows, window, graph, pos_node, hta, notes, synchronous)
    for u, v, p in deferred:
        graph.add(u, v, WAIT, event=p)
    found = _longest_path(graph, exact=hta)
    edge_types = Counter(kind for kind, _, _ in graph.edges.values())
    if found is None:
        return CriticalPath(rank, label, start, end, len(graph.node_ts), len(graph.edges), dict(edge_types), 0.0, (),
                            {}, (), "hta" if hta else "stepscope", (*notes, "the graph has a cycle: no path"), ok=False)
    path_nodes, length = found
    touched = {node for pair in graph.edges for node in pair}  # HTA's graph holds the nodes its edges touch
    pairs = list(zip(path_nodes, path_nodes[1:]))
    edges = [graph.edges[pair] for pair in pairs]
    attributed = [_attribute(graph, kind, u, v, event, weight) for (u, v), (kind, weight, event) in zip(pairs, edges)]
    what_of = _bounds(rows, edges, attributed, _data_loading_ranges(rows, window, hta, data_loading))
    path, bound, waited = _path_edges(rows, graph, path_nodes, edges, attributed, what_of, hta)
    kept: tuple[tuple[str, float, int, bool, int, bool], ...] = ()
    if keep_graph:
        index, pos, starts = rows.index, graph.node_pos, graph.node_start
        kept = tuple((kind, weight, int(index[pos[u]]), starts[u], int(index[pos[v]]), starts[v])
                     for (u, v), (kind, weight, _) in graph.edges.items())
    return CriticalPath(rank, label, start, end, len(touched), len(graph.edges), dict(edge_types), length,
                        tuple(path), dict(bound), tuple(dict.fromkeys(waited)), "hta" if hta else "stepscope",
                        tuple(dict.fromkeys(notes)), graph=kept)


def _path_edges(rows: _Rows, graph: _Graph, path_nodes: list[int], edges: list[tuple[str, float, int]],
                attributed: list[int], what_of: list[str], hta: bool) -> tuple[list[PathEdge], dict[str, float], list[str]]:
    """The path's edges as :class:`PathEdge` rows, the path time per bound kind and what the path
    waited on. Column-wise: a path has up to ~100,000 edges."""
    bound: dict[str, float] = defaultdict(float)
    waited: list[str] = []
    if not edges:
        return [], bound, waited
    on_path = itemgetter(*path_nodes)  # the path's nodes (at least two); their own Python objects are reused
    ts, starts = on_path(graph.node_ts), on_path(graph.node_start)
    node_pos = np.asarray(on_path(graph.node_pos), dtype=np.int64)
    kinds, weight_list, _ = zip(*edges)
    index = rows.index
    src_rows, dst_rows = index[node_pos[:-1]], index[node_pos[1:]]
    events = np.asarray(attributed, dtype=np.int64)
    event_rows = np.where(events >= 0, index[np.maximum(events, 0)], events)
    parts_of: list[tuple[tuple[str, float], ...]] = [()] * len(edges)
    is_wait = [False] * len(edges)
    for i, kind in enumerate(kinds):
        if kind != WAIT and kind != SYNC:
            continue
        weight = weight_list[i]
        if kind == WAIT and weight > 0:
            is_wait[i] = True
            parts_of[i] = rows.device_during(ts[i], ts[i + 1])
        if kind == SYNC or (kind == WAIT and weight >= WAIT_WORTH_NAMING_US):
            waited.append(_sync_text(rows, kind, int(node_pos[i]), int(node_pos[i + 1])))
    for what, weight, wait, parts in zip(what_of, weight_list, is_wait, parts_of):  # in path order
        if wait:
            for part, part_us in parts:
                bound[part] += part_us
        elif what:
            bound[what] += weight if hta else max(weight, 0.0)  # HTA sums the edge's own (maybe negative) weight
    make = partial(tuple.__new__, PathEdge)
    path: list[PathEdge] = []
    for lo in range(0, len(edges), _CHUNK):  # in chunks: the columns as Python lists stay small
        hi = lo + _CHUNK
        path += map(make, zip(kinds[lo:hi], weight_list[lo:hi], src_rows[lo:hi].tolist(), dst_rows[lo:hi].tolist(),
                              starts[lo:hi], starts[lo + 1:hi + 1], event_rows[lo:hi].tolist(), what_of[lo:hi],
                              parts_of[lo:hi], ts[lo:hi], ts[lo + 1:hi + 1]))
    return path, bound, waited


#: Edges turned into Python rows at a time.
_CHUNK = 8192


def _clip(rows: _Rows, start: float, end: float, hta: bool = True) -> IntArray:
    """HTA's window: CPU rows starting in it with a duration; GPU rows whose launch did; and every
    ``Stream Wait Event`` row. HTA finds a GPU row from its launch's link, which names one row:
    in the default mode every GPU row whose own link names a launch in the window is kept (a
    CUDA graph's replay launches many)."""
    cpu = rows.stream == -1
    in_window = (rows.ts >= start) & (rows.ts <= end) & (rows.dur > 0)
    keep = cpu & in_window
    gpu = np.flatnonzero(~cpu)
    # the host rows whose index_correlation points at a GPU row (HTA joins the GPU row to them)
    launchers = np.flatnonzero(cpu & (rows.ic >= 0))
    targets = rows.ic[launchers]
    hit = np.zeros(len(rows.ts), dtype=bool)
    good = in_window[launchers]
    hit[targets[good]] = True
    keep[gpu[hit[gpu]]] = True
    if not hta:
        linked = gpu[rows.ic[gpu] >= 0]
        launcher = rows.ic[linked]
        keep[linked[(rows.stream[launcher] == -1) & in_window[launcher]]] = True
    keep[gpu[rows.name_in(("Stream Wait Event",), gpu)]] = True
    return np.flatnonzero(keep)


def _nodes(rows: _Rows, window: IntArray, hta: bool, data_loading: tuple[str, ...] | None) -> tuple[_Graph, dict[int, int]]:
    cats = rows.names(_NODE_CATS)
    mask = symbol_mask(rows.cat[window], cats, rows.n_symbols)
    if not hta:  # also the 2021 spelling (cat "Operator" / "Runtime"), which HTA does not read
        role = rows.role[window]
        mask |= ((role == OPERATOR_ROLE) | (role == RUNTIME_ROLE)) & (rows.stream[window] == -1)
    mask |= (rows.stream[window] != -1) & (rows.ic[window] != -1)
    dl = _data_loading_names(rows, hta, data_loading)
    if len(dl):
        mask |= symbol_mask(rows.name[window], dl, rows.n_symbols)
    pos = window[mask]
    ts = np.concatenate([rows.ts[pos], rows.end[pos]])
    who = np.concatenate([pos, pos])
    is_start = np.concatenate([np.ones(len(pos), dtype=bool), np.zeros(len(pos), dtype=bool)])
    if hta:
        order = np.lexsort((~is_start, who, ts))  # HTA's: (ts, event), a start before its own end
    else:
        # at one time: zero-length events' starts, then ends (the later-started first: a child's
        # before its parent's), then starts (the longer first): every edge then goes forward
        # (the device's ends before the host's: a sync returns after the work it waited for; at
        # one span, the inner event of the walk — the later row — first)
        begin, finish = np.concatenate([rows.ts[pos]] * 2), np.concatenate([rows.end[pos]] * 2)
        flag = np.where(is_start, np.where(finish == begin, 0, 3), np.where(rows.stream[who] >= 0, 1, 2))
        order = np.lexsort((np.where(is_start, who, -who), np.where(is_start, -finish, -begin), flag, ts))
    graph = _Graph(ts[order].tolist(), who[order].tolist(), is_start[order].tolist(),
                   node_begin=rows.ts[who[order]].tolist())
    pos_node: dict[int, int] = {}
    for node, (p, s) in enumerate(zip(graph.node_pos, graph.node_start)):
        pos_node[p * 2 + (0 if s else 1)] = node
    return graph, pos_node


def _data_loading_names(rows: _Rows, hta: bool, patterns: tuple[str, ...] | None) -> npt.NDArray[np.int32]:
    if patterns is not None:
        compiled = [re.compile(p) for p in patterns]
        return rows.names_where(lambda s: any(c.search(s) for c in compiled))
    if hta:
        return np.zeros(0, dtype=np.int32)
    return rows.names_where(is_dataloader)


def _runtime_lock_edges(rows: _Rows, graph: _Graph, blocking: set[int], deferred: list[tuple[int, int, int]]) -> None:
    """HTA's runtime-lock pass (default mode: a ``blocking`` call's own edge is ``deferred``)."""
    lock = rows.names(RUNTIME_LOCK_CALLS)
    if not len(lock):
        return
    names = rows.name[np.array(graph.node_pos, dtype=np.int64)] if graph.node_pos else np.zeros(0, dtype=np.int32)
    is_lock = symbol_mask(names, lock, rows.n_symbols)
    open_starts: list[int] = []
    last = -1
    for node in np.flatnonzero(is_lock).tolist():
        if graph.node_start[node]:
            open_starts.append(node)
        else:
            me = graph.node_pos[node]
            while open_starts:
                previous = open_starts.pop()
                if graph.node_pos[previous] == me:
                    if me in blocking:
                        deferred.append((previous, node, me))
                    else:
                        graph.add(previous, node, OPERATOR, event=me)
                else:
                    graph.add(previous, node, DEPENDENCY)
            if last >= 0 and not graph.node_start[last]:
                graph.add(last, node, DEPENDENCY)
        last = node


def _thread_of(rows: _Rows, cpu: IntArray, window: IntArray, hta: bool) -> IntArray:
    """Thread key per CPU row, the backward thread folded into the forward thread (HTA's remap)."""
    pid, tid = rows.pid[cpu].astype(np.int64), rows.tid[cpu].astype(np.int64)
    key = pid * (rows.n_symbols + 1) + tid
    cats = rows.names(("cpu_op", "user_annotation"))
    typed = symbol_mask(rows.cat, cats, rows.n_symbols)  # (over all rows: cheap, and indexed by window below)
    if not hta:  # the 2021 spelling too
        typed |= (rows.role == OPERATOR_ROLE) | (rows.role == ANNOTATION_ROLE)

    def only_thread(word: str) -> int | None:
        ids = rows.names_where(lambda s: word in s)
        hits = window[symbol_mask(rows.name[window], ids, rows.n_symbols) & typed[window]]
        tids = set(rows.tid[hits].tolist())
        return tids.pop() if len(tids) == 1 else None

    forward, backward = only_thread("forward"), only_thread("autograd")
    if forward is not None and backward is not None and forward != backward:
        tid = np.where(tid == backward, forward, tid)
        key = pid * (rows.n_symbols + 1) + tid
    return key


def _call_stack_edges(rows: _Rows, cpu: IntArray, window: IntArray, graph: _Graph, pos_node: dict[int, int],
                      hta: bool, notes: list[str], blocking: set[int], deferring: set[int],
                      deferred: list[tuple[int, int, int]]) -> None:
    """Every CPU thread's nesting walk (``cpu``: the window's host rows); then, default mode, the
    hand-offs between threads."""
    if not len(cpu):
        return
    thread = _thread_of(rows, cpu, window, hta)
    is_lock = set(cpu[rows.name_in(RUNTIME_LOCK_CALLS, cpu)].tolist())
    ts_all, end_all = rows.ts, rows.end
    tops: dict[int, list[tuple[int, int]]] = {}
    gaps: dict[int, list[tuple[int, int]]] = {}
    for key in np.unique(thread).tolist():
        members = cpu[thread == key]
        # HTA's order: by start; at one start the longer first; then file order
        order = np.lexsort((members, -(end_all[members] - ts_all[members]), ts_all[members]))
        members = members[order]
        tops[key], gaps[key] = [], []
        _walk(graph, pos_node, members.tolist(), ts_all[members].tolist(), end_all[members].tolist(), is_lock,
              blocking, hta, notes, tops[key], gaps[key], deferring, deferred)
    if not hta:
        _hand_offs(rows, graph, tops, gaps)


def _hand_offs(rows: _Rows, graph: _Graph, tops: dict[int, list[tuple[int, int]]],
               gaps: dict[int, list[tuple[int, int]]]) -> None:
    """A thread's gap between two top-level operators during which other threads of its process ran
    operators (the main thread inside ``loss.backward()`` while the autograd thread works) is not
    that thread's Python: the path may go through the other threads' operators instead (edges to
    the first one starting in the gap and from the last one ending in it), and the gap itself
    weighs only the time no other thread ran an operator."""
    if len(tops) < 2:
        return
    node_ts, node_pos = graph.node_ts, graph.node_pos
    everyone = [(node_ts[a], node_ts[b], a, b, key) for key, items in tops.items() for a, b in items]
    everyone.sort()
    starts = np.array([item[0] for item in everyone])
    ends = np.array([item[1] for item in everyone])
    pids = np.array([rows.pid[node_pos[item[2]]] for item in everyone])
    keys = np.array([item[4] for item in everyone])
    for key, items in gaps.items():
        if not items:
            continue
        # the gaps in which another thread of the process starts a top-level operator, found at once
        # (most gaps have none): the other threads' operators counted by prefix sums
        t0s = np.array([node_ts[u] for u, _ in items])
        t1s = np.array([node_ts[v] for _, v in items])
        pid = rows.pid[node_pos[items[0][0]]]
        others = np.concatenate(([0], np.cumsum((keys != key) & (pids == pid))))
        lo_all, hi_all = np.searchsorted(starts, t0s, side="left"), np.searchsorted(starts, t1s, side="right")
        candidates = np.flatnonzero((t1s > t0s) & (others[hi_all] > others[lo_all]))
        for i in candidates.tolist():
            (u, v), t1, lo, hi = items[i], float(t1s[i]), int(lo_all[i]), int(hi_all[i])
            inside = np.arange(lo, hi)
            inside = inside[(keys[inside] != key) & (pids[inside] == pid) & (ends[inside] <= t1)]
            if not len(inside):
                continue
            busy = intervals.total(*intervals.merge(starts[inside], ends[inside]))
            kind, weight, event = graph.edges[(u, v)]
            graph.edges[(u, v)] = (kind, max(weight - busy, 0.0), event)
            first = everyone[int(inside[np.argmin(starts[inside])])][2]
            last = everyone[int(inside[np.argmax(ends[inside])])][3]
            graph.add(u, first, OPERATOR, event=BETWEEN_OPS)
            graph.add(last, v, OPERATOR, event=BETWEEN_OPS)


def _walk(graph: _Graph, pos_node: dict[int, int], members: list[int], starts: list[float], ends: list[float],
          is_lock: set[int], blocking: set[int], hta: bool, notes: list[str], tops: list[tuple[int, int]],
          gaps: list[tuple[int, int]], deferring: set[int], deferred: list[tuple[int, int, int]]) -> None:
    """One thread's nesting walk (HTA's depth-first enter/exit over its call stack)."""
    stack: list[tuple[int, float]] = []  # (position, effective end)
    last_node = -1
    last_parent = -1
    depth = 0  # open events that have nodes

    def shares_lock(a: int, b: int) -> bool:
        return (graph.node_pos[a] in is_lock and graph.node_pos[b] in is_lock
                and (graph.node_start[a] or not graph.node_start[b]))

    def leave(p: int, parent: int) -> None:
        nonlocal last_node, last_parent, depth
        end_node = pos_node.get(p * 2 + 1)
        if end_node is None:
            return
        if last_node >= 0 and not shares_lock(last_node, end_node):
            if p in deferring and last_node == pos_node.get(p * 2):
                deferred.append((last_node, end_node, p))  # a leaf blocking call: drawn last, as a wait
            else:
                graph.add(last_node, end_node, OPERATOR, zero=p in blocking,
                          event=_case_event(graph, last_node, end_node, last_parent))
        last_node, last_parent = end_node, parent
        depth -= 1

    for p, ts, end in zip(members, starts, ends):
        while stack and stack[-1][1] <= ts:  # at one time an end comes before a start
            done, _ = stack.pop()
            leave(done, stack[-1][0] if stack else -1)
        parent = stack[-1][0] if stack else -1
        if stack and end > stack[-1][1]:
            notes.append("a CPU event outlives its parent (an out-of-order stack): it is cut at the parent's end")
            end = stack[-1][1]
            end_node = pos_node.get(p * 2 + 1)
            if end_node is not None and not hta:
                graph.node_ts[end_node] = end
        start_node = pos_node.get(p * 2)
        if start_node is not None:
            if last_node >= 0 and not shares_lock(last_node, start_node):
                top_level = depth == 0
                kind = DEPENDENCY if top_level else OPERATOR
                if top_level and not hta:
                    graph.add(last_node, start_node, OPERATOR, event=BETWEEN_OPS)  # see DIFFERENCES
                    gaps.append((last_node, start_node))
                else:
                    graph.add(last_node, start_node, kind, event=_case_event(graph, last_node, start_node, last_parent))
            if depth == 0:
                end_node = pos_node.get(p * 2 + 1)
                if end_node is not None:
                    tops.append((start_node, end_node))
            last_node, last_parent = start_node, parent
            depth += 1
        stack.append((p, end))
    while stack:
        done, _ = stack.pop()
        leave(done, stack[-1][0] if stack else -1)


def _case_event(graph: _Graph, u: int, v: int, parent: int) -> int:
    """HTA's attribution of an operator edge: a start -> the source's event; end -> end: the
    destination's; end -> start: the source's parent."""
    if graph.node_start[u]:
        return graph.node_pos[u]
    if not graph.node_start[v]:
        return graph.node_pos[v]
    return parent


def _attribute(graph: _Graph, kind: str, u: int, v: int, event: int, weight: float = 0.0) -> int:
    if kind == KERNEL_GAP:
        return graph.node_pos[u]
    if kind == WAIT:
        return event
    if kind == SYNC:  # a timed sync: the waiting call's return
        return graph.node_pos[v] if weight > 0 else -1
    if kind != OPERATOR:
        return -1
    return event if event >= 0 or event == BETWEEN_OPS else graph.node_pos[u]


#: An absent queue length in :func:`_queue_lengths`' arrays.
NO_LENGTH = np.iinfo(np.int32).min


def _queue_lengths(rows: _Rows, launch_calls: frozenset[str]) -> tuple[np.ndarray, np.ndarray, dict[int, int],
                                                                       dict[int, int]]:
    """HTA's queue length per stream, over the whole trace: +1 at a launch for each GPU row it
    launched, -1 at each GPU row's start. Returns two int32 columns over the rows: the length
    after each launch (at launch positions) and after each GPU row's start (at its position), both
    :data:`NO_LENGTH` elsewhere; each launched row's place among the rows of its launch where it
    is not 0 (a CUDA graph's replay launches many), and the launches of more than one GPU row
    with their counts (by the rows' index_correlation). Columns and sparse dicts, not a dict per
    row: a trace of 4.8 M events holds 1.2 M launches and launched rows, ~140 MB as Python dicts."""
    n = len(rows.ts)
    after_launch = np.full(n, NO_LENGTH, dtype=np.int32)
    after_start = np.full(n, NO_LENGTH, dtype=np.int32)
    launch = np.flatnonzero(rows.name_in(launch_calls))
    gpu = np.flatnonzero(rows.stream != -1)
    if not len(launch) or not len(gpu):
        return after_launch, after_start, {}, {}
    launcher = last_match(rows.corr[launch], launch, rows.corr[gpu])
    ok = launcher >= 0
    launched, by = gpu[ok], launcher[ok]
    del gpu, launcher, ok
    count = len(by)
    pos = np.concatenate([by, launched])
    stream = rows.stream[launched]
    stream = np.concatenate([stream, stream])
    # at one microsecond, launches first. HTA's unstable sort leaves such ties to chance: on the
    # reference traces 12 of ~78,000 edges differ that way (a launch delay for a kernel gap), never
    # on the path (docs/critical-path.md)
    order = np.lexsort((np.arange(len(pos)), rows.ts[pos], stream))
    stream = stream[order]
    launches = order < count  # the first half of ``pos`` are the launches
    at = pos[order]
    del pos, order
    # the running length per stream: one cumulative sum, less the sum before each stream's first row
    lengths = np.cumsum(np.where(launches, np.int32(1), np.int32(-1)), dtype=np.int64)
    firsts = np.flatnonzero(stream[1:] != stream[:-1]) + 1
    before = np.zeros(len(firsts) + 1, dtype=np.int64)
    before[1:] = lengths[firsts - 1]
    group = np.zeros(len(stream), dtype=np.int32)
    group[firsts] = 1
    lengths -= before[np.cumsum(group, dtype=np.int32)]
    del stream, group
    for column, side in ((after_launch, launches), (after_start, ~launches)):
        where, value = at[side], lengths[side]
        # a launch of many rows is met once per row: its length is the one met last
        last = len(where) - 1 - np.unique(where[::-1], return_index=True)[1]
        column[where[last]] = value[last]
    del at, lengths, launches
    # each launched row's place among its launch's rows, in (start, position) order
    by_time = np.lexsort((launched, rows.ts[launched]))
    ordered_by = by[by_time]
    grouped = np.argsort(ordered_by, kind="stable")
    keys = ordered_by[grouped]
    places = np.arange(len(keys)) - np.searchsorted(keys, keys, side="left")
    later = places > 0
    place = dict(zip(launched[by_time[grouped[later]]].tolist(), places[later].tolist()))
    # the launches of several rows, by the launched rows' index_correlation
    targets = rows.ic[launched]
    ids, counts = np.unique(targets[targets >= 0], return_counts=True)
    several = counts > 1
    return after_launch, after_start, place, dict(zip(ids[several].tolist(), counts[several].tolist()))


def _on_keys(columns: tuple[np.ndarray, ...], keys: set[tuple[int, ...]]) -> np.ndarray:
    """Per row, whether its values in ``columns`` form one of ``keys`` (a handful: streams,
    threads), without a Python tuple per row; every row when there are more than 32 keys (one
    pass over the rows per key)."""
    if len(keys) > 32:
        return np.ones(len(columns[0]), dtype=bool)
    out = np.zeros(len(columns[0]), dtype=bool)
    for key in keys:
        match = np.ones(len(columns[0]), dtype=bool)
        for column, value in zip(columns, key):
            match &= column == value
        out |= match
    return out


def _launch_before(rows: _Rows, calls: IntArray, stream_of: dict[int, tuple[int, int]],
                   launch_calls: frozenset[str]) -> dict[int, int]:
    """For each cudaEventRecord position: the GPU row launched last on its (device, stream) before it."""
    if not stream_of:  # no recorded event has a known stream: nothing to find
        return {}
    launch = np.flatnonzero(rows.name_in(launch_calls) & (rows.ic >= 0))
    if not len(launch):
        return {}
    target = rows.ic[launch]
    # only the launches onto a stream some record was made on can precede a record
    on_record_stream = _on_keys((rows.pid[target], rows.stream[target]), set(stream_of.values()))
    launch, target = launch[on_record_stream], target[on_record_stream]
    key_of_launch = list(zip(rows.pid[target].tolist(), rows.stream[target].tolist()))
    out: dict[int, int] = {}
    by_key: dict[tuple[int, int], list[tuple[float, int, int]]] = defaultdict(list)
    for p, k, t in zip(launch.tolist(), key_of_launch, target.tolist()):
        by_key[k].append((float(rows.ts[p]), 0, t))
    for p in calls.tolist():
        where = stream_of.get(p)
        if where is not None:
            by_key[where].append((float(rows.ts[p]), 1, p))
    for items in by_key.values():
        items.sort(key=lambda item: item[0])
        previous = -1
        for _, is_record, value in items:
            if is_record:
                if previous >= 0:
                    out[value] = previous
            else:
                previous = value
    return out


@dataclass(frozen=True)
class _Launches:
    """The whole trace's launch bookkeeping, computed once per trace and mode (every step reads it)."""

    after_launch: np.ndarray  # int32 over the rows (:func:`_queue_lengths`)
    after_start: np.ndarray
    place: dict[int, int]  # a launched row's place among its launch's rows, where not 0
    launched_by: dict[int, int]  # launches of more than one GPU row (by index_correlation): their count
    corr_to_record: dict[int, int]
    previous: dict[int, int]  # cudaEventRecord -> the GPU row launched last before it on its stream
    waits_next: dict[int, int]  # cudaStreamWaitEvent -> the GPU row of the next launch on its stream


def _launches(rows: _Rows, hta: bool) -> _Launches:
    cache: dict[bool, _Launches] = rows.__dict__.setdefault("_launches", {})
    found = cache.get(hta)
    if found is not None:
        return found
    launch_calls = LAUNCH_CALLS if hta else LAUNCH_CALLS | GRAPH_LAUNCH_CALLS
    after_launch, after_start, place, launched_by = _queue_lengths(rows, launch_calls)  # launched_by: default mode only
    records = np.flatnonzero(rows.name == rows.sym("cudaEventRecord"))
    # each recorded CUDA event: the stream and device it was recorded on (from the waits that name it)
    record_stream: dict[int, tuple[int, int]] = {}
    corr_to_record = dict(zip(rows.corr[records].tolist(), records.tolist()))
    for p, stream in rows.wait_stream.items():
        record = corr_to_record.get(rows.wait_record.get(p, -1))
        if record is not None and stream > -1:
            record_stream.setdefault(record, (int(rows.pid[p]), stream))
    previous = _launch_before(rows, records, record_stream, launch_calls)
    waits_next = _next_launch_after_waits(rows, launch_calls) if rows.sym("Stream Wait Event") >= 0 else {}
    found = cache[hta] = _Launches(after_launch, after_start, place, launched_by, corr_to_record, previous, waits_next)
    return found


def _kernel_edges(rows: _Rows, window: IntArray, graph: _Graph, pos_node: dict[int, int], hta: bool,
                  notes: list[str], synchronous: tuple[IntArray, IntArray]) -> None:
    launches = _launches(rows, hta)
    after_launch, after_start, place, launched_by = (launches.after_launch, launches.after_start, launches.place,
                                                     launches.launched_by)
    corr_to_record, previous_launch, waits_next = launches.corr_to_record, launches.previous, launches.waits_next
    sync_cat = rows.sym("cuda_sync")
    names = {n: rows.sym(n) for n in ("Context Sync", "Stream Sync", "Event Sync", "Stream Wait Event")}
    in_window = window[((rows.stream[window] != -1) | np.isin(rows.name[window], [names["Event Sync"], names["Context Sync"]]))
                       & (rows.ic[window] != -1)]
    is_sync = rows.cat[in_window] == sync_cat
    sort_by = np.where(is_sync, rows.end[in_window], rows.ts[in_window])
    ordered = in_window[np.lexsort((in_window, sort_by))]
    last: dict[int, int] = {}  # stream -> end node of its last kernel
    kernel_sync: dict[int, int] = {}  # kernel position -> position of the kernel it waits for
    ts = rows.ts
    for p in ordered.tolist():
        name = int(rows.name[p])
        if rows.cat[p] == sync_cat:
            runtime = int(rows.ic[p])
            if name in (names["Stream Wait Event"], names["Event Sync"]):
                record = corr_to_record.get(rows.wait_record.get(p, -2))
                src_launch = previous_launch.get(record, -1) if record is not None else -1
                if src_launch < 0:
                    continue
                if name == names["Stream Wait Event"]:
                    dest = waits_next.get(runtime, -1)
                    if dest >= 0:
                        kernel_sync[dest] = src_launch
                else:
                    end_node = pos_node.get(src_launch * 2 + 1)
                    target = pos_node.get(runtime * 2 + 1) if runtime >= 0 else None
                    if end_node is not None and target is not None:
                        graph.add(end_node, target, SYNC, timed=not hta)
                continue
            target = pos_node.get(runtime * 2 + 1) if runtime >= 0 else None
            if target is None:
                continue
            sources = list(last.values()) if name == names["Context Sync"] else [last.get(int(rows.stream[p]), -1)]
            for node in sources:
                if node >= 0:
                    graph.add(node, target, SYNC, timed=not hta)
            continue
        start_node, end_node = pos_node.get(p * 2), pos_node.get(p * 2 + 1)
        if start_node is None or end_node is None:
            continue
        graph.add(start_node, end_node, OPERATOR, event=p)
        stream = int(rows.stream[p])
        runtime = int(rows.ic[p])
        sync_end = -1
        waits = kernel_sync.pop(p, None)
        if waits is not None:
            found = pos_node.get(waits * 2 + 1)
            if found is not None:
                graph.add(found, start_node, SYNC)
                sync_end = found
            else:
                waits = None
        previous = last.get(stream, -1)
        runtime_ts = ts[runtime] if runtime >= 0 else np.inf
        # the stream held nothing else: one row launched, none queued behind it (a graph's replay:
        # its first row, the rest of the graph behind it)
        count = launched_by.get(runtime, 1) if not hta else 1
        if (runtime >= 0 and after_launch[runtime] == count and after_start[p] == count - 1 and p not in place
                and (previous < 0 or graph.node_ts[previous] < runtime_ts)
                and (waits is None or graph.node_ts[sync_end] < runtime_ts)):
            launch_start = pos_node.get(runtime * 2)
            if launch_start is not None:
                graph.add(launch_start, start_node, LAUNCH)
        elif (previous >= 0 and graph.node_ts[start_node] - graph.node_ts[previous] < KERNEL_GAP_LIMIT_US
              and (waits is None or graph.node_ts[sync_end] < graph.node_ts[previous])):
            graph.add(previous, start_node, KERNEL_GAP, event=graph.node_pos[previous])
        last[stream] = end_node
    if not hta and sync_cat < 0:
        _inferred_syncs(rows, window, graph, pos_node, notes)
    if not hta:
        calls, launched = synchronous
        for call, row in zip(calls.tolist(), launched.tolist()):
            source, target = pos_node.get(row * 2 + 1), pos_node.get(call * 2 + 1)
            if source is not None and target is not None:
                graph.add(source, target, SYNC, timed=True)
            begin, first = pos_node.get(call * 2), pos_node.get(row * 2)
            if begin is not None and first is not None and (begin, first) not in graph.edges:
                graph.add(begin, first, WAIT, event=call)  # the call waited for its work to start
        if len(calls):
            notes.append("some launch calls returned only after their work ran (a synchronous submission or "
                         "copy): the path goes through the device's work, not the call")


def _synchronous_launches(rows: _Rows, window: IntArray) -> tuple[IntArray, IntArray]:
    """Copy, memset and submission calls in the window whose GPU row ran wholly inside the call (a
    blocking copy, a synchronous submission such as MTIA's ``runFunction``): the calls and their
    rows. A kernel launch is never taken as one: a slow launch of a short kernel is still async."""
    calls = window[(rows.stream[window] == -1) & rows.name_in(LAUNCH_CALLS - KERNEL_LAUNCH_CALLS, window)
                   & (rows.ic[window] >= 0)]
    launched = rows.ic[calls]
    inside = (rows.stream[launched] >= 0) & (rows.ts[launched] >= rows.ts[calls]) & (rows.end[launched] <= rows.end[calls])
    inside &= rows.end[launched] > rows.ts[launched]
    return calls[inside], launched[inside]


def _inferred_syncs(rows: _Rows, window: IntArray, graph: _Graph, pos_node: dict[int, int], notes: list[str]) -> None:
    """Without ``cuda_sync`` rows (traces before PyTorch 2.1), a blocking call (a synchronize, a
    ``cudaMemcpy``…) is taken to have waited for the GPU row that ended last within it."""
    gpu = window[(rows.stream[window] >= 0)]
    gpu = gpu[[pos_node.get(int(p) * 2 + 1) is not None for p in gpu.tolist()]] if len(gpu) else gpu
    calls = window[(rows.stream[window] == -1) & rows.name_in(BLOCKING_CALLS, window)]
    if not len(gpu) or not len(calls):
        return
    order = np.argsort(rows.end[gpu], kind="stable")
    ends, gpu = rows.end[gpu][order], gpu[order]
    last = np.searchsorted(ends, rows.end[calls], side="right") - 1
    added = 0
    for call, i in zip(calls.tolist(), last.tolist()):
        target = pos_node.get(call * 2 + 1)
        if i < 0 or target is None or ends[i] < rows.ts[call]:
            continue
        graph.add(pos_node[int(gpu[i]) * 2 + 1], target, SYNC, timed=True)
        added += 1
    if added:
        notes.append("the trace has no CUDA synchronisation events (PyTorch < 2.1): a blocking call is taken "
                     "to wait for the GPU work that ended last within it")


def _next_launch_after_waits(rows: _Rows, launch_calls: frozenset[str]) -> dict[int, int]:
    """For each cudaStreamWaitEvent call (position): the GPU row of the next launch on the same
    thread onto the waiting stream."""
    waits = np.flatnonzero((rows.name == rows.sym("cudaStreamWaitEvent")) & (rows.ic >= 0))
    launch = np.flatnonzero(rows.name_in(launch_calls) & (rows.ic >= 0))
    if not len(waits) or not len(launch):
        return {}
    wait_target = rows.ic[waits]
    wait_keys: set[tuple[int, ...]] = set(zip(rows.pid[waits].tolist(), rows.tid[waits].tolist(),
                                              rows.stream[wait_target].tolist()))
    # only the launches from a thread onto a stream some wait names can follow a wait
    launch = launch[_on_keys((rows.pid[launch], rows.tid[launch], rows.stream[rows.ic[launch]]), wait_keys)]
    by_key: dict[tuple[int, int, int], list[tuple[float, int, int]]] = defaultdict(list)
    for p in launch.tolist():
        target = int(rows.ic[p])
        by_key[(int(rows.pid[p]), int(rows.tid[p]), int(rows.stream[target]))].append((float(rows.ts[p]), 1, target))
    for p in waits.tolist():
        target = int(rows.ic[p])  # the Stream Wait Event row, on the waiting stream
        by_key[(int(rows.pid[p]), int(rows.tid[p]), int(rows.stream[target]))].append((float(rows.ts[p]), 0, p))
    out = {}
    for items in by_key.values():
        items.sort(key=lambda item: item[0])
        pending: list[int] = []
        for _, is_launch, value in items:
            if is_launch:
                for wait in pending:
                    out[wait] = value
                pending = []
            else:
                pending.append(value)
    return out


def _longest_path_forward(graph: _Graph) -> tuple[list[int], float] | None:
    """The same dynamic programme in node order, when every edge goes from a lower node to a higher
    one (nodes are sorted by time: the usual case). Same path length and the same first-added best
    predecessor; among several best ends, the earliest node (networkx's order may pick another of
    equal length). None when some edge goes backwards."""
    n = len(graph.node_ts)
    pairs = np.fromiter((x for pair in graph.edges for x in pair), dtype=np.int64, count=2 * len(graph.edges))
    us, vs = pairs[0::2], pairs[1::2]
    if len(us) and (us >= vs).any():
        return None
    weights = np.fromiter((w for _, w, _ in graph.edges.values()), dtype=np.float64, count=len(graph.edges))
    np.maximum(weights, 0.0, out=weights)
    order = np.argsort(vs, kind="stable")
    dist = [0.0] * n
    back = list(range(n))
    for u, v, w in zip(us[order].tolist(), vs[order].tolist(), weights[order].tolist()):
        candidate = dist[u] + w
        if back[v] == v or candidate > dist[v]:
            dist[v], back[v] = candidate, u
    end = max(range(n), key=dist.__getitem__)
    path = [end]
    while back[path[-1]] != path[-1]:
        path.append(back[path[-1]])
    path.reverse()
    return path, dist[end]


def _longest_path(graph: _Graph, exact: bool = True) -> tuple[list[int], float] | None:
    """Longest path by dynamic programming over a topological order; None on a cycle. The order
    and the ties are networkx's (``topological_sort`` by generations, the first-added best
    predecessor, the first best end in that order), so the path is HTA's, not only its length.
    A negative weight counts as 0 (HTA: "nanosecond precision"). ``exact=False`` (default mode)
    takes :func:`_longest_path_forward` when it applies."""
    n = len(graph.node_ts)
    if n == 0:
        return None
    if not exact:
        found = _longest_path_forward(graph)
        if found is not None:
            return found
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    indegree = [0] * n
    for (u, v), (_, weight, _) in graph.edges.items():
        succ[u].append(v)
        pred[v].append((u, weight if weight > 0 else 0.0))
        indegree[v] += 1
    generation = [i for i in range(n) if indegree[i] == 0]
    order: list[int] = []
    while generation:
        order.extend(generation)
        following = []
        for u in generation:
            for w in succ[u]:
                indegree[w] -= 1
                if indegree[w] == 0:
                    following.append(w)
        generation = following
    if len(order) < n:
        return None
    dist = [0.0] * n
    back = list(range(n))
    for v in order:
        best, via = 0.0, v
        for u, weight in pred[v]:
            candidate = dist[u] + weight
            if via == v or candidate > best:
                best, via = candidate, u
        dist[v], back[v] = best, via
    end = max(order, key=lambda node: dist[node])
    path = [end]
    while back[path[-1]] != path[-1]:
        path.append(back[path[-1]])
    path.reverse()
    return path, dist[end]


def _data_loading_ranges(rows: _Rows, window: IntArray, hta: bool,
                         patterns: tuple[str, ...] | None) -> list[tuple[float, float, int, int]]:
    names = _data_loading_names(rows, hta, patterns)
    if not len(names):
        return []
    pos = window[symbol_mask(rows.name[window], names, rows.n_symbols)]
    return [(float(rows.ts[p]), float(rows.end[p]), int(rows.pid[p]), int(rows.tid[p])) for p in pos.tolist()]


def _bounds(rows: _Rows, edges: list[tuple[str, float, int]], attributed: list[int],
            data_loading: list[tuple[float, float, int, int]]) -> list[str]:
    """What bounds each path edge (its type; for an operator or kernel edge, the event it is
    attributed to: a CPU row inside a data-loading range of its thread, another CPU row, or the GPU
    row's kernel type)."""
    events = np.array(attributed, dtype=np.int64)
    real = np.flatnonzero(events >= 0)
    stream = np.full(len(events), -1, dtype=np.int64)
    ktype = np.zeros(len(events), dtype=np.int64)
    loading = np.zeros(len(events), dtype=bool)
    if len(real):
        rows_of = events[real]
        stream[real] = rows.stream[rows_of]
        ktype[real] = rows.ktype[rows_of]
        for start, end, pid, tid in data_loading:
            loading[real] |= ((rows.ts[rows_of] >= start) & (rows.ts[rows_of] <= end) & (rows.pid[rows_of] == pid)
                              & (rows.tid[rows_of] == tid))
    out = []
    for (kind, weight, _), event, on_device, kernel, in_loading in zip(edges, attributed, (stream >= 0).tolist(),
                                                                        ktype.tolist(), loading.tolist()):
        if kind == KERNEL_GAP:
            out.append(GAP)
        elif kind == WAIT:
            out.append(SYNC_WAIT)
        elif kind == SYNC:
            out.append(CPU if weight > 0 and event >= 0 else "")
        elif kind == LAUNCH:
            out.append(LAUNCH_OVERHEAD)
        elif event == BETWEEN_OPS:
            out.append(CPU)
        elif kind == DEPENDENCY or event < 0:
            out.append("")
        elif not on_device:
            out.append(DATA_LOADING if in_loading else CPU)
        elif kernel == COMMUNICATION:
            out.append(COMM)
        else:
            out.append(GPU_MEMORY if kernel == MEMORY else GPU_COMPUTE)
    return out


def _sync_text(rows: _Rows, kind: str, src: int, dst: int) -> str:
    if kind == WAIT:
        if rows.stream[dst] >= 0:
            return f"{rows.decode(src)} waited for stream {int(rows.stream[dst])}"
        return f"{rows.decode(src)} waited on the device (no kernel in the trace is linked to the wait)"
    stream = int(rows.stream[src])
    waiter = rows.decode(dst)
    if rows.stream[dst] >= 0:
        return f"stream {int(rows.stream[dst])} waited for stream {stream} (cudaStreamWaitEvent)"
    return f"{waiter} waited for stream {stream}"


def segments(path: CriticalPath, events: EventTable, top: int = 10, steps: int = 1) -> list[Segment]:
    """The path's weighted edges grouped by the event they are attributed to (by name and stream),
    longest first (``steps``: how many steps ``path`` joins, for the time per step)."""
    strings = events.symbols.strings
    why = {CPU: "CPU work on the path", DATA_LOADING: "waiting for data", LAUNCH_OVERHEAD: "launch to kernel start",
           GAP: "idle stream between kernels", GPU_COMPUTE: "kernel on the path", GPU_MEMORY: "copy on the path",
           COMM: "collective on the path", SYNC_WAIT: "the host blocked on the device"}
    totals: dict[tuple[str, int, str], list[float]] = {}
    kept = [edge for edge in path.path if edge.bound and edge.weight_us > 0]
    rows = np.array([edge.dst if edge.bound == LAUNCH_OVERHEAD else edge.event for edge in kept], dtype=np.int64)
    safe = np.maximum(rows, 0)
    names, streams = events.name[safe].tolist(), events.stream[safe].tolist()
    for edge, row, name_id, row_stream in zip(kept, rows.tolist(), names, streams):
        if edge.parts:  # a blocking call's wait: the device's work meanwhile, and the rest
            call = strings[name_id] if edge.event >= 0 else "a blocking call"
            for part, us in edge.parts:
                key = (call if part == SYNC_WAIT else f"(device busy while {call} waited)", -1, part)
                entry = totals.setdefault(key, [0.0, 0])
                entry[0] += us
                entry[1] += 1
            continue
        name = strings[name_id] if row >= 0 else "(between operators)"
        stream = row_stream if row >= 0 else -1
        entry = totals.setdefault((name, stream, edge.bound), [0.0, 0])
        entry[0] += edge.weight_us
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    length = path.length_us
    return [Segment(name, stream, bound, why[bound], us, int(count), us / length if length > 0 else 0.0, us / steps)
            for (name, stream, bound), (us, count) in ranked]


@dataclass(frozen=True)
class StepPath:
    """One step's path, summarised."""

    label: str
    span_us: float  # the window (the step's duration)
    length_us: float
    bound_us: dict[str, float]
    syncs: tuple[str, ...]
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "span_us": self.span_us, "length_us": self.length_us,
                "bound_us": dict(self.bound_us), "syncs": list(self.syncs), "ok": self.ok}


class PathSpan(NamedTuple):
    """A stretch of one step's path on the timeline (µs as in the trace), for the HTML and Perfetto views."""

    name: str
    bound: str
    ts_us: float
    end_us: float
    pid: str
    tid: str  # the thread, or the stream's tid on a device
    stream: int


@dataclass(frozen=True)
class PathSummary:
    """The critical path of every step of one rank's trace (or of the whole trace without steps)."""

    steps: tuple[StepPath, ...]
    bound_us: dict[str, float]  # over all steps
    length_us: float
    span_us: float
    segments: tuple[Segment, ...]
    syncs: tuple[str, ...]
    shown_step: str  # the step drawn on the timeline (the longest path)
    spans: tuple[PathSpan, ...]
    notes: tuple[str, ...] = ()
    after_sync_us: float = 0.0  # device idle while the path is on the host right after a sync

    #: every bound kind, in display order, and its label (renderers read them from here)
    KINDS = BOUND_KINDS
    LABELS = BOUND_LABELS
    #: a share below this is not shown (it would print as 0.0 %)
    SHOWN_FROM = 0.0005

    @staticmethod
    def label(kind: str) -> str:
        return BOUND_LABELS.get(kind, kind)

    def shown_shares(self) -> dict[str, float]:
        """The shares worth showing, in display order."""
        return {kind: share for kind in BOUND_KINDS if (share := self.share(kind)) >= self.SHOWN_FROM}

    @property
    def per_step_us(self) -> float:
        """Mean path length per step analysed."""
        return self.length_us / max(len(self.steps), 1)

    @property
    def span_per_step_us(self) -> float:
        """Mean duration of the steps analysed."""
        return self.span_us / max(len(self.steps), 1)

    @property
    def after_sync_share(self) -> float:
        return self.after_sync_us / self.length_us if self.length_us > 0 else 0.0

    def share(self, *kinds: str) -> float:
        if self.length_us <= 0:
            return 0.0
        return sum(self.bound_us.get(kind, 0.0) for kind in kinds) / self.length_us

    @property
    def coverage(self) -> float | None:
        """Path length over the steps' duration (below 1: the path skips time nothing on it explains)."""
        return self.length_us / self.span_us if self.span_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": "stepscope",
            "length_us": self.length_us, "span_us": self.span_us, "coverage": self.coverage,
            "bound_us": dict(self.bound_us),
            "bound_share": {kind: self.share(kind) for kind in BOUND_KINDS if kind in self.bound_us},
            "after_sync_us": self.after_sync_us,
            "segments": [{"name": s.name, "stream": s.stream, "bound": s.bound, "why": s.why, "us": s.us,
                          "count": s.count} for s in self.segments],
            "syncs": list(self.syncs), "shown_step": self.shown_step,
            "steps": [s.to_dict() for s in self.steps], "notes": list(self.notes),
        }


#: Steps whose critical path ``analyze`` computes by default: the one of median duration. The path
#: costs ~0.2 s per step of ~15,000 host events (BENCHMARKS.md); ``--path-steps`` asks for more.
DEFAULT_PATH_STEPS = 1


def chosen_steps(windows: list[tuple[str, float, float]], steps: int) -> list[tuple[str, float, float]]:
    """``steps`` of the windows, spread over their durations (one: the median; 0: all), in order."""
    if steps <= 0 or steps >= len(windows):
        return windows
    by_span = sorted(range(len(windows)), key=lambda i: (windows[i][2] - windows[i][1], i))
    picked = sorted({by_span[min(int((k + 0.5) * len(windows) / steps), len(windows) - 1)] for k in range(steps)})
    return [windows[i] for i in picked]


def path_summary(events: EventTable, rank: int = 0, top: int = 12, steps: int = 0) -> PathSummary | None:
    """The critical path of each ``ProfilerStep`` (default mode) — of ``steps`` of them chosen
    across their durations (:func:`chosen_steps`; 0: every step) — or of the whole trace when it
    has none; None without any GPU row or CPU operator to build a graph from."""
    windows = step_windows(events)
    notes: list[str] = []
    if 0 < steps < len(windows):
        picked = chosen_steps(windows, steps)
        which = "the one of median duration" if steps == 1 else "spread over their durations"
        notes.append(f"the critical path covers {len(picked)} of {len(windows)} steps ({which}: "
                     f"{', '.join(label for label, _, _ in picked)}); analyze --path-steps 0 covers every step")
        windows = picked
    rows = _rows_of(events)
    if not len(rows.ts):
        return None
    if not windows:
        windows = [("whole trace", float(rows.ts.min()), float(rows.end.max()))]
    paths = [found for label, start, end in windows
             if (found := _analyse(rows, rank, label, start, end, False, None)) is not None]
    paths = [p for p in paths if p.nodes > 0]
    if not paths:
        return None
    bound: dict[str, float] = defaultdict(float)
    for p in paths:
        for kind, us in p.bound_us.items():
            bound[kind] += us
        notes.extend(p.notes)
    merged = CriticalPath(rank, "all steps", paths[0].start_us, paths[-1].end_us, 0, 0, {}, sum(p.length_us for p in paths),
                          tuple(edge for p in paths for edge in p.path), dict(bound), (), "stepscope")
    shown = max(paths, key=lambda p: p.length_us)
    busy = rows.busy
    return PathSummary(
        steps=tuple(StepPath(p.label, p.span_us, p.length_us, dict(p.bound_us), p.syncs, p.ok) for p in paths),
        bound_us=dict(bound), length_us=merged.length_us, span_us=sum(p.span_us for p in paths),
        segments=tuple(segments(merged, events, top, len(paths))), syncs=tuple(dict.fromkeys(s for p in paths for s in p.syncs)),
        shown_step=shown.label, spans=tuple(_spans(shown, events)), notes=tuple(dict.fromkeys(notes)),
        after_sync_us=sum(_after_sync_us(p, busy) for p in paths))


def _after_sync_us(path: CriticalPath, busy: tuple[np.ndarray, np.ndarray]) -> float:
    """The device's idle time while the path is on the host right after a sync (until the path
    reaches the device again): what the sync cost, the device having drained its queue for it.
    The host's own time there is not counted when the device was busy meanwhile."""
    begins, ends = [], []
    armed = False
    for edge in path.path:
        if edge.kind == SYNC:
            armed = True
        elif edge.bound in (LAUNCH_OVERHEAD, GAP, GPU_COMPUTE, GPU_MEMORY, COMM):
            armed = False
        elif armed and edge.bound == CPU and edge.weight_us > 0:
            begins.append(edge.src_us)
            ends.append(edge.dst_us)
    if not begins:
        return 0.0
    host = intervals.merge(np.array(begins), np.array(ends))
    return intervals.total(*intervals.subtract(host, busy))


def _spans(path: CriticalPath, events: EventTable) -> list[PathSpan]:
    """The weighted edges of one path as timeline stretches: a kernel or CPU edge lies on its
    thread / stream; a launch edge on the kernel's stream (the wait before it starts)."""
    kept = [edge for edge in path.path if edge.bound and edge.weight_us > 0]
    if not kept:
        return []
    make = partial(tuple.__new__, PathSpan)
    strings = events.symbols.strings
    out: list[PathSpan] = []
    for lo in range(0, len(kept), _CHUNK):  # in chunks: the columns as Python lists stay small
        column = dict(zip(PathEdge._fields, zip(*kept[lo:lo + _CHUNK])))
        src, dst, event = (np.asarray(column[name], dtype=np.int64) for name in ("src", "dst", "event"))
        bound = np.asarray(column["bound"], dtype=object)
        where = np.where((bound == LAUNCH_OVERHEAD) | (bound == GAP), dst, np.where(event >= 0, event, src))
        names = list(map(strings.__getitem__, events.name[np.where(event >= 0, event, where)].tolist()))
        for i in np.flatnonzero(event == BETWEEN_OPS).tolist():
            names[i] = "(between operators)"
        out += map(make, zip(names, column["bound"], column["src_us"], column["dst_us"],
                             map(strings.__getitem__, events.pid[where].tolist()),
                             map(strings.__getitem__, events.tid[where].tolist()), events.stream[where].tolist()))
    return out
