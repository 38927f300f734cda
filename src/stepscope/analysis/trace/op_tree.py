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

from stepscope.traces.links import ANNOTATION, GLOO_OPS, NCCL_OPS, OPERATOR, PYTHON, STEP, EventLinks


@dataclass(frozen=True)
class OpTree:
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
    rows = np.flatnonzero(node)
    n = len(rows)
    ts, end = events.ts[rows], events.ts[rows] + events.dur[rows]
    order = np.lexsort((-end, ts, events.tid[rows], events.pid[rows]))
    rows, ts, end = rows[order], ts[order], end[order]
    thread = (events.pid[rows].astype(np.int64) << 32) + events.tid[rows]
    parent = np.full(n, -1, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    stack: list[int] = []
    starts, ends, threads = ts.tolist(), end.tolist(), thread.tolist()
    current = None
    for pos in range(n):
        if threads[pos] != current:
            stack.clear()
            current = threads[pos]
        while stack and not starts[pos] < ends[stack[-1]]:
            stack.pop()
        if stack and ends[pos] > ends[stack[-1]]:
            continue  # overlaps its would-be parent: left out, as the plugin does
        parent[pos] = stack[-1] if stack else -1
        placed[pos] = True
        stack.append(pos)
    del starts, ends, threads
    alias, dropped = _fold_same_name(events.name[rows], role[rows] == OPERATOR, parent, placed)
    kept = placed & (alias == np.arange(n))
    return OpTree(rows, parent, alias, kept, dropped)


def _fold_same_name(names: np.ndarray, is_op: np.ndarray, parent: np.ndarray, placed: np.ndarray):
    """Vectorised fold: an edge parent->child folds when the parent has exactly one placed child,
    both are operators and the names match. Edges are independent (folding a child into its parent
    gives the parent the child's children, whose own fold test is the child's), so each folded row
    maps to the top of its chain, and every row with a folding edge below it loses its runtimes."""
    n = len(parent)
    names_a = np.asarray(names, dtype=np.int64)
    op = np.asarray(is_op, dtype=bool)
    child = np.flatnonzero(placed & (parent >= 0))
    counts = np.bincount(parent[child], minlength=n) if len(child) else np.zeros(n, np.int64)
    par = parent[child]
    folds = (counts[par] == 1) & op[par] & op[child] & (names_a[par] == names_a[child]) & placed[par]
    folded_child, folded_parent = child[folds], par[folds]
    up = np.arange(n, dtype=np.int64)
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
