"""The plugin's Operator view: per operator name (optionally per input shape).

For each host operator (``cpu_op``) instance, from :mod:`~stepscope.analysis.trace.op_tree`:

- **host total** = its duration; **host self** = duration - direct children's durations - its own
  runtime calls (runtime rows sharing its ``External id``);
- **device self** = kernels, memcpys and memsets launched by its own runtime calls (the
  correlation link of the linked-events table, :mod:`stepscope.traces.links`); **device total** =
  device self of the operator and all its descendants (summed level by level, deepest first).

Grouped by name (and the JSON text of ``Input Dims`` with ``group_by_shape``), sorted by device
self time, then host self time. ``call_stack`` is the most frequent recorded ``Call stack`` of the group (legacy
traces); newer traces record stacks as ``python_function`` events, and then it is the innermost
:data:`MAX_FRAMES` Python frames enclosing the group's first call, innermost first, ";"-joined.
``tc_eligible`` marks the operators the plugin lists as Tensor Core eligible (convolutions and
matrix products) and every operator with such a descendant (e.g. ``AddmmBackward0``), used for the
"enable AMP" finding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.analysis.trace.op_tree import OpTree
from stepscope.traces.events import position_dtype, positions_where, row_chunks
from stepscope.traces.links import KERNEL, MEMCPY, MEMSET, OPERATOR, PYFUNC, RUNTIME, EventLinks

TC_ELIGIBLE_OPS = frozenset(
    f"aten::{name}"
    for name in (
        "_convolution", "_convolution_nogroup", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d", "convolution", "cudnn_convolution", "cudnn_convolution_transpose",
        "prelu", "addmm", "addmv", "addr", "matmul", "mm", "mv", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
        "linalg_multi_dot", "_thnn_fused_gru_cell", "_thnn_fused_lstm_cell", "gru_cell", "lstm_cell", "rnn_relu_cell",
        "rnn_tanh_cell", "cudnn_convolution_backward_input", "cudnn_convolution_backward_weight",
    )
)


@dataclass(frozen=True)
class OperatorRow:
    """One operator (by name, optionally by input shape): its calls and host and device time, self and total."""

    name: str
    input_shape: str | None
    calls: int
    host_self_us: float
    host_total_us: float
    device_self_us: float
    device_total_us: float
    tc_eligible: bool
    call_stack: str | None


@dataclass(frozen=True)
class OperatorTable:
    """Every operator of the trace (by name, or by name and input shape), largest device self time first."""

    rows: tuple[OperatorRow, ...]
    grouped_by_shape: bool

    def to_dict(self, limit: int | None = None) -> dict[str, Any]:
        rows = self.rows if limit is None else self.rows[:limit]
        return {"grouped_by_shape": self.grouped_by_shape, "count": len(self.rows), "rows": [asdict(r) for r in rows]}


MAX_FRAMES = 8


def _python_stacks(links: EventLinks, op_rows: np.ndarray) -> dict[int, str]:
    """Innermost-first ``python_function`` frames enclosing each given op (same thread), ";"-joined."""
    events = links.events
    frames = links.rows(PYFUNC)
    f_tid, f_ts = events.tid[frames], events.ts[frames]
    f_end = f_ts + events.dur[frames]
    out: dict[int, str] = {}
    for row in op_rows.tolist():
        start, end = events.ts[row], events.ts[row] + events.dur[row]
        inside = np.flatnonzero((f_tid == events.tid[row]) & (f_ts <= start) & (f_end >= end))
        if len(inside):
            inner = inside[np.argsort(-f_ts[inside], kind="stable")][:MAX_FRAMES]
            out[row] = ";".join(events.symbols.strings[events.name[frames[i]]] for i in inner)
    return out


def _levels(parent: np.ndarray, kept: np.ndarray) -> list[np.ndarray]:
    """Kept non-root tree positions grouped by depth, deepest first (children before parents)."""
    nodes = np.flatnonzero(kept & (parent >= 0)).astype(parent.dtype, copy=False)
    if not len(nodes):
        return []
    depth = np.zeros(len(parent), dtype=np.int32)
    linked, current = nodes, parent[nodes]
    while len(current):
        depth[linked] += 1
        more = parent[current] >= 0
        linked, current = linked[more], parent[current[more]]
    del linked, current
    order = nodes[np.argsort(-depth[nodes], kind="stable")]
    cuts = np.flatnonzero(np.diff(depth[order])) + 1
    return np.split(order, cuts)


def _most_frequent(groups: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Per group, its most frequent value >= 0 (the smallest on ties), -1 when it has none."""
    out = np.full(size, -1, dtype=np.int64)
    valid = values >= 0
    if not valid.any():
        return out
    pairs = groups[valid].astype(np.int64) * (1 << 32) + values[valid].astype(np.int64)
    keys, counts = np.unique(pairs, return_counts=True)
    group, value = keys >> 32, keys & ((1 << 32) - 1)
    order = np.lexsort((value, -counts, group))
    first = np.ones(len(order), dtype=bool)
    first[1:] = group[order][1:] != group[order][:-1]
    out[group[order][first]] = value[order][first]
    return out


def _groups(names: np.ndarray, shapes: np.ndarray | None, n_symbols: int) -> tuple[np.ndarray, int]:
    """Each operator's group and the number of groups, in ascending (name, shape) order: by name
    alone, a table of the symbols present (no sort); by name and input shape, the distinct pairs."""
    if shapes is None and (not len(names) or int(names.min()) >= 0):
        present = np.zeros(n_symbols, dtype=bool)
        present[names] = True
        group = np.cumsum(present, dtype=position_dtype(len(names)))
        group -= 1
        return group[names], int(present.sum())
    keys = names.astype(np.int64) * (1 << 31) + (1 + (shapes if shapes is not None else -1))
    uniq, inverse = np.unique(keys, return_inverse=True)
    return inverse.reshape(-1), len(uniq)


def _sum_by(keys: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    return np.bincount(keys, weights=values, minlength=size) if len(keys) else np.zeros(size)


def _runtime_owners(links: EventLinks, tree: OpTree) -> tuple[np.ndarray, np.ndarray]:
    """(tree position of the operator that owns each runtime call, the runtime call rows): the
    first placed node with the call's external id, as the plugin pops them."""
    events, rows, alias = links.events, tree.rows, tree.alias
    # the candidates: placed nodes (folded or kept) with an external id, a chunk of nodes at a time
    valid = np.empty(len(rows), dtype=bool)
    for part in row_chunks(len(rows)):
        found = alias[part] != np.arange(part.start, part.stop, dtype=alias.dtype)
        found |= tree.kept[part]
        found &= events.external_id[rows[part]] > 0
        valid[part] = found
    cand = positions_where(valid)
    del valid
    order = np.argsort(events.external_id[rows[cand]], kind="stable")
    ext_sorted_idx = cand[order]
    del cand, order
    ext_sorted = events.external_id[rows[ext_sorted_idx]]
    of_rows = links.rows(RUNTIME)
    if not len(ext_sorted) or not len(of_rows):
        return np.zeros(0, np.int64), of_rows[:0]
    owners, calls = [], []
    for part in row_chunks(len(of_rows)):  # the runtime calls a chunk at a time
        ids = events.external_id[of_rows[part]]
        pos = np.clip(np.searchsorted(ext_sorted, ids), 0, len(ext_sorted) - 1)
        src = ext_sorted_idx[pos]
        ok = (ext_sorted[pos] == ids) & (ids > 0) & ~tree.runtime_dropped[src]
        owners.append(alias[src[ok]])
        calls.append(of_rows[part][ok])
    return np.concatenate(owners), np.concatenate(calls)


def _device_self(links: EventLinks, rt_owner: np.ndarray, rt_rows: np.ndarray, size: int) -> np.ndarray:
    """Per tree position, the device time of the kernels, copies and sets its runtime calls
    launched (the table's link from a device row to its launch). ``rt_rows`` is sorted."""
    device = links.rows(KERNEL, MEMCPY, MEMSET)
    launcher = links.launcher[device]
    at = np.minimum(np.searchsorted(rt_rows, launcher), max(len(rt_rows) - 1, 0))
    ok = (launcher >= 0) & (rt_rows[at] == launcher) if len(rt_rows) else np.zeros(len(device), dtype=bool)
    return _sum_by(rt_owner[at[ok]], links.events.dur[device[ok]], size)


def operator_table(links: EventLinks, tree: OpTree, group_by_shape: bool = False) -> OperatorTable:
    events, role, symbols = links.events, links.role, links.events.symbols
    rows, parent, alias, kept = tree.rows, tree.parent, tree.alias, tree.kept
    n = len(rows)
    if n == 0:
        return OperatorTable((), group_by_shape)
    # the operators are grouped first; then each per-node column (~21 MB a column on a trace of
    # millions of operators) is summed by group and released before the next is built: their sum
    # was the peak of a big trace's analysis
    levels = _levels(parent, kept)  # deepest first: children before their parents
    # Tensor Core eligibility propagates from eligible descendants to operator ancestors (plugin rule)
    eligible_names = links.names_where(lambda s: s in TC_ELIGIBLE_OPS)
    eligible = links.name_in(eligible_names, rows)
    is_op = role[rows] == OPERATOR
    for level in levels:
        up = parent[level[eligible[level]]]
        eligible[up[is_op[up]]] = True
    excluded = links.names_where(
        lambda s: (s.startswith("enumerate(DataLoader)#") and s.endswith(".__next__"))
        or s.startswith("Optimizer.")
        or s in ("DataParallel.forward", "DistributedDataParallel.forward")
    )
    is_op &= ~links.name_in(excluded, rows)
    op_pos = np.flatnonzero(is_op & kept).astype(rows.dtype, copy=False)
    del is_op
    names = events.name[rows[op_pos]]
    shapes = events.input_dims[rows[op_pos]] if group_by_shape else None
    stacks = events.call_stack[rows[op_pos]]
    op_eligible = eligible[op_pos]
    del eligible
    inverse, g = _groups(names, shapes, len(symbols.strings))
    calls = np.bincount(inverse, minlength=g)

    # sums by chunks of rows: ``np.add.at`` over them in order adds each value in the order
    # ``np.bincount`` does (the same sums, bit for bit) without a whole column gathered first
    def by_group(values: np.ndarray) -> np.ndarray:
        out = np.zeros(g)
        for part in row_chunks(len(op_pos)):
            np.add.at(out, inverse[part], values[op_pos[part]])
        return out

    agg: dict[str, np.ndarray] = {}
    children = np.zeros(n)  # the summed durations of each node's children
    for part in row_chunks(n):
        has_parent = parent[part] >= 0
        has_parent &= kept[part]
        np.add.at(children, parent[part][has_parent], events.dur[rows[part][has_parent]])
    dur = events.dur[rows]
    host_self = np.subtract(dur, children, out=children)  # its own time less its children's, in place
    agg["ht"] = by_group(dur)
    del dur
    rt_owner, rt_rows = _runtime_owners(links, tree)
    host_self -= _sum_by(rt_owner, events.dur[rt_rows], n)
    agg["hs"] = by_group(host_self)
    del host_self
    device = _device_self(links, rt_owner, rt_rows, n)
    del rt_owner, rt_rows
    agg["ds"] = by_group(device)
    for level in levels:  # the device time of each node's subtree, children first
        np.add.at(device, parent[level], device[level])
    agg["dt"] = by_group(device)
    del device, levels
    first = np.zeros(g, dtype=inverse.dtype)
    first[inverse[::-1]] = np.arange(len(inverse), dtype=inverse.dtype)[::-1]  # each group's first operator
    first_rows = rows[op_pos[first]]
    python_frames = _python_stacks(links, first_rows) if len(links.rows(PYFUNC)) else None
    group_eligible = np.bincount(inverse, weights=op_eligible.astype(np.float64), minlength=g) > 0
    # one group a row, its columns as Python numbers (``tolist``: the values ``int``/``float`` give)
    columns = zip(
        names[first].tolist(), (shapes[first] if shapes is not None else np.full(g, -1)).tolist(),
        _most_frequent(inverse, stacks, g).tolist(), first_rows.tolist(), calls.tolist(),
        agg["hs"].tolist(), agg["ht"].tolist(), agg["ds"].tolist(), agg["dt"].tolist(), group_eligible.tolist(),
    )
    out = []
    for name, shape, stack_id, row, n, hs, ht, ds, dt, tc in columns:
        stack: str | None
        if stack_id >= 0:
            stack = symbols.strings[stack_id]
        else:
            stack = python_frames.get(row) if python_frames is not None else None
        out.append(OperatorRow(symbols.strings[name], symbols.decode(shape) if shape >= 0 else None,
                               n, hs, ht, ds, dt, tc, stack))
    out.sort(key=lambda r: (-r.device_self_us, -r.host_self_us, r.name))
    return OperatorTable(tuple(out), group_by_shape)
