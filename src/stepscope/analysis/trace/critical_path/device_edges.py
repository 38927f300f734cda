"""The device's edges: kernels, launch delays, gaps on a stream, and synchronisations."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from stepscope.analysis.trace.critical_path.graph import NO_EVENT, Graph
from stepscope.analysis.trace.critical_path.launches import Launches, launches_of
from stepscope.analysis.trace.critical_path.model import (BLOCKING_CALLS, CODE, KERNEL_GAP, KERNEL_GAP_LIMIT_US, LAUNCH, OPERATOR, SYNC,
                                                          WAIT, IntArray)
from stepscope.analysis.trace.critical_path.rows import Rows
from stepscope.traces.links import int_isin


def kernel_edges(rows: Rows, window: IntArray, graph: Graph, hta: bool, notes: list[str],
                 synchronous: tuple[IntArray, IntArray]) -> None:
    """The device's edges of the window, as a walk row by row in time order (syncs at their end)
    would add them: each GPU row's, then each sync row's, in that order (:func:`_walk_edges`)."""
    launches = launches_of(rows, hta)
    names = {n: rows.sym(n) for n in ("Context Sync", "Stream Sync", "Event Sync", "Stream Wait Event")}
    sync_cat = rows.sym("cuda_sync")
    in_window = window[((rows.stream[window] != -1) | int_isin(rows.name[window], np.array([names["Event Sync"], names["Context Sync"]])))
                       & (rows.ic[window] != -1)]
    is_sync = rows.cat[in_window] == sync_cat
    sort_by = np.where(is_sync, rows.end[in_window], rows.ts[in_window])
    ordered = in_window[np.lexsort((in_window, sort_by))]
    edges = _walk_edges(rows, graph, launches, names, ordered, rows.cat[ordered] == sync_cat, hta)
    if len(edges.u):
        graph.add_many(edges.u, edges.v, edges.kind, event=edges.event, timed=edges.timed)
    if not hta and sync_cat < 0:
        _inferred_syncs(rows, window, graph, notes)
    if not hta:
        _synchronous_edges(graph, synchronous, notes)


class _Edges(NamedTuple):
    u: IntArray
    v: IntArray
    kind: IntArray
    event: IntArray
    timed: np.ndarray


def _walk_edges(rows: Rows, graph: Graph, launches: Launches, names: dict[str, int], ordered: IntArray,
                sync_row: np.ndarray, hta: bool) -> _Edges:
    """The walk over ``ordered`` (GPU rows and sync rows in walk order) as array passes, its edges
    in the walk's order. A GPU row with nodes adds its own edge; a sync edge from the kernel it
    waits for (a ``cudaStreamWaitEvent`` before it in the walk named it); then a launch edge when
    the stream was empty at the launch (one row launched, none queued behind it; a graph's replay:
    its first row, the rest of the graph behind it), the stream's previous kernel and the kernel it
    waits for having ended before the launch; otherwise a gap edge from the stream's previous
    kernel when under :data:`KERNEL_GAP_LIMIT_US` and the waited kernel ended before that one. A
    sync row adds its edges at its place (:func:`_sync_rows`); the stream's previous kernel, the
    last one the walk met, is found by sorting, not carried along."""
    start_of, end_of = graph.start_of(ordered), graph.end_of(ordered)
    kernel = np.flatnonzero(~sync_row & (start_of >= 0) & (end_of >= 0))  # walk places of the GPU rows walked
    pos, start, end = ordered[kernel], start_of[kernel], end_of[kernel]
    stream = rows.stream[pos].astype(np.int64)
    by_stream = np.lexsort((kernel, stream))
    follows = np.flatnonzero(stream[by_stream][1:] == stream[by_stream][:-1])
    previous = np.full(len(kernel), -1, dtype=np.int64)  # the end node of the stream's previous kernel
    previous[by_stream[follows + 1]] = end[by_stream[follows]]
    waits = _waits(rows, launches, names, ordered, sync_row, kernel, pos)
    waited_end = graph.end_of(np.maximum(waits, 0))
    waited_end[waits < 0] = -1
    runtime = rows.ic[pos].astype(np.int64)
    launched = runtime >= 0
    at = np.maximum(runtime, 0)
    ts = graph.ts
    launch_ts = np.where(launched, rows.ts[at], np.inf)
    if hta or not launches.launched_by:
        rows_launched = np.ones(len(kernel), dtype=np.int64)
    else:
        rows_launched = np.fromiter(map(launches.launched_by.get, runtime.tolist(), [1] * len(runtime)), dtype=np.int64,
                                    count=len(runtime))
    placed = (np.fromiter(map(launches.place.__contains__, pos.tolist()), dtype=bool, count=len(pos))
              if launches.place else np.zeros(len(pos), dtype=bool))
    stream_was_empty = (launched & ~placed & (launches.after_launch[at] == rows_launched)
                        & (launches.after_start[pos] == rows_launched - 1))
    waiting = waited_end >= 0
    has_previous = previous >= 0
    previous_ts = ts[np.maximum(previous, 0)]
    waited_ts = ts[np.maximum(waited_end, 0)]
    by_launch = stream_was_empty & (~has_previous | (previous_ts < launch_ts)) & (~waiting | (waited_ts < launch_ts))
    launch_start = graph.start_of(runtime)
    launch = by_launch & (launch_start >= 0)
    gap = (~by_launch & has_previous & (ts[start] - previous_ts < KERNEL_GAP_LIMIT_US)  # longer: an unseen dependency
           & (~waiting | (waited_ts < previous_ts)))
    no_event = np.full(len(kernel), NO_EVENT, dtype=np.int64)
    parts = [  # (walk place, order within the place, source, destination, type, attributed row, timed)
        (kernel, 0, start, end, CODE[OPERATOR], pos, False),
        (kernel[waiting], 1, waited_end[waiting], start[waiting], CODE[SYNC], no_event[waiting], False),
        (kernel[launch], 2, launch_start[launch], start[launch], CODE[LAUNCH], no_event[launch], False),
        (kernel[gap], 2, previous[gap], start[gap], CODE[KERNEL_GAP], graph.pos[previous[gap]], False),
    ]
    if sync_row.any():
        parts.extend(_sync_rows(rows, graph, launches, names, ordered, np.flatnonzero(sync_row), kernel, stream, end, hta))
    place = np.concatenate([np.asarray(part[0], dtype=np.int64) for part in parts])
    order = np.lexsort((np.concatenate([np.broadcast_to(np.asarray(part[1], dtype=np.int64), len(part[0]))
                                        for part in parts]), place))
    column = [np.concatenate([np.broadcast_to(np.asarray(part[k], dtype=np.int64 if k < 6 else bool), len(part[0]))
                              for part in parts])[order] for k in range(2, 7)]
    return _Edges(*column)


def _waits(rows: Rows, launches: Launches, names: dict[str, int], ordered: IntArray, sync_row: np.ndarray,
           kernel: IntArray, pos: IntArray) -> IntArray:
    """Per GPU row walked, the row of the kernel it waits for (-1: none): a ``Stream Wait Event``
    earlier in the walk names the next kernel launched on the waiting stream and the kernel before
    the matching ``cudaEventRecord``; the latest such naming before the kernel holds."""
    out = np.full(len(kernel), -1, dtype=np.int64)
    name = names["Stream Wait Event"]
    if name < 0 or not sync_row.any():
        return out
    named: dict[int, list[tuple[int, int]]] = {}  # waiting kernel -> (walk place, recorded kernel)
    swe = np.flatnonzero(sync_row & (rows.name[ordered] == name))
    for place, p, runtime in zip(swe.tolist(), ordered[swe].tolist(), rows.ic[ordered[swe]].tolist()):
        recorded = _recorded_kernel(rows, launches, p)
        waiting = launches.waits_next.get(runtime, -1)
        if recorded >= 0 and waiting >= 0:
            named.setdefault(waiting, []).append((place, recorded))
    if named:
        hits = np.flatnonzero(int_isin(pos, np.fromiter(named, dtype=np.int64, count=len(named))))
        for k, place, p in zip(hits.tolist(), kernel[hits].tolist(), pos[hits].tolist()):
            before = [recorded for at, recorded in named[p] if at < place]
            if before:
                out[k] = before[-1]
    return out


def _recorded_kernel(rows: Rows, launches: Launches, p: int) -> int:
    """The GPU row launched last before the ``cudaEventRecord`` a wait (sync row ``p``) names, -1
    for none."""
    record = launches.corr_to_record.get(rows.wait_record.get(p, -2))
    return launches.previous.get(record, -1) if record is not None else -1


def _sync_rows(rows: Rows, graph: Graph, launches: Launches, names: dict[str, int], ordered: IntArray,
               places: IntArray, kernel: IntArray, stream: IntArray, end: IntArray,
               hta: bool) -> list[tuple[Any, ...]]:
    """The edges of the walk's ``cuda_sync`` rows (at walk ``places``), as :func:`_walk_edges`'
    parts: an Event Sync joins the recorded kernel to the waiting call's end; a Stream Sync the
    stream's last kernel walked before it; a Context Sync every stream's (in the order the walk
    first met each stream). A Stream Wait Event adds none of its own (:func:`_waits`)."""
    sources, targets, at, sub = [], [], [], []
    first_met = dict.fromkeys(stream.tolist())  # the streams in the order the walk met them
    key = np.lexsort((kernel, stream))
    kernel_by, stream_by, end_by = kernel[key], stream[key], end[key]
    for place, p in zip(places.tolist(), ordered[places].tolist()):
        name = int(rows.name[p])
        runtime = int(rows.ic[p])
        target = graph.node(runtime, False)
        if name == names["Stream Wait Event"] or target < 0:
            continue
        if name == names["Event Sync"]:
            recorded = _recorded_kernel(rows, launches, p)
            source = graph.node(recorded, False) if recorded >= 0 else -1
            found = [source] if source >= 0 else []
        else:
            on = list(first_met) if name == names["Context Sync"] else [int(rows.stream[p])]
            found = []
            for s in on:  # the stream's last kernel walked before this row
                lo, hi = np.searchsorted(stream_by, s, side="left"), np.searchsorted(stream_by, s, side="right")
                k = lo + int(np.searchsorted(kernel_by[lo:hi], place)) - 1
                if k >= lo:
                    found.append(int(end_by[k]))
        for n, source in enumerate(found):
            sources.append(source)
            targets.append(target)
            at.append(place)
            sub.append(n)
    count = len(sources)
    return [(np.asarray(at, dtype=np.int64), np.asarray(sub, dtype=np.int64), np.asarray(sources, dtype=np.int64),
             np.asarray(targets, dtype=np.int64), CODE[SYNC], np.full(count, NO_EVENT, dtype=np.int64), not hta)]


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
