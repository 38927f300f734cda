"""The device's edges: kernels, launch delays, gaps on a stream, and synchronisations."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.trace.critical_path.graph import NO_EVENT, Graph
from stepscope.analysis.trace.critical_path.launches import Launches, launches_of
from stepscope.analysis.trace.critical_path.model import (BLOCKING_CALLS, CODE, KERNEL_GAP, KERNEL_GAP_LIMIT_US, LAUNCH, OPERATOR, SYNC,
                                                          WAIT, IntArray)
from stepscope.analysis.trace.critical_path.rows import Rows
from stepscope.traces.links import int_isin


def kernel_edges(rows: Rows, window: IntArray, graph: Graph, hta: bool, notes: list[str],
                 synchronous: tuple[IntArray, IntArray]) -> None:
    """The device's edges of the window, row by row in time order (syncs at their end)."""
    launches = launches_of(rows, hta)
    names = {n: rows.sym(n) for n in ("Context Sync", "Stream Sync", "Event Sync", "Stream Wait Event")}
    sync_cat = rows.sym("cuda_sync")
    in_window = window[((rows.stream[window] != -1) | int_isin(rows.name[window], np.array([names["Event Sync"], names["Context Sync"]])))
                       & (rows.ic[window] != -1)]
    is_sync = rows.cat[in_window] == sync_cat
    sort_by = np.where(is_sync, rows.end[in_window], rows.ts[in_window])
    ordered = in_window[np.lexsort((in_window, sort_by))]
    state = _Streams()
    runtime = rows.ic[ordered]
    launched = runtime >= 0
    at = np.maximum(runtime, 0)
    # per row, looked up once as columns: its launch's start and end nodes and time, and the queue
    # lengths after the launch and after the row's start
    columns = zip(ordered.tolist(), (rows.cat[ordered] == sync_cat).tolist(), rows.name[ordered].tolist(),
                  runtime.tolist(), rows.stream[ordered].tolist(), graph.start_of(ordered).tolist(),
                  graph.end_of(ordered).tolist(), graph.start_of(runtime).tolist(), graph.end_of(runtime).tolist(),
                  np.where(launched, rows.ts[at], np.inf).tolist(),
                  np.where(launched, launches.after_launch[at], 0).tolist(), launches.after_start[ordered].tolist())
    for p, sync_row, name, runtime_row, stream, start_node, end_node, launch_start, launch_end, launch_ts, \
            after_launch, after_start in columns:
        if sync_row:
            _sync_edges(rows, graph, launches, names, state, p, name, runtime_row, launch_end, stream, hta)
        elif start_node >= 0 and end_node >= 0:
            stream_was_empty = (runtime_row >= 0 and p not in launches.place
                                and after_launch == (rows_launched := launches.launched_by.get(runtime_row, 1) if not hta else 1)
                                and after_start == rows_launched - 1)
            _kernel_edges(graph, state, p, stream, start_node, end_node, launch_start, launch_ts, stream_was_empty)
    if not hta and sync_cat < 0:
        _inferred_syncs(rows, window, graph, notes)
    if not hta:
        _synchronous_edges(graph, synchronous, notes)


class _Streams:
    """The walk's state: each stream's last kernel, the kernels that wait for another stream's."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}  # stream -> end node of its last kernel
        self.kernel_sync: dict[int, int] = {}  # kernel position -> position of the kernel it waits for


def _sync_edges(rows: Rows, graph: Graph, launches: Launches, names: dict[str, int], state: _Streams, p: int, name: int,
                runtime: int, target: int, stream: int, hta: bool) -> None:
    """A ``cuda_sync`` row (``target``: the end node of the call that waited): a Stream Wait Event
    makes the next kernel on the waiting stream wait for the recorded kernel; an Event Sync joins
    the recorded kernel to the waiting call's end; a Stream Sync (Context Sync: every stream) the
    stream's last kernel."""
    if name in (names["Stream Wait Event"], names["Event Sync"]):
        record = launches.corr_to_record.get(rows.wait_record.get(p, -2))
        recorded_kernel = launches.previous.get(record, -1) if record is not None else -1
        if recorded_kernel < 0:
            return
        if name == names["Stream Wait Event"]:
            waiting_kernel = launches.waits_next.get(runtime, -1)
            if waiting_kernel >= 0:
                state.kernel_sync[waiting_kernel] = recorded_kernel
        else:
            source = graph.node(recorded_kernel, False)
            if source >= 0 and target >= 0:
                graph.add(source, target, SYNC, timed=not hta)
        return
    if target < 0:
        return
    sources = list(state.last.values()) if name == names["Context Sync"] else [state.last.get(stream, -1)]
    for node in sources:
        if node >= 0:
            graph.add(node, target, SYNC, timed=not hta)


def _kernel_edges(graph: Graph, state: _Streams, p: int, stream: int, start_node: int, end_node: int, launch_start: int,
                  launch_ts: float, stream_was_empty: bool) -> None:
    """A GPU row: its own edge; a sync edge from the kernel it waits for; then a launch edge from
    its launch's start (``launch_start``, at ``launch_ts``) when the stream was empty at the launch
    (``stream_was_empty``: one row launched, none queued behind it; a graph's replay: its first
    row, the rest of the graph behind it) and the launch has a node, else a gap edge from the
    stream's previous kernel."""
    node_ts = graph.node_ts
    graph.add(start_node, end_node, OPERATOR, event=p)
    waited_end = -1  # the end node of the kernel this one waits for (cudaStreamWaitEvent)
    waits_for = state.kernel_sync.pop(p, None)
    if waits_for is not None:
        waited_end = graph.node(waits_for, False)
        if waited_end >= 0:
            graph.add(waited_end, start_node, SYNC)
    waits_for_kernel = waited_end >= 0
    previous = state.last.get(stream, -1)
    previous_done_before_launch = previous < 0 or node_ts[previous] < launch_ts
    wait_done_before_launch = not waits_for_kernel or node_ts[waited_end] < launch_ts
    if stream_was_empty and previous_done_before_launch and wait_done_before_launch:
        if launch_start >= 0:
            graph.add(launch_start, start_node, LAUNCH)
    elif previous >= 0:
        short_gap = node_ts[start_node] - node_ts[previous] < KERNEL_GAP_LIMIT_US  # longer: an unseen dependency
        wait_done_before_previous = not waits_for_kernel or node_ts[waited_end] < node_ts[previous]
        if short_gap and wait_done_before_previous:
            graph.add(previous, start_node, KERNEL_GAP, event=graph.node_pos[previous])
    state.last[stream] = end_node


def _synchronous_edges(graph: Graph, synchronous: tuple[IntArray, IntArray], notes: list[str]) -> None:
    """Default mode: a copy or submission that returned only after its row ran goes through the row:
    per call, a timed sync from the row's end to the call's end, then (unless an edge joins them
    already, e.g. a launch edge) a wait from the call's start to the row's start."""
    calls, launched = synchronous
    if not len(calls):
        return
    source, target = graph.end_of(launched), graph.end_of(calls)
    begin, first = graph.start_of(calls), graph.start_of(launched)
    synced = (source >= 0) & (target >= 0)
    n = len(graph)
    wanted = (begin >= 0) & (first >= 0)
    mark = np.zeros(n, dtype=bool)
    mark[begin[wanted]] = True
    u, v = graph.columns()[:2]
    near = mark[u]  # the edges already drawn from these calls' starts
    drawn = int_isin(begin * n + first, u[near] * n + v[near])
    waits = wanted & ~drawn
    # per call, its sync then its wait, in the calls' order
    both = np.stack([synced, waits], axis=1).reshape(-1)
    src = np.stack([source, begin], axis=1).reshape(-1)[both]
    dst = np.stack([target, first], axis=1).reshape(-1)[both]
    kind = np.tile(np.array([CODE[SYNC], CODE[WAIT]], dtype=np.int64), len(calls))[both]
    event = np.stack([np.full(len(calls), NO_EVENT, dtype=np.int64), calls.astype(np.int64)], axis=1).reshape(-1)[both]
    graph.add_many(src, dst, kind, event=event, timed=kind == CODE[SYNC])
    notes.append("some launch calls returned only after their work ran (a synchronous submission or "
                 "copy): the path goes through the device's work, not the call")


def _inferred_syncs(rows: Rows, window: IntArray, graph: Graph, notes: list[str]) -> None:
    """Without ``cuda_sync`` rows (traces before PyTorch 2.1), a blocking call (a synchronize, a
    ``cudaMemcpy``…) is taken to have waited for the GPU row that ended last within it."""
    gpu = window[(rows.stream[window] >= 0)]
    gpu = gpu[graph.end_of(gpu) >= 0]
    calls = window[(rows.stream[window] == -1) & rows.name_in(BLOCKING_CALLS, window)]
    if not len(gpu) or not len(calls):
        return
    order = np.argsort(rows.end[gpu], kind="stable")
    ends, gpu = rows.end[gpu][order], gpu[order]
    last = np.searchsorted(ends, rows.end[calls], side="right") - 1
    added = 0
    for call, i in zip(calls.tolist(), last.tolist()):
        target = graph.node(call, False)
        if i < 0 or target < 0 or ends[i] < rows.ts[call]:
            continue
        graph.add(graph.node(int(gpu[i]), False), target, SYNC, timed=True)
        added += 1
    if added:
        notes.append("the trace has no CUDA synchronisation events (PyTorch < 2.1): a blocking call is taken "
                     "to wait for the GPU work that ended last within it")
