"""One window's critical path: its rows, its graph, its longest path and what bounds it."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.trace.critical_path.attribution import attribute, bounds_of, path_edges
from stepscope.analysis.trace.critical_path.device_edges import kernel_edges
from stepscope.analysis.trace.critical_path.launches import synchronous_launches
from stepscope.analysis.trace.critical_path.graph import graph_nodes
from stepscope.analysis.trace.critical_path.host_edges import call_stack_edges, runtime_lock_edges
from stepscope.analysis.trace.critical_path.longest import longest_path
from stepscope.analysis.trace.critical_path.model import BLOCKING_CALLS, CODE, KINDS, WAIT, CriticalPath
from stepscope.analysis.trace.critical_path.rows import Rows, data_loading_ranges, rows_of, step_windows, window_rows
from stepscope.traces.events import EventTable
from stepscope.traces.links import symbol_mask


def critical_path(events: EventTable, rank: int = 0, annotation: str = "ProfilerStep", instance: int | None = 0,
                  hta: bool = False, data_loading: tuple[str, ...] | None = None,
                  keep_graph: bool = False) -> CriticalPath | None:
    """The critical path of one window: the ``instance``-th row whose name contains ``annotation``
    (``annotation=""``: the whole trace). None when the annotation is not in the trace or the
    window holds no event. ``hta=True`` builds HTA's graph exactly; ``data_loading`` are regular
    expressions of data-loading event names (HTA's ``data_load_events``; default mode: the
    DataLoader ranges). ``keep_graph`` keeps every edge in :attr:`CriticalPath.graph`."""
    rows = rows_of(events)
    if not len(rows.ts):
        return None
    if annotation:
        hits = np.flatnonzero(symbol_mask(rows.name, rows.names_containing(annotation), rows.n_symbols))
        first, last = (0, 0) if instance is None else (instance, instance)
        chosen = hits[first:last + 1]
        if not len(chosen):
            return None
        start, end = float(rows.ts[chosen].min()), float(rows.end[chosen].max())
        label = rows.decode(int(chosen[0]))
    else:
        start, end = float(rows.ts.min()), float(rows.end.max())
        label = "whole trace"
    return analyse(rows, rank, label, start, end, hta, data_loading, keep_graph)


def step_paths(events: EventTable, rank: int = 0, hta: bool = False) -> list[CriticalPath]:
    """The critical path of every ``ProfilerStep`` of the trace (HTA's kept rows: with two steps or
    more, HTA drops the last one's host events)."""
    rows = rows_of(events)
    out = []
    for label, start, end in step_windows(events):
        found = analyse(rows, rank, label, start, end, hta, None)
        if found is not None:
            out.append(found)
    return out


def analyse(rows: Rows, rank: int, label: str, start: float, end: float, hta: bool,
            data_loading: tuple[str, ...] | None, keep_graph: bool = False, as_rows: bool = True) -> CriticalPath | None:
    """The critical path of the window [start, end]: its graph (the host's edges, then the
    device's, then the deferred waits), its longest path, and what bounds each path edge
    (``as_rows=False``: the path's edges only as :attr:`CriticalPath.columns`, its ``path`` empty,
    for a summary that reads the columns)."""
    window = window_rows(rows, start, end, hta)
    if not len(window):
        return None
    notes: list[str] = []
    graph = graph_nodes(rows, window, hta, data_loading)
    cpu = window[rows.stream[window] == -1]
    blocking = set(cpu[rows.name_in(BLOCKING_CALLS, cpu)].tolist())  # HTA: their own edge weighs 0
    synchronous = synchronous_launches(rows, window) if not hta else (cpu[:0], cpu[:0])
    # default mode: blocking calls' own edges are deferred, then drawn last as waits
    deferring = set() if hta else blocking | set(synchronous[0].tolist())
    deferred: list[tuple[int, int, int]] = []
    runtime_lock_edges(rows, graph, deferring, deferred)
    call_stack_edges(rows, cpu, window, graph, hta, notes, blocking, deferring, deferred)
    kernel_edges(rows, window, graph, hta, notes, synchronous)
    if deferred:
        waits = np.array(deferred, dtype=np.int64)
        graph.add_many(waits[:, 0], waits[:, 1], CODE[WAIT], event=waits[:, 2])
    graph.finish()
    found = longest_path(graph, exact=hta)
    kinds, firsts, counts = np.unique(graph.kind, return_index=True, return_counts=True)
    by_first = np.argsort(firsts)  # in the order each type first appears, as a Counter of the edges
    edge_types = {KINDS[k]: c for k, c in zip(kinds[by_first].tolist(), counts[by_first].tolist())}
    mode = "hta" if hta else "stepscope"
    if found is None:
        return CriticalPath(rank, label, start, end, len(graph), len(graph.u), edge_types, 0.0, (), {}, (), mode,
                            (*notes, "the graph has a cycle: no path"), ok=False)
    nodes, edges, length = found
    touched = np.zeros(len(graph), dtype=bool)  # HTA's graph holds the nodes its edges touch
    touched[graph.u] = True
    touched[graph.v] = True
    on_path = np.asarray(edges, dtype=np.int64)
    attributed = attribute(graph, on_path)
    bound = bounds_of(rows, graph.kind[on_path], graph.weight[on_path], attributed,
                      data_loading_ranges(rows, window, hta, data_loading))
    path, columns, bound_us, waited = path_edges(rows, graph, nodes, on_path, attributed, bound, hta, as_rows)
    kept: tuple[tuple[str, float, int, bool, int, bool], ...] = ()
    if keep_graph:
        index = rows.index
        kept = tuple(zip(np.asarray(KINDS, dtype=object)[graph.kind].tolist(), graph.weight.tolist(),
                         index[graph.pos[graph.u]].tolist(), graph.start[graph.u].tolist(),
                         index[graph.pos[graph.v]].tolist(), graph.start[graph.v].tolist()))
    return CriticalPath(rank, label, start, end, int(touched.sum()), len(graph.u), edge_types, length, path,
                        bound_us, tuple(dict.fromkeys(waited)), mode, tuple(dict.fromkeys(notes)), graph=kept,
                        columns=columns)
