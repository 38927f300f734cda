"""Vectorised interval arithmetic on ``[start, end)`` arrays (µs).

All functions take and return numpy arrays; merged interval lists are sorted and disjoint.
``merge`` unions overlapping or touching intervals (touching intervals merge, which changes no
length). ``intersect`` and ``subtract`` take two merged lists. ``sweep_labels`` measures, for k
merged lists, how long each combination (bit mask) of lists is active at once.
"""

from __future__ import annotations

import numpy as np

from stepscope.traces.events import positions_where, row_chunks
from stepscope.traces.links import unique_ints


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals -> sorted disjoint ``(starts, ends)``."""
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    return _merge_sorted(_by_start([np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)]))


def _by_start(columns: list[np.ndarray]) -> list[np.ndarray]:
    """``[starts, ends]`` sorted by start (stable), the list emptied and each given column let go
    as soon as its sorted copy exists (where the caller holds no other reference)."""
    starts, ends = columns
    columns.clear()
    order = np.argsort(starts, kind="stable")
    by_start = [starts[order]]
    del starts
    by_start.append(ends[order])
    return by_start


def _merge_sorted(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge` of intervals sorted by start, given as ``[starts, ends]``: the list is
    emptied and its arrays reused or dropped as soon as they are read (the caller holds no other
    reference), so no more than two columns of the rows are alive at once. The running maximum of
    the ends replaces them in place: at a group's last row it is the group's end (every earlier
    group ended before this one began)."""
    s, e = columns
    columns.clear()
    np.maximum.accumulate(e, out=e)
    # a new group starts where the start is beyond every earlier end
    new_group = np.empty(len(s), dtype=bool)
    new_group[0] = True
    np.greater(s[1:], e[:-1], out=new_group[1:])
    out_s = s[new_group]
    del s
    last = positions_where(new_group)
    del new_group
    last[:-1] = last[1:] - 1
    last[-1] = len(e) - 1
    return out_s, e[last]


#: Rows merged at a time by :func:`merge_rows`.
MERGE_CHUNK = 1 << 20


def merge_rows(ts: np.ndarray, dur: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge` of the intervals ``[ts, ts + dur)`` of ``rows``. Rows that nest (host operators)
    are merged a chunk at a time: the union of the chunks' unions is the union, and the sort's
    temporaries are then a chunk's, not a whole column's. Rows that barely overlap (runtime calls,
    kernels) would not shrink by chunks, and are merged at once: the first chunk tells which."""
    def merged(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not len(part):
            return np.zeros(0), np.zeros(0)
        start = np.asarray(ts[part], dtype=np.float64)
        order = np.argsort(start, kind="stable")
        s = start[order]
        del start
        rows = part[order]
        del order
        e = np.asarray(ts[rows], dtype=np.float64)  # the ends as ts + dur, computed in sorted order
        for chunk in row_chunks(len(rows)):
            e[chunk] += dur[rows[chunk]]
        del rows
        sorted_by_start = [s, e]
        del s, e
        return _merge_sorted(sorted_by_start)

    if len(rows) <= MERGE_CHUNK:
        return merged(rows)
    chunks = np.array_split(rows, -(-len(rows) // MERGE_CHUNK))
    first = merged(chunks[0])
    if len(first[0]) * 2 > len(chunks[0]):
        del first, chunks
        return merged(rows)
    parts = [first, *(merged(part) for part in chunks[1:])]
    del first, chunks
    # the chunks' unions merged: each column built and the parts let go before the next is made
    unions = [np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])]
    del parts
    return _merge_sorted(_by_start(unions))


def total(starts: np.ndarray, ends: np.ndarray) -> float:
    return float(np.sum(ends - starts)) if len(starts) else 0.0


#: Overlapping pairs of intervals cut at a time by :func:`intersect`.
PAIR_CHUNK = 1 << 20


def intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two merged lists (result merged). The overlapping pairs are cut a run of
    ``a``'s intervals at a time, about :data:`PAIR_CHUNK` pairs each (an interval of ``a`` that
    overlaps more is cut against its slice of ``b`` directly): the pieces come out in the same
    order, and their index columns are never the whole result's length."""
    a_s, a_e = a
    b_s, b_e = b
    if len(a_s) == 0 or len(b_s) == 0:
        return np.zeros(0), np.zeros(0)
    # for each a interval, candidate b intervals are those with b_e > a_s and b_s < a_e
    lo = np.searchsorted(b_e, a_s, side="right")
    hi = np.searchsorted(b_s, a_e, side="left")
    counts = np.maximum(hi - lo, 0)
    del hi
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0), np.zeros(0)
    if total <= PAIR_CHUNK:
        return _pairs(a_s, a_e, b_s, b_e, lo, counts)
    ends = np.cumsum(counts)
    out_s: list[np.ndarray] = []
    out_e: list[np.ndarray] = []
    i = 0
    while i < len(a_s):
        j = max(int(np.searchsorted(ends, ends[i] - counts[i] + PAIR_CHUNK, side="right")), i + 1)
        if j == i + 1 and counts[i] > PAIR_CHUNK:  # one interval against many: its slice of b, clipped
            first = int(lo[i])
            s = np.maximum(b_s[first : first + counts[i]], a_s[i])
            e = np.minimum(b_e[first : first + counts[i]], a_e[i])
            keep = e > s
            s, e = s[keep], e[keep]
        else:
            s, e = _pairs(a_s[i:j], a_e[i:j], b_s, b_e, lo[i:j], counts[i:j])
        out_s.append(s)
        out_e.append(e)
        i = j
    return np.concatenate(out_s), np.concatenate(out_e)


def _pairs(a_s: np.ndarray, a_e: np.ndarray, b_s: np.ndarray, b_e: np.ndarray, lo: np.ndarray,
           counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each ``a`` interval cut by its ``counts`` candidates of ``b`` from ``lo`` on, empty pieces dropped."""
    a_idx = np.repeat(np.arange(len(a_s)), counts)
    offsets = np.arange(len(a_idx)) - np.repeat(np.cumsum(counts) - counts, counts)
    b_idx = np.repeat(lo, counts) + offsets
    del offsets
    s = np.maximum(a_s[a_idx], b_s[b_idx])
    e = np.minimum(a_e[a_idx], b_e[b_idx])
    keep = e > s
    return s[keep], e[keep]


def subtract(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``a`` minus ``b`` for merged lists."""
    a_s, a_e = a
    if len(a_s) == 0:
        return a
    b_s, b_e = b
    if len(b_s) == 0:
        return a
    # complement of b within [min, max] then intersect
    lo = min(a_s[0], b_s[0]) - 1.0
    hi = max(a_e[-1], b_e[-1]) + 1.0
    comp_s = np.concatenate(([lo], b_e))
    comp_e = np.concatenate((b_s, [hi]))
    keep = comp_e > comp_s
    return intersect(a, (comp_s[keep], comp_e[keep]))


def totals_within(merged: tuple[np.ndarray, np.ndarray], starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Length of a merged list inside each window ``[starts[i], ends[i]]`` (one pass, no clipping)."""
    m_s, m_e = merged
    if len(m_s) == 0:
        return np.zeros(len(starts))
    cum = np.concatenate(([0.0], np.cumsum(m_e - m_s)))

    def upto(t: np.ndarray) -> np.ndarray:  # measure of merged ∩ (-inf, t]
        k = np.searchsorted(m_s, t, side="right")
        over = np.where(k > 0, np.maximum(m_e[np.maximum(k - 1, 0)] - t, 0.0), 0.0)
        below: np.ndarray = cum[k] - over
        return below

    inside: np.ndarray = np.maximum(upto(np.asarray(ends, dtype=np.float64)) - upto(np.asarray(starts, dtype=np.float64)), 0.0)
    return inside


def clip(merged: tuple[np.ndarray, np.ndarray], start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
    return intersect(merged, (np.array([start], dtype=float), np.array([end], dtype=float)))


def sweep_labels(lists: list[tuple[np.ndarray, np.ndarray]]) -> dict[int, float]:
    """Time during which exactly the lists in bit mask ``m`` are active, for every ``m > 0``."""
    points, deltas = [], []
    for bit, (s, e) in enumerate(lists):
        points += [s, e]
        deltas += [np.full(len(s), 1 << bit, dtype=np.int64), np.full(len(e), -(1 << bit), dtype=np.int64)]
    if not points:
        return {}
    t = np.concatenate(points)
    d = np.concatenate(deltas)
    order = np.lexsort((d, t))  # at equal times, ends (negative) first
    t, d = t[order], d[order]
    mask = np.cumsum(d)
    span = np.diff(t)
    active = mask[:-1]
    out: dict[int, float] = {}
    for value in unique_ints(active).tolist():
        if value > 0:
            out[int(value)] = float(span[active == value].sum())
    return out


def quantiles(values: np.ndarray, qs: list[float]) -> np.ndarray:
    """``np.quantile(values, qs)`` (linear method, same interpolation formula) without its
    internal ``np.unique``, whose lazy ``numpy.ma`` import costs tens of ms per process."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    position = np.asarray(qs, dtype=np.float64) * (len(ordered) - 1)
    below = np.floor(position).astype(np.int64)
    above = np.minimum(below + 1, len(ordered) - 1)
    gamma = position - below
    low, high = ordered[below], ordered[above]
    diff = high - low
    return np.where(gamma >= 0.5, high - diff * (1 - gamma), low + diff * gamma)


def median(values: np.ndarray) -> float:
    """``np.median`` of a non-empty array (the mean of the two middle values for an even count),
    without the lazy ``numpy.ma`` import."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    half = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[half])
    return float(np.mean(ordered[half - 1 : half + 1]))
