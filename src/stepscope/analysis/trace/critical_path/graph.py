"""The graph's nodes (a start and an end per event, in time order) and its edge store.

Edges are columns (source node, destination node, type, weight, attributed row), added in
batches by the numpy passes and one at a time by the few loops left; :meth:`Graph.finish` then
keeps one edge per node pair as networkx does (the last one added, in the place of the first)."""

from __future__ import annotations

import functools

import numpy as np

from stepscope.analysis.trace.critical_path.model import CODE, DEPENDENCY, NODE_CATS, SYNC, IntArray
from stepscope.analysis.trace.critical_path.rows import Rows, data_loading_names
from stepscope.traces.links import OPERATOR as OPERATOR_ROLE
from stepscope.traces.links import RUNTIME as RUNTIME_ROLE
from stepscope.traces.links import int_isin, symbol_mask

#: Types whose edge weighs nothing (unless timed): HTA's dependency and sync edges.
_WEIGHTLESS = np.array([CODE[DEPENDENCY], CODE[SYNC]])
#: No attributed row given (``attribute`` then decides by type).
NO_EVENT = -2

FloatArray = np.ndarray


class Graph:
    """Nodes are (event position, is_start), numbered in time order; edges in insertion order."""

    def __init__(self, ts: FloatArray, pos: IntArray, start: np.ndarray, begin: FloatArray):
        self.ts = ts  # each node's time (HTA's rounded µs); the walk cuts an ill-nested event's end
        self.pos = pos  # the event position (of the kept rows) of each node
        self.start = start  # whether the node is its event's start
        self.begin = begin  # the start of each node's event
        self._node_ts: list[float] | None = None  # ts as a list, once a loop reads it (node_ts)
        # the rows with nodes, sorted, and each one's start and end node (a window's worth, not
        # a column over the whole trace's rows)
        nodes = np.arange(len(pos), dtype=np.int64)
        by_row = np.argsort(pos[start], kind="stable")
        self._rows = pos[start][by_row]
        self._starts = nodes[start][by_row]
        self._ends = nodes[~start][np.argsort(pos[~start], kind="stable")]
        self._batches: list[tuple[IntArray, IntArray, IntArray, FloatArray, IntArray]] = []
        self._single: tuple[list[int], list[int], list[int], list[float], list[int]] = ([], [], [], [], [])
        self.u = self.v = self.kind = self.event = np.zeros(0, dtype=np.int64)
        self.weight = np.zeros(0)
        self._n = 0  # edges added

    def __len__(self) -> int:
        return len(self.ts)

    # the Python lists of the columns, for the loops that remain (one edge at a time): made on first use
    @property
    def node_ts(self) -> list[float]:
        if self._node_ts is None:
            self._node_ts = self.ts.tolist()
        return self._node_ts

    @functools.cached_property
    def node_pos(self) -> list[int]:
        return self.pos.tolist()  # type: ignore[no-any-return]

    @functools.cached_property
    def node_start(self) -> list[bool]:
        return self.start.tolist()  # type: ignore[no-any-return]

    def start_of(self, pos: IntArray) -> IntArray:
        """The start node of each row, -1 for a row without nodes."""
        return self._lookup(pos, self._starts)

    def end_of(self, pos: IntArray) -> IntArray:
        """The end node of each row, -1 for a row without nodes."""
        return self._lookup(pos, self._ends)

    def _lookup(self, pos: IntArray, nodes: IntArray) -> IntArray:
        pos = np.asarray(pos, dtype=np.int64)
        if not len(self._rows):
            return np.full(pos.shape, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._rows, pos), len(self._rows) - 1)
        return np.where(self._rows[at] == pos, nodes[at], -1)

    def node(self, pos: int, start: bool) -> int:
        """The node of an event's start or end, -1 when the event has none."""
        rows = self._rows
        if pos < 0 or not len(rows):
            return -1
        at = int(rows.searchsorted(pos))  # one scalar: the array method, not _lookup's array round trip
        if at == len(rows) or rows[at] != pos:
            return -1
        return int((self._starts if start else self._ends)[at])

    def set_ts(self, node: int, ts: float) -> None:
        self.ts[node] = ts
        if self._node_ts is not None:
            self._node_ts[node] = ts

    def set_ts_many(self, nodes: IntArray, ts: FloatArray) -> None:
        self.ts[nodes] = ts
        if self._node_ts is not None:
            for node, value in zip(nodes.tolist(), ts.tolist()):
                self._node_ts[node] = value

    def add(self, u: int, v: int, kind: str, zero: bool = False, event: int = NO_EVENT, timed: bool = False) -> int:
        """One edge; returns its number. ``timed``: a sync edge weighs the time from the device
        work's end to the call's return when the call was waiting for it (the work ended after the
        call began), else nothing."""
        node_ts = self.node_ts
        if timed:
            waited = node_ts[u] >= self.begin[v]
            weight = max(node_ts[v] - node_ts[u], 0.0) if waited else 0.0
        else:
            weight = 0.0 if zero or kind == DEPENDENCY or kind == SYNC else node_ts[v] - node_ts[u]
        us, vs, kinds, weights, events = self._single
        us.append(u)
        vs.append(v)
        kinds.append(CODE[kind])
        weights.append(weight)
        events.append(event)
        self._n += 1
        return self._n - 1

    def add_many(self, u: IntArray, v: IntArray, kind: IntArray | int, zero: np.ndarray | bool = False,
                 event: IntArray | int = NO_EVENT, timed: np.ndarray | bool = False) -> IntArray:
        """Edges as columns (``kind``: codes); their weights from the nodes' times now, as
        :meth:`add` would weigh each (``timed``: per edge or all). Returns the edges' numbers in
        insertion order."""
        self._flush()
        u, v = np.asarray(u, dtype=np.int64), np.asarray(v, dtype=np.int64)
        kinds = np.broadcast_to(np.asarray(kind, dtype=np.int64), u.shape).copy()
        span = self.ts[v] - self.ts[u]
        timed_weight = np.where(self.ts[u] >= self.begin[v], np.maximum(span, 0.0), 0.0)
        weightless = int_isin(kinds, _WEIGHTLESS) | np.asarray(zero, dtype=bool)
        weight = np.where(np.asarray(timed, dtype=bool), timed_weight, np.where(weightless, 0.0, span))
        events = np.broadcast_to(np.asarray(event, dtype=np.int64), u.shape).copy()
        first = self._n
        self._batches.append((u, v, kinds, weight, events))
        self._n += len(u)
        return np.arange(first, first + len(u), dtype=np.int64)

    def count(self) -> int:
        return self._n

    def _flush(self) -> None:
        if self._single[0]:
            us, vs, kinds, weights, events = self._single
            self._batches.append((np.array(us, dtype=np.int64), np.array(vs, dtype=np.int64),
                                  np.array(kinds, dtype=np.int64), np.array(weights, dtype=np.float64),
                                  np.array(events, dtype=np.int64)))
            self._single = ([], [], [], [], [])

    def columns(self) -> tuple[IntArray, IntArray, IntArray, FloatArray, IntArray]:
        """Every edge added so far, as columns in insertion order (duplicates kept)."""
        self._flush()
        if len(self._batches) != 1:
            parts = list(zip(*self._batches)) if self._batches else [[np.zeros(0, dtype=np.int64)]] * 5
            joined = tuple(np.concatenate(part) for part in parts)
            self._batches = [joined]  # type: ignore[list-item]
        return self._batches[0]

    def keys(self) -> IntArray:
        """Each edge's node pair as one number."""
        u, v = self.columns()[:2]
        return u * len(self.ts) + v

    def finish(self) -> None:
        """One edge per node pair, as networkx keeps them: the last one added, in the place of the
        first. Sets the columns ``u``, ``v``, ``kind``, ``weight``, ``event``."""
        u, v, kind, weight, event = self.columns()
        keys = u * len(self.ts) + v
        unique, first = np.unique(keys, return_index=True)
        if len(unique) < len(keys):
            last = len(keys) - 1 - np.unique(keys[::-1], return_index=True)[1]  # same order of keys
            order = np.argsort(first, kind="stable")
            first, last = first[order], last[order]
            u, v, kind, weight, event = u[first], v[first], kind[last], weight[last], event[last]
        self.u, self.v, self.kind, self.weight, self.event = u, v, kind, weight, event


def graph_nodes(rows: Rows, window: IntArray, hta: bool, data_loading: tuple[str, ...] | None) -> Graph:
    """The window's nodes: a start and an end node per CPU operator or runtime call (HTA's
    categories; default mode, the 2021 spelling too), per GPU row linked to a launch and per
    data-loading range, in time order."""
    cats = rows.names(NODE_CATS)
    mask = symbol_mask(rows.cat[window], cats, rows.n_symbols)
    if not hta:  # also the 2021 spelling (cat "Operator" / "Runtime"), which HTA does not read
        role = rows.role[window]
        mask |= ((role == OPERATOR_ROLE) | (role == RUNTIME_ROLE)) & (rows.stream[window] == -1)
    mask |= (rows.stream[window] != -1) & (rows.ic[window] != -1)
    dl = data_loading_names(rows, hta, data_loading)
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
    who = who[order]
    return Graph(ts[order].astype(np.float64), who.astype(np.int64), is_start[order], rows.ts[who].astype(np.float64))
