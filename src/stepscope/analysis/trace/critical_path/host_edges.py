"""The host's edges: the CUDA runtime lock, each thread's nesting walk, and (default mode) the
hand-offs between threads."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stepscope.analysis.trace.critical_path.graph import NO_EVENT, Graph
from stepscope.analysis.trace.critical_path.model import BETWEEN_OPS, CODE, DEPENDENCY, OPERATOR, RUNTIME_LOCK_CALLS, IntArray
from stepscope.analysis.trace.critical_path.rows import Rows
from stepscope.traces import intervals
from stepscope.traces.links import ANNOTATION as ANNOTATION_ROLE
from stepscope.traces.links import OPERATOR as OPERATOR_ROLE
from stepscope.traces.links import int_isin, symbol_mask, unique_ints


def runtime_lock_edges(rows: Rows, graph: Graph, blocking: set[int], deferred: list[tuple[int, int, int]]) -> None:
    """HTA's runtime-lock pass over the lock calls' nodes in time order (all threads): at each
    call's end, every start since the previous end is joined to it, the latest first (its own
    start by an ``operator`` edge, another call's by a ``dependency``: that call held the lock), then
    the previous end when the node before was one. Default mode: a ``blocking`` call's own edge
    is ``deferred``."""
    lock = rows.names(RUNTIME_LOCK_CALLS)
    if not len(lock) or not len(graph):
        return
    nodes = np.flatnonzero(symbol_mask(rows.name[graph.pos], lock, rows.n_symbols))
    is_end = ~graph.start[nodes]
    index = np.arange(len(nodes), dtype=np.int64)
    ends = np.flatnonzero(is_end)
    popped_at = np.searchsorted(ends, index, side="right")  # the first end after each start
    starts = np.flatnonzero(~is_end & (popped_at < len(ends)))
    popper = ends[popped_at[starts]]
    after_end = ends[ends > 0]
    after_end = after_end[is_end[after_end - 1]]
    # in the pass's order: at each end, its pops (the latest start first), then the previous end
    when = np.concatenate([popper, after_end])
    order = np.lexsort((np.concatenate([-starts, np.zeros(len(after_end), dtype=np.int64)]),
                        np.concatenate([np.zeros(len(starts), dtype=np.int64), np.ones(len(after_end), dtype=np.int64)]),
                        when))
    src = np.concatenate([nodes[starts], nodes[after_end - 1]])[order]
    dst = np.concatenate([nodes[popper], nodes[after_end]])[order]
    popped = np.concatenate([np.ones(len(starts), dtype=bool), np.zeros(len(after_end), dtype=bool)])[order]
    call = graph.pos[dst]
    own_start = popped & (graph.pos[src] == call)
    own_deferred = own_start & _member_of(call, blocking)
    drawn = ~own_deferred
    graph.add_many(src[drawn], dst[drawn], np.where(own_start, CODE[OPERATOR], CODE[DEPENDENCY])[drawn],
                   event=np.where(own_start, call, NO_EVENT)[drawn])
    deferred.extend(zip(src[own_deferred].tolist(), dst[own_deferred].tolist(), call[own_deferred].tolist()))


def _thread_of(rows: Rows, cpu: IntArray, window: IntArray, hta: bool) -> IntArray:
    """Thread key per CPU row, the backward thread folded into the forward thread (HTA's remap)."""
    pid, tid = rows.pid[cpu].astype(np.int64), rows.tid[cpu].astype(np.int64)
    key = pid * (rows.n_symbols + 1) + tid
    cats = rows.names(("cpu_op", "user_annotation"))
    typed = symbol_mask(rows.cat[window], cats, rows.n_symbols)  # per row of the window
    if not hta:  # the 2021 spelling too
        role = rows.role[window]
        typed |= (role == OPERATOR_ROLE) | (role == ANNOTATION_ROLE)

    def only_thread(word: str) -> int | None:
        ids = rows.names_containing(word)
        hits = window[symbol_mask(rows.name[window], ids, rows.n_symbols) & typed]
        tids = set(rows.tid[hits].tolist())
        return tids.pop() if len(tids) == 1 else None

    forward, backward = only_thread("forward"), only_thread("autograd")
    if forward is not None and backward is not None and forward != backward:
        tid = np.where(tid == backward, forward, tid)
        key = pid * (rows.n_symbols + 1) + tid
    return key


def call_stack_edges(rows: Rows, cpu: IntArray, window: IntArray, graph: Graph, hta: bool, notes: list[str],
                     blocking: set[int], deferring: set[int], deferred: list[tuple[int, int, int]]) -> None:
    """Every CPU thread's nesting walk (``cpu``: the window's host rows); then, default mode, the
    hand-offs between threads."""
    if not len(cpu):
        return
    thread = _thread_of(rows, cpu, window, hta)
    lock_names = rows.names(RUNTIME_LOCK_CALLS)
    ts_all, end_all = rows.ts, rows.end
    tops: dict[int, tuple[IntArray, IntArray]] = {}
    gaps: dict[int, tuple[IntArray, IntArray, IntArray]] = {}
    for key in unique_ints(thread).tolist():
        members = cpu[thread == key]
        # HTA's order: by start; at one start the longer first; then file order
        order = np.lexsort((members, -(end_all[members] - ts_all[members]), ts_all[members]))
        members = members[order]
        flags = _Flags(symbol_mask(rows.name[members], lock_names, rows.n_symbols), _member_of(members, blocking),
                       _member_of(members, deferring))
        found = _walk_nested(graph, members, ts_all[members], end_all[members], flags, hta, deferred, notes)
        if found is None:  # an event outlives its parent: the walk in Python, which cuts it
            found = _walk(graph, members, ts_all[members].tolist(), end_all[members].tolist(), flags, hta, notes,
                          deferred)
        tops[key], gaps[key] = found
    if not hta:
        _hand_offs(rows, graph, tops, gaps)


class _Flags(NamedTuple):
    """Per member of a thread's walk: a runtime-lock call, a blocking call (its own edge weighs 0 in
    HTA), a call whose own edge is deferred (default mode: drawn last, as a wait)."""

    lock: np.ndarray
    blocking: np.ndarray
    deferring: np.ndarray


def _member_of(members: IntArray, chosen: set[int]) -> np.ndarray:
    return int_isin(members, np.fromiter(chosen, dtype=np.int64, count=len(chosen)))


def _nesting(ts: np.ndarray, end: np.ndarray) -> tuple[IntArray, IntArray, IntArray] | None:
    """Each member's depth and parent (member index, -1 at the top), and the members by depth
    (stable), when the members, sorted by start, nest within ``end``: the events open when member
    ``i`` starts are the earlier ones that end after its start (every one lasts: a later one ends
    after it too), so its depth is ``i`` less the ends at or before its start, and its parent is
    the latest earlier member one level up. None when that reading fails (it cannot when they nest)."""
    m = len(ts)
    index = np.arange(m, dtype=np.int64)
    depth = index - np.searchsorted(np.sort(end), ts, side="right")
    # by depth, then by index (a stable sort of 16-bit keys is a radix sort: the usual case)
    small = m > 0 and -(2 ** 15) <= depth.min() and depth.max() < 2 ** 15
    by_depth = np.argsort(depth.astype(np.int16 if small else np.int32), kind="stable")
    key = (depth * m + index)[by_depth]  # ascending
    j = np.searchsorted(key, key - m) - 1  # the latest member one level up (sorted needles: fast)
    nested = depth[by_depth] > 0
    above = by_depth[np.maximum(j, 0)]
    if (nested & ((j < 0) | (depth[above] != depth[by_depth] - 1))).any():
        return None
    parent = np.empty(m, dtype=np.int64)
    parent[by_depth] = np.where(nested, above, -1)
    return depth, parent, by_depth


def _cut_ends(end: np.ndarray, depth: IntArray, parent: IntArray, by_depth: IntArray) -> np.ndarray:
    """Each member's end cut at its parent's (cut) end, level by level from the top."""
    cut: np.ndarray = end.copy()
    levels = np.searchsorted(depth[by_depth], np.arange(1, int(depth.max()) + 1 if len(depth) else 1))
    for lo, hi in zip(levels.tolist(), [*levels[1:].tolist(), len(depth)]):
        level = by_depth[lo:hi]
        cut[level] = np.minimum(end[level], cut[parent[level]])
    return cut


#: Rounds of cutting ends before the walk goes event by event (:func:`_walk`).
_CUT_ROUNDS = 64


def _walk_nested(graph: Graph, members: IntArray, ts: np.ndarray, end: np.ndarray, flags: _Flags, hta: bool,
                 deferred: list[tuple[int, int, int]],
                 notes: list[str]) -> tuple[tuple[IntArray, IntArray], tuple[IntArray, IntArray, IntArray]] | None:
    """One thread's nesting walk as array passes (None: go event by event, :func:`_walk`).

    The walk cuts an event that outlives its parent at the parent's end: the cut ends are found as
    a fixed point (nesting read from the ends, ends cut at the parents', until nothing changes;
    once every earlier end is right, a member's parent and its cut end are, so the fixed point is
    the walk's). The walk's visits are then each member's enter, and each member's leave at the
    first later start at or after its (cut) end (the innermost first; at the end of the walk when
    none). Consecutive visits of events with nodes make the walk's edges. Returns the thread's
    top-level operators (start, end nodes) and its gaps between them (source, destination, edge
    number), as :func:`_walk` does."""
    m = len(members)
    index = np.arange(m, dtype=np.int64)
    cut = end
    for _ in range(_CUT_ROUNDS):
        found = _nesting(ts, cut)
        if found is None:
            return None
        depth, parent, by_depth = found
        again = _cut_ends(end, depth, parent, by_depth)
        if np.array_equal(again, cut):
            break
        cut = again
    else:
        return None
    clipped = cut < end
    if clipped.any():
        notes.append("a CPU event outlives its parent (an out-of-order stack): it is cut at the parent's end")
        if not hta:
            moved = clipped & (graph.end_of(members) >= 0)
            graph.set_ts_many(graph.end_of(members[moved]), cut[moved])
    end = cut
    # the visits in walk order: (time key, enter after leave, the inner leave first)
    by_end = np.argsort(end)
    leave_at = np.empty(m, dtype=np.int64)
    leave_at[by_end] = np.searchsorted(ts, end[by_end], side="left")  # sorted needles: fast
    # one key: enters and leaves never share a time key; leaves at one differ in depth
    levels = int(depth.max()) + 1 if m else 1
    when = np.concatenate([(2 * index + 1) * levels, 2 * leave_at * levels + (levels - 1 - depth)])
    visits = np.argsort(when)
    member = np.where(visits < m, visits, visits - m)
    enters = visits < m
    start_node, end_node = graph.start_of(members), graph.end_of(members)
    has_node = start_node[member] >= 0  # an event has both nodes or neither
    member, enters = member[has_node], enters[has_node]
    node = np.where(enters, start_node[member], end_node[member])
    # depth counted over the events with nodes: 0 for a top-level operator
    with_node = start_node >= 0
    before = np.concatenate(([0], np.cumsum(with_node)))[:-1]
    node_depth = before - np.searchsorted(np.sort(end[with_node]), ts, side="right")
    top_enter = enters & (node_depth[member] == 0)
    tops = (start_node[member[top_enter]], end_node[member[top_enter]])
    if len(node) < 2:
        empty = np.zeros(0, dtype=np.int64)
        return tops, (empty, empty, empty)
    src, dst = node[:-1], node[1:]
    src_member, dst_member = member[:-1], member[1:]
    src_enters, dst_enters = enters[:-1], enters[1:]
    # named as in HTA's walk: consecutive runtime-lock calls are joined by the lock pass instead
    both_lock_calls = flags.lock[src_member] & flags.lock[dst_member]
    shares_lock = both_lock_calls & (src_enters | ~dst_enters)
    enter_top_level = dst_enters & (node_depth[dst_member] == 0)
    leaf_deferred = ~shares_lock & ~dst_enters & flags.deferring[dst_member] & src_enters & (src_member == dst_member)
    drawn = ~shares_lock & ~leaf_deferred
    # HTA's attribution: from a start, the source's event; to an end, the destination's; from an
    # end to a start, the source's parent
    parent_pos = np.where(parent >= 0, members[np.maximum(parent, 0)], -1)
    event = np.where(src_enters, members[src_member], np.where(~dst_enters, members[dst_member], parent_pos[src_member]))
    between_ops = enter_top_level & (not hta)
    event = np.where(between_ops, BETWEEN_OPS, event)
    kind = np.where(enter_top_level & hta, CODE[DEPENDENCY], CODE[OPERATOR])
    zero = ~dst_enters & flags.blocking[dst_member]
    numbers = graph.add_many(src[drawn], dst[drawn], kind[drawn], zero=zero[drawn], event=event[drawn])
    deferred.extend(zip(src[leaf_deferred].tolist(), dst[leaf_deferred].tolist(),
                        members[dst_member[leaf_deferred]].tolist()))
    gap = between_ops[drawn]
    return tops, (src[drawn][gap], dst[drawn][gap], numbers[gap])


def _hand_offs(rows: Rows, graph: Graph, tops: dict[int, tuple[IntArray, IntArray]],
               gaps: dict[int, tuple[IntArray, IntArray, IntArray]]) -> None:
    """A thread's gap between two top-level operators during which other threads of its process ran
    operators (the main thread inside ``loss.backward()`` while the autograd thread works) is not
    that thread's Python: the path may go through the other threads' operators instead (edges to
    the first one starting in the gap and from the last one ending in it), and the gap itself
    weighs only the time no other thread ran an operator."""
    if len(tops) < 2:
        return
    node_ts = graph.ts
    first_nodes = np.concatenate([a for a, _ in tops.values()])
    last_nodes = np.concatenate([b for _, b in tops.values()])
    owner = np.concatenate([np.full(len(a), key, dtype=np.int64) for key, (a, _) in tops.items()])
    order = np.lexsort((owner, last_nodes, first_nodes, node_ts[last_nodes], node_ts[first_nodes]))
    first_nodes, last_nodes, keys = first_nodes[order], last_nodes[order], owner[order]
    starts, ends = node_ts[first_nodes], node_ts[last_nodes]
    pids = rows.pid[graph.pos[first_nodes]]
    lighter: list[tuple[int, float]] = []  # (gap edge, the other threads' busy time in it)
    for key, (us, vs, numbers) in gaps.items():
        if not len(us):
            continue
        # the gaps in which another thread of the process starts a top-level operator, found at once
        # (most gaps have none): the other threads' operators counted by prefix sums
        t0s, t1s = node_ts[us], node_ts[vs]
        pid = rows.pid[graph.pos[us[0]]]
        others = np.concatenate(([0], np.cumsum((keys != key) & (pids == pid))))
        lo_all, hi_all = np.searchsorted(starts, t0s, side="left"), np.searchsorted(starts, t1s, side="right")
        candidates = np.flatnonzero((t1s > t0s) & (others[hi_all] > others[lo_all]))
        for i in candidates.tolist():
            u, v, t1, lo, hi = int(us[i]), int(vs[i]), float(t1s[i]), int(lo_all[i]), int(hi_all[i])
            inside = np.arange(lo, hi)
            inside = inside[(keys[inside] != key) & (pids[inside] == pid) & (ends[inside] <= t1)]
            if not len(inside):
                continue
            busy = intervals.total(*intervals.merge(starts[inside], ends[inside]))
            lighter.append((int(numbers[i]), busy))
            first = int(first_nodes[int(inside[np.argmin(starts[inside])])])
            last = int(last_nodes[int(inside[np.argmax(ends[inside])])])
            graph.add(u, first, OPERATOR, event=BETWEEN_OPS)
            graph.add(last, v, OPERATOR, event=BETWEEN_OPS)
    weight = graph.columns()[3]
    for number, busy in lighter:
        weight[number] = max(float(weight[number]) - busy, 0.0)


def _walk(graph: Graph, members: IntArray, starts: list[float], ends: list[float], flags: _Flags, hta: bool, notes: list[str],
          deferred: list[tuple[int, int, int]]) -> tuple[tuple[IntArray, IntArray], tuple[IntArray, IntArray, IntArray]]:
    """One thread's nesting walk (HTA's depth-first enter/exit over its call stack), event by event:
    for a thread where an event outlives its parent (it is cut at the parent's end)."""
    stack: list[tuple[int, float]] = []  # (member, effective end)
    last_node = -1
    last_parent = -1
    depth = 0  # open events that have nodes
    tops: list[tuple[int, int]] = []
    gaps: list[tuple[int, int, int]] = []
    positions = members.tolist()
    start_of, end_of = graph.start_of(members).tolist(), graph.end_of(members).tolist()
    lock, blocking, deferring = flags.lock.tolist(), flags.blocking.tolist(), flags.deferring.tolist()
    node_start = graph.node_start

    def shares_lock(a: int, b: int, i: int, j: int) -> bool:
        return lock[i] and lock[j] and (node_start[a] or not node_start[b])

    last_member = -1

    def leave(i: int, parent: int) -> None:
        nonlocal last_node, last_parent, depth, last_member
        end_node = end_of[i]
        if end_node < 0:
            return
        if last_node >= 0 and not shares_lock(last_node, end_node, last_member, i):
            if deferring[i] and last_node == start_of[i]:
                deferred.append((last_node, end_node, positions[i]))  # a leaf blocking call: drawn last, as a wait
            else:
                graph.add(last_node, end_node, OPERATOR, zero=blocking[i],
                          event=_case_event(graph, last_node, end_node, last_parent))
        last_node, last_parent, last_member = end_node, parent, i
        depth -= 1

    for i, (ts, end) in enumerate(zip(starts, ends)):
        while stack and stack[-1][1] <= ts:  # at one time an end comes before a start
            done, _ = stack.pop()
            leave(done, positions[stack[-1][0]] if stack else -1)
        parent = positions[stack[-1][0]] if stack else -1
        if stack and end > stack[-1][1]:
            notes.append("a CPU event outlives its parent (an out-of-order stack): it is cut at the parent's end")
            end = stack[-1][1]
            if end_of[i] >= 0 and not hta:
                graph.set_ts(end_of[i], end)
        start_node = start_of[i]
        if start_node >= 0:
            if last_node >= 0 and not shares_lock(last_node, start_node, last_member, i):
                top_level = depth == 0
                kind = DEPENDENCY if top_level else OPERATOR
                if top_level and not hta:
                    number = graph.add(last_node, start_node, OPERATOR, event=BETWEEN_OPS)  # see DIFFERENCES
                    gaps.append((last_node, start_node, number))
                else:
                    graph.add(last_node, start_node, kind, event=_case_event(graph, last_node, start_node, last_parent))
            if depth == 0 and end_of[i] >= 0:
                tops.append((start_node, end_of[i]))
            last_node, last_parent, last_member = start_node, parent, i
            depth += 1
        stack.append((i, end))
    while stack:
        done, _ = stack.pop()
        leave(done, positions[stack[-1][0]] if stack else -1)
    top = np.array(tops, dtype=np.int64).reshape(-1, 2)
    gap = np.array(gaps, dtype=np.int64).reshape(-1, 3)
    return (top[:, 0], top[:, 1]), (gap[:, 0], gap[:, 1], gap[:, 2])


def _case_event(graph: Graph, u: int, v: int, parent: int) -> int:
    """HTA's attribution of an operator edge: a start -> the source's event; end -> end: the
    destination's; end -> start: the source's parent."""
    if graph.node_start[u]:
        return graph.node_pos[u]
    if not graph.node_start[v]:
        return graph.node_pos[v]
    return parent
