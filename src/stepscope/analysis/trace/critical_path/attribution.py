"""Attribution: the event each path edge is attributed to, what bounds it, what the path waited
on, and the path's edges as rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stepscope.analysis.trace.critical_path.graph import Graph
from stepscope.analysis.trace.critical_path.model import BETWEEN_OPS, BOUND_CODE as _BOUND, BOUNDS, CODE, COMM, CPU, DATA_LOADING
from stepscope.analysis.trace.critical_path.model import (DEPENDENCY, GAP, GPU_COMPUTE, GPU_MEMORY, KERNEL_GAP, KINDS, LAUNCH, LAUNCH_OVERHEAD,
                                                          OPERATOR, SYNC, SYNC_WAIT, WAIT, WAIT_WORTH_NAMING_US, IntArray,
                                                          PathColumns, PathEdge, PathEdges)
from stepscope.analysis.trace.critical_path.rows import Rows
from stepscope.traces.links import COMMUNICATION, MEMORY


def attribute(graph: Graph, path: IntArray) -> IntArray:
    """The event (row position) each path edge (``path``: edge numbers) is attributed to, HTA's
    rule: a kernel gap to the earlier kernel; an operator edge to the event it lies in (given when
    it was drawn: a gap between two children to their parent; otherwise the source's event); a
    timed sync to the waiting call; a wait to its call; -1 for none, :data:`BETWEEN_OPS` between
    two top-level operators."""
    kind, event, weight = graph.kind[path], graph.event[path], graph.weight[path]
    source, destination = graph.pos[graph.u[path]], graph.pos[graph.v[path]]
    given = (event >= 0) | (event == BETWEEN_OPS)
    return np.select([kind == CODE[KERNEL_GAP], kind == CODE[WAIT], kind == CODE[SYNC], kind != CODE[OPERATOR]],
                     [source, event, np.where(weight > 0, destination, -1), -1], np.where(given, event, source))


def bounds_of(rows: Rows, kind: IntArray, weight: np.ndarray, attributed: IntArray,
              data_loading: list[tuple[float, float, int, int]]) -> IntArray:
    """What bounds each path edge (codes of :data:`BOUNDS`): its type; for an operator or kernel
    edge, the event it is attributed to: a CPU row inside a data-loading range of its thread,
    another CPU row, or the GPU row's kernel type. The first test that holds decides."""
    real = attributed >= 0
    row = np.maximum(attributed, 0)
    on_device = real & (rows.stream[row] >= 0)
    kernel = rows.ktype[row]
    loading = np.zeros(len(attributed), dtype=bool)
    for start, end, pid, tid in data_loading:
        loading |= ((rows.ts[row] >= start) & (rows.ts[row] <= end) & (rows.pid[row] == pid) & (rows.tid[row] == tid))
    loading &= real
    timed_sync = (weight > 0) & real
    tests: list[tuple[np.ndarray, Any]] = [
        (kind == CODE[KERNEL_GAP], _BOUND[GAP]),
        (kind == CODE[WAIT], _BOUND[SYNC_WAIT]),
        (kind == CODE[SYNC], np.where(timed_sync, _BOUND[CPU], 0)),
        (kind == CODE[LAUNCH], _BOUND[LAUNCH_OVERHEAD]),
        (attributed == BETWEEN_OPS, _BOUND[CPU]),
        ((kind == CODE[DEPENDENCY]) | ~real, 0),
        (~on_device, np.where(loading, _BOUND[DATA_LOADING], _BOUND[CPU])),
        (kernel == COMMUNICATION, _BOUND[COMM]),
        (kernel == MEMORY, _BOUND[GPU_MEMORY]),
    ]
    chosen = np.select([test for test, _ in tests], [code for _, code in tests], _BOUND[GPU_COMPUTE])
    return np.asarray(chosen, dtype=np.int64)


def path_edges(rows: Rows, graph: Graph, nodes: list[int], path: IntArray, attributed: IntArray, bound: IntArray,
               hta: bool, as_rows: bool = True) -> tuple[Sequence[PathEdge], PathColumns, dict[str, float], list[str]]:
    """The path's edges as :class:`PathEdge` rows (``as_rows``: :class:`PathEdges`, made on first
    read; always as columns), the path time per bound kind (summed in path order) and what the
    path waited on."""
    if not len(path):
        return (), PathColumns.of(()), {}, []
    kind, weight = graph.kind[path], graph.weight[path]
    node = np.asarray(nodes, dtype=np.int64)
    node_us = graph.ts[node]
    node_pos = graph.pos[node]
    split: dict[int, tuple[tuple[str, float], ...]] = {}  # a blocking call's wait, by what the device did
    waited: list[str] = []
    # per bound kind, the path time in path order: (edge, part, kind, µs); a blocking call's wait
    # counts what the device did meanwhile, part by part
    at, part_at, bound_at, us = [], [], [], []
    plain = (bound > 0) & (kind != CODE[WAIT])
    named: list[tuple[int, str]] = []  # (path edge, what it waited on)
    waits = np.flatnonzero(kind == CODE[WAIT])
    for i, weight_us in zip(waits.tolist(), weight[waits].tolist()):
        if weight_us > 0:
            parts = split[i] = rows.device_during(float(node_us[i]), float(node_us[i + 1]))
            for k, (part, part_us) in enumerate(parts):
                at.append(i)
                part_at.append(k)
                bound_at.append(_BOUND[part])
                us.append(part_us)
        elif bound[i] > 0:  # a wait of no time: HTA's rule, its own weight
            plain[i] = True
        if weight_us >= WAIT_WORTH_NAMING_US:
            named.append((i, sync_text(rows, WAIT, int(node_pos[i]), int(node_pos[i + 1]))))
    named.extend(_sync_texts(rows, np.flatnonzero(kind == CODE[SYNC]), node_pos))
    waited.extend(dict.fromkeys(text for _, text in sorted(named)))  # each once, where the path first met it
    counted = np.flatnonzero(plain)
    value = weight[counted] if hta else np.maximum(weight[counted], 0.0)  # HTA sums the edge's own weight
    edge = np.concatenate([counted, np.asarray(at, dtype=np.int64)])
    nth = np.concatenate([np.zeros(len(counted), dtype=np.int64), np.asarray(part_at, dtype=np.int64)])
    code = np.concatenate([bound[counted], np.asarray(bound_at, dtype=np.int64)])
    amount = np.concatenate([value, np.asarray(us, dtype=np.float64)])
    order = np.lexsort((nth, edge))
    code, amount = code[order], amount[order]
    totals: dict[str, float] = {}
    if len(code):
        firsts = np.unique(code, return_index=True)
        for c in firsts[0][np.argsort(firsts[1])].tolist():  # in the order each kind first appears
            totals[BOUNDS[c]] = float(np.cumsum(amount[code == c])[-1]) + 0.0
    index = rows.index
    event_rows = np.where(attributed >= 0, index[np.maximum(attributed, 0)], attributed).astype(np.int64)
    src_rows, dst_rows = index[node_pos[:-1]].astype(np.int64), index[node_pos[1:]].astype(np.int64)
    columns = PathColumns(kind, weight, src_rows, dst_rows, event_rows, bound, node_us[:-1], node_us[1:],
                          {i: parts for i, parts in split.items() if parts})
    if not as_rows:
        return (), columns, totals, waited
    return PathEdges(columns, graph.start[node]), columns, totals, waited


def _sync_texts(rows: Rows, syncs: IntArray, node_pos: IntArray) -> list[tuple[int, str]]:
    """What the path's sync edges (``syncs``: path edge numbers) waited on: one text per distinct
    (waited stream, waiter) at the first edge that names it (a step's path may cross thousands of
    syncs of a few kinds)."""
    if not len(syncs):
        return []
    src, dst = node_pos[syncs], node_pos[syncs + 1]
    waiter = np.where(rows.stream[dst] >= 0, rows.stream[dst], -2 - rows.name[dst].astype(np.int64))
    _, first = np.unique(np.stack([rows.stream[src].astype(np.int64), waiter]), axis=1, return_index=True)
    return [(int(syncs[k]), sync_text(rows, SYNC, int(src[k]), int(dst[k]))) for k in np.sort(first).tolist()]


def sync_text(rows: Rows, kind: str, src: int, dst: int) -> str:
    if kind == WAIT:
        if rows.stream[dst] >= 0:
            return f"{rows.decode(src)} waited for stream {int(rows.stream[dst])}"
        return f"{rows.decode(src)} waited on the device (no kernel in the trace is linked to the wait)"
    stream = int(rows.stream[src])
    waiter = rows.decode(dst)
    if rows.stream[dst] >= 0:
        return f"stream {int(rows.stream[dst])} waited for stream {stream} (cudaStreamWaitEvent)"
    return f"{waiter} waited for stream {stream}"
