"""Host operator tree by time containment, per thread (the plugin's ``OpTreeBuilder`` rules).

Contract: :func:`build_op_tree` returns an :class:`OpTree` over the host rows the plugin puts in
its tree: operators (``cpu_op``), profiler steps, legacy ``Python`` events and the user
annotations of host collectives (``nccl:*``/``gloo:*``); other user annotations are not tree
nodes. Rules, per ``(pid, tid)``, rows ordered by start and longer first on ties:

- a row is a child of the innermost open row when it starts strictly before that row's end and
  ends no later; a row that starts inside but ends after it *overlaps* its would-be parent and is
  left out of the tree (``kept = False``; the plugin logs "ranges on the same thread should not
  intersect" and drops it), which happens with float-ns timestamps;
- an operator whose only child is an operator of the same name (a redispatch, e.g.
  ``aten::div`` -> ``aten::div``) is folded: the child disappears (``alias`` maps it to the
  parent), its children move up, and the parent takes the child's runtime calls *instead of* its
  own (``runtime_dropped`` marks rows whose runtime calls no longer count), as the plugin does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepscope.traces.events import narrowed, position_dtype, positions_where
from stepscope.traces.links import ANNOTATION, GLOO_OPS, NCCL_OPS, OPERATOR, PYTHON, STEP, EventLinks, unique_ints
from stepscope.traces.spill import follow


@dataclass(frozen=True)
class OpTree:
    """The host operators nested by time into a tree (parents, folded rows), the operator views' common base."""

    rows: np.ndarray  # host rows, in (thread, start, -dur) order
    parent: np.ndarray  # position in ``rows`` of the parent, -1 for roots
    alias: np.ndarray  # position a row was folded into (itself when not folded)
    kept: np.ndarray  # bool: the row is in the tree (not dropped for overlapping, not folded)
    runtime_dropped: np.ndarray  # bool: this row's own runtime calls are discarded by a fold


def build_op_tree(links: EventLinks) -> OpTree:
    events, role = links.events, links.role
    comm = links.names_where(lambda s: s in NCCL_OPS or s in GLOO_OPS)
    node = (role == OPERATOR) | (role == STEP) | (role == PYTHON)
    if len(comm):
        node |= (role == ANNOTATION) & links.name_in(comm)
    index = position_dtype(len(role))  # positions as int32 below 2**31 rows: half the temporaries
    rows = positions_where(node)
    del node
    n = len(rows)
    ts = events.ts[rows]
    end = ts + events.dur[rows]
    pid, tid = events.pid[rows], events.tid[rows]
    np.negative(end, out=end)  # longer first on ties: the negated end as a key, without a copy (negation is exact)
    order = np.lexsort((end, ts, tid, pid)).astype(index, copy=False)
    np.negative(end, out=end)
    # each column put in order on its own, the unordered one released before the next
    rows = rows[order]
    ts = ts[order]
    end = end[order]
    # one thread's rows are contiguous: a thread starts where the pid or the tid changes
    pid = pid[order]
    changed = pid[1:] != pid[:-1]
    del pid
    tid = tid[order]
    changed |= tid[1:] != tid[:-1]
    del tid, order
    bounds = (np.flatnonzero(changed) + 1).tolist()
    del changed
    parent = np.full(n, -1, dtype=index)
    placed = np.zeros(n, dtype=bool)
    pieces = [piece for lo, hi in zip([0, *bounds], [*bounds, n]) for piece in _at_roots(ts, end, lo, hi)]
    for lo, hi in pieces:  # a thread's rows, cut where nothing is open: each piece nests on its own
        nested, walk = _nested_parents(ts[lo:hi], end[lo:hi])
        parent[lo:hi] = nested
        del nested
        thread = parent[lo:hi]
        thread[thread >= 0] += lo  # in the tree's own type: a thread's positions may be narrower
        placed[lo:hi] = True
        for first, last in walk:  # stretches where rows overlap: the walk itself decides
            placed[lo + first : lo + last] = False
            parent[lo + first : lo + last] = -1
            _stack_parents(ts[lo + first : lo + last].tolist(), end[lo + first : lo + last].tolist(), lo + first, parent, placed)
    del ts, end
    alias, dropped = _fold_same_name(events.name[rows], role[rows] == OPERATOR, parent, placed)
    kept = placed & (alias == np.arange(n, dtype=index))
    spill = follow(events.ts)  # read by every operator view: on disk where the table is
    return OpTree(spill(narrowed(rows)), spill(narrowed(parent)), spill(narrowed(alias)), spill(kept),
                  spill(dropped))  # int32 below 2**31 rows


#: Rows of one thread nested at a time by :func:`_nested_parents` (cut where no row is open).
NEST_CHUNK = 1 << 20


def _at_roots(ts: np.ndarray, end: np.ndarray, lo: int, hi: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` (one thread's rows, sorted by start) cut into pieces of about
    :data:`NEST_CHUNK` rows, each starting at a row that starts at or after the end of every row
    before it (nothing is open there: the nesting of the rows after it does not depend on the
    rows before). A thread without such a row stays whole."""
    if hi - lo <= NEST_CHUNK:
        return [(lo, hi)]
    cuts = [lo]
    latest = -np.inf  # the latest end so far
    for a in range(lo, hi, NEST_CHUNK):
        b = min(a + NEST_CHUNK, hi)
        running = np.maximum.accumulate(end[a:b])
        np.maximum(running, latest, out=running)
        before = np.empty(b - a)
        before[0] = latest
        before[1:] = running[:-1]
        roots = np.flatnonzero(ts[a:b] >= before) + a
        latest = float(running[-1])
        del running, before
        while True:  # the first root a chunk's length after the last cut
            at = int(np.searchsorted(roots, cuts[-1] + NEST_CHUNK))
            if at >= len(roots):
                break
            cuts.append(int(roots[at]))
    return list(zip(cuts, [*cuts[1:], hi]))


def _stack_parents(starts: list[float], ends: list[float], offset: int, parent: np.ndarray, placed: np.ndarray) -> None:
    """The plugin's stack walk over one thread's rows (sorted by start, longer first)."""
    stack: list[int] = []
    for pos in range(len(starts)):
        while stack and not starts[pos] < ends[stack[-1]]:
            stack.pop()
        if stack and ends[pos] > ends[stack[-1]]:
            continue  # overlaps its would-be parent: left out, as the plugin does
        parent[pos + offset] = stack[-1] + offset if stack else -1
        placed[pos + offset] = True
        stack.append(pos)


def _nested_parents(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The stack walk's parents, vectorised, for one thread's rows (sorted by start, longer first),
    and the ``[first, last)`` stretches of rows where rows do not nest properly: there the walk
    must run (its stack is empty at the start of each stretch, so stretches are independent).

    Row ``q`` stays on the stack until the first row starting at or after its end: its "close"
    position ``c[q]``. The rows open at row ``r`` number ``r - #{q: c[q] <= r}`` (its depth), and
    with proper nesting its parent is the last row before it one level up."""
    n = len(starts)
    if n == 0:
        return np.zeros(0, dtype=np.int64), []
    index = position_dtype(n + 1)
    position = np.arange(n, dtype=index)
    close = np.searchsorted(starts, ends, side="left").astype(index)
    np.maximum(close, position + 1, out=close)
    depth = position - np.searchsorted(np.sort(close), position, side="right").astype(index)
    order = np.argsort(depth, kind="stable").astype(index)  # by depth, then position
    keys = depth[order].astype(np.int64)  # depth * (n + 1) + position needs 64 bits
    keys *= n + 1
    keys += position[order]
    want = depth.astype(np.int64)
    want -= 1
    want *= n + 1
    want += position
    at = np.searchsorted(keys, want, side="left")
    del keys, want
    at -= 1
    found = order[np.maximum(at, 0)]
    del order
    inner = depth > 0
    par = np.where(inner & (at >= 0), found, -1).astype(index, copy=False)
    del at, found
    p = np.maximum(par, 0)
    good = par >= 0
    good &= depth[p] == depth - 1
    good &= p < position
    good &= close[p] > position
    good &= close <= close[p]
    good &= ends <= ends[p]
    bad = inner & ~good
    if not bad.any():
        return par, []
    # stretches between rows where nothing is open (depth 0) that hold a bad row
    segment_start = np.flatnonzero(depth == 0)
    segment = np.searchsorted(segment_start, position, side="right") - 1
    bad_segments = unique_ints(segment[bad])
    stretches: list[tuple[int, int]] = []
    for seg in bad_segments.tolist():
        first = int(segment_start[seg])
        last = int(segment_start[seg + 1]) if seg + 1 < len(segment_start) else n
        if stretches and stretches[-1][1] == first:
            stretches[-1] = (stretches[-1][0], last)
        else:
            stretches.append((first, last))
    return par, stretches


def _fold_same_name(
    names: np.ndarray, is_op: np.ndarray, parent: np.ndarray, placed: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised fold: an edge parent->child folds when the parent has exactly one placed child,
    both are operators and the names match. Edges are independent (folding a child into its parent
    gives the parent the child's children, whose own fold test is the child's), so each folded row
    maps to the top of its chain, and every row with a folding edge below it loses its runtimes."""
    n = len(parent)
    names_a = np.asarray(names)
    op = np.asarray(is_op, dtype=bool)
    child = np.flatnonzero(placed & (parent >= 0)).astype(parent.dtype, copy=False)
    par = parent[child]
    counts = np.zeros(n, dtype=np.int32)  # placed children of each row (int32: a tree of int32 positions)
    np.add.at(counts, par, 1)
    folds = (counts[par] == 1) & op[par] & op[child] & (names_a[par] == names_a[child]) & placed[par]
    folded_child, folded_parent = child[folds], par[folds]
    up = np.arange(n, dtype=parent.dtype)
    up[folded_child] = folded_parent
    while True:  # pointer jumping to the top of each fold chain
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    dropped = np.zeros(n, dtype=bool)
    dropped[folded_parent] = True
    # children of folded rows now hang from the chain's top
    has_parent = parent >= 0
    parent[has_parent] = up[parent[has_parent]]
    return up, dropped
