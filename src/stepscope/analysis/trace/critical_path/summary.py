"""The summary of a rank's steps: bound totals, the top segments, the timeline spans of the
longest step, the device's idle time after syncs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from stepscope.analysis.trace.critical_path.analyse import analyse
from stepscope.analysis.trace.critical_path.rows import step_windows
from stepscope.analysis.trace.critical_path.model import (BETWEEN_OPS, BOUND_CODE, BOUND_KINDS, BOUND_LABELS, BOUNDS, CODE, COMM,
                                                          CPU, DATA_LOADING, GAP, GPU_COMPUTE, GPU_MEMORY, LAUNCH_OVERHEAD,
                                                          SYNC, SYNC_WAIT, CriticalPath, PathColumns, Segment)
from stepscope.analysis.trace.critical_path.rows import rows_of
from stepscope.traces import intervals
from stepscope.traces.events import EventTable
from stepscope.traces.links import int_isin


_WHY = {CPU: "CPU work on the path", DATA_LOADING: "waiting for data", LAUNCH_OVERHEAD: "launch to kernel start",
        GAP: "idle stream between kernels", GPU_COMPUTE: "kernel on the path", GPU_MEMORY: "copy on the path",
        COMM: "collective on the path", SYNC_WAIT: "the host blocked on the device"}


def segments(path: CriticalPath, events: EventTable, top: int = 10, steps: int = 1) -> list[Segment]:
    """The path's weighted edges grouped by the event they are attributed to (by name and stream),
    longest first (``steps``: how many steps ``path`` joins, for the time per step). A blocking
    call's wait counts as its parts: the device's work meanwhile, and the rest."""
    strings = events.symbols.strings
    c = path.path_columns()
    kept = np.flatnonzero((c.bound > 0) & (c.weight > 0))
    row = np.where(c.bound[kept] == BOUND_CODE[LAUNCH_OVERHEAD], c.dst[kept], c.event[kept])
    safe = np.maximum(row, 0)
    name_id = events.name[safe].astype(np.int64)
    stream = np.where(row >= 0, events.stream[safe], -1).astype(np.int64)
    waits = np.zeros(len(kept), dtype=bool)
    waits[np.searchsorted(kept, np.fromiter(c.parts, dtype=np.int64, count=len(c.parts)))] = True  # weighted: kept
    # names outside the symbol table get their own ids: "(between operators)", a wait's parts
    extra: dict[str, int] = {}

    def name_of(text: str) -> int:
        return extra.setdefault(text, len(strings) + len(extra))

    name_id = np.where(row >= 0, name_id, name_of("(between operators)"))
    plain = ~waits
    at, sub, names, streams, bounds, us = ([kept[plain]], [np.zeros(int(plain.sum()), dtype=np.int64)], [name_id[plain]],
                                           [stream[plain]], [c.bound[kept[plain]]], [c.weight[kept[plain]]])
    for i, edge_row, call_id in zip(kept[waits].tolist(), row[waits].tolist(), name_id[waits].tolist()):
        call = strings[call_id] if edge_row >= 0 else "a blocking call"
        for k, (part, part_us) in enumerate(c.parts[i]):
            text = call if part == SYNC_WAIT else f"(device busy while {call} waited)"
            at.append(np.array([i]))
            sub.append(np.array([k]))
            names.append(np.array([call_id if part == SYNC_WAIT and edge_row >= 0 else name_of(text)]))
            streams.append(np.array([-1]))
            bounds.append(np.array([BOUND_CODE[part]]))
            us.append(np.array([part_us]))
    order = np.lexsort((np.concatenate(sub), np.concatenate(at)))  # path order
    name_col, stream_col = np.concatenate(names)[order], np.concatenate(streams)[order]
    bound_col, us_col = np.concatenate(bounds)[order], np.concatenate(us).astype(np.float64)[order]
    if not len(us_col):
        return []
    # groups by (name, stream, bound); lexsort is stable, so a group's first row is its earliest
    order = np.lexsort((bound_col, stream_col, name_col))
    key = np.stack([name_col[order], stream_col[order], bound_col[order]], axis=1)
    new = np.concatenate(([True], (key[1:] != key[:-1]).any(axis=1)))
    groups, first = key[new], order[new]
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    totals = np.bincount(inverse, weights=us_col, minlength=len(groups))  # summed in path order
    counts = np.bincount(inverse, minlength=len(groups))
    by_first = np.argsort(first, kind="stable")  # first appearance, then the longest first (stable)
    ranked = by_first[np.argsort(-totals[by_first], kind="stable")][:top]
    text_of = {v: k for k, v in extra.items()}
    length = path.length_us
    out = []
    for g in ranked.tolist():
        name_code, group_stream, bound_code = groups[g].tolist()
        name = strings[name_code] if name_code < len(strings) else text_of[name_code]
        total, bound = float(totals[g]), BOUNDS[bound_code]
        out.append(Segment(name, group_stream, bound, _WHY[bound], total, int(counts[g]),
                           total / length if length > 0 else 0.0, total / steps))
    return out


@dataclass(frozen=True)
class StepPath:
    """One step's path, summarised."""

    label: str
    span_us: float  # the window (the step's duration)
    length_us: float
    bound_us: dict[str, float]
    syncs: tuple[str, ...]
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "span_us": self.span_us, "length_us": self.length_us,
                "bound_us": dict(self.bound_us), "syncs": list(self.syncs), "ok": self.ok}


class PathSpan(NamedTuple):
    """A stretch of one step's path on the timeline (µs as in the trace), for the HTML and Perfetto views."""

    name: str
    bound: str
    ts_us: float
    end_us: float
    pid: str
    tid: str  # the thread, or the stream's tid on a device
    stream: int


@dataclass(frozen=True)
class PathSummary:
    """The critical path of every step of one rank's trace (or of the whole trace without steps)."""

    steps: tuple[StepPath, ...]
    bound_us: dict[str, float]  # over all steps
    length_us: float
    span_us: float
    segments: tuple[Segment, ...]
    syncs: tuple[str, ...]
    shown_step: str  # the step drawn on the timeline (the longest path)
    spans: PathSpans  # the shown step's path on the timeline
    notes: tuple[str, ...] = ()
    after_sync_us: float = 0.0  # device idle while the path is on the host right after a sync

    #: every bound kind, in display order, and its label (renderers read them from here)
    KINDS = BOUND_KINDS
    LABELS = BOUND_LABELS
    #: a share below this is not shown (it would print as 0.0 %)
    SHOWN_FROM = 0.0005

    @staticmethod
    def label(kind: str) -> str:
        return BOUND_LABELS.get(kind, kind)

    def shown_shares(self) -> dict[str, float]:
        """The shares worth showing, in display order."""
        return {kind: share for kind in BOUND_KINDS if (share := self.share(kind)) >= self.SHOWN_FROM}

    @property
    def per_step_us(self) -> float:
        """Mean path length per step analysed."""
        return self.length_us / max(len(self.steps), 1)

    @property
    def span_per_step_us(self) -> float:
        """Mean duration of the steps analysed."""
        return self.span_us / max(len(self.steps), 1)

    @property
    def after_sync_share(self) -> float:
        return self.after_sync_us / self.length_us if self.length_us > 0 else 0.0

    def share(self, *kinds: str) -> float:
        if self.length_us <= 0:
            return 0.0
        return sum(self.bound_us.get(kind, 0.0) for kind in kinds) / self.length_us

    @property
    def coverage(self) -> float | None:
        """Path length over the steps' duration (below 1: the path skips time nothing on it explains)."""
        return self.length_us / self.span_us if self.span_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": "stepscope",
            "length_us": self.length_us, "span_us": self.span_us, "coverage": self.coverage,
            "bound_us": dict(self.bound_us),
            "bound_share": {kind: self.share(kind) for kind in BOUND_KINDS if kind in self.bound_us},
            "after_sync_us": self.after_sync_us,
            "segments": [{"name": s.name, "stream": s.stream, "bound": s.bound, "why": s.why, "us": s.us,
                          "count": s.count} for s in self.segments],
            "syncs": list(self.syncs), "shown_step": self.shown_step,
            "steps": [s.to_dict() for s in self.steps], "notes": list(self.notes),
        }


#: Steps whose critical path ``analyze`` computes by default: the one of median duration. The path
#: costs 15-70 ms of CPU per step of ~15,000 host events (BENCHMARKS.md); ``--path-steps`` asks for more.
DEFAULT_PATH_STEPS = 1


def chosen_steps(windows: list[tuple[str, float, float]], steps: int) -> list[tuple[str, float, float]]:
    """``steps`` of the windows, spread over their durations (one: the median; 0: all), in order."""
    if steps <= 0 or steps >= len(windows):
        return windows
    by_span = sorted(range(len(windows)), key=lambda i: (windows[i][2] - windows[i][1], i))
    picked = sorted({by_span[min(int((k + 0.5) * len(windows) / steps), len(windows) - 1)] for k in range(steps)})
    return [windows[i] for i in picked]


def path_summary(events: EventTable, rank: int = 0, top: int = 12, steps: int = 0) -> PathSummary | None:
    """The critical path of each ``ProfilerStep`` (default mode) — of ``steps`` of them chosen
    across their durations (:func:`chosen_steps`; 0: every step) — or of the whole trace when it
    has none; None without any GPU row or CPU operator to build a graph from."""
    windows = step_windows(events)
    notes: list[str] = []
    if 0 < steps < len(windows):
        picked = chosen_steps(windows, steps)
        which = "the one of median duration" if steps == 1 else "spread over their durations"
        notes.append(f"the critical path covers {len(picked)} of {len(windows)} steps ({which}: "
                     f"{', '.join(label for label, _, _ in picked)}); analyze --path-steps 0 covers every step")
        windows = picked
    rows = rows_of(events)
    if not len(rows.ts):
        return None
    if not windows:
        windows = [("whole trace", float(rows.ts.min()), float(rows.end.max()))]
    paths = [found for label, start, end in windows  # read as columns: no row per path edge
             if (found := analyse(rows, rank, label, start, end, False, None, as_rows=False)) is not None]
    paths = [p for p in paths if p.nodes > 0]
    if not paths:
        return None
    bound: dict[str, float] = defaultdict(float)
    for p in paths:
        for kind, us in p.bound_us.items():
            bound[kind] += us
        notes.extend(p.notes)
    merged = CriticalPath(rank, "all steps", paths[0].start_us, paths[-1].end_us, 0, 0, {}, sum(p.length_us for p in paths),
                          (), dict(bound), (), "stepscope",
                          columns=PathColumns.join([p.path_columns() for p in paths]))
    shown = max(paths, key=lambda p: p.length_us)
    busy = rows.busy
    return PathSummary(
        steps=tuple(StepPath(p.label, p.span_us, p.length_us, dict(p.bound_us), p.syncs, p.ok) for p in paths),
        bound_us=dict(bound), length_us=merged.length_us, span_us=sum(p.span_us for p in paths),
        segments=tuple(segments(merged, events, top, len(paths))), syncs=tuple(dict.fromkeys(s for p in paths for s in p.syncs)),
        shown_step=shown.label, spans=_spans(shown, events), notes=tuple(dict.fromkeys(notes)),
        after_sync_us=sum(_after_sync_us(p, busy) for p in paths))


def _after_sync_us(path: CriticalPath, busy: tuple[np.ndarray, np.ndarray]) -> float:
    """The device's idle time while the path is on the host right after a sync (until the path
    reaches the device again): what the sync cost, the device having drained its queue for it.
    The host's own time there is not counted when the device was busy meanwhile."""
    c = path.path_columns()
    if not len(c.kind):
        return 0.0
    index = np.arange(len(c.kind))
    is_sync = c.kind == CODE[SYNC]
    on_device = ~is_sync & int_isin(c.bound, np.array([BOUND_CODE[b] for b in (LAUNCH_OVERHEAD, GAP, GPU_COMPUTE, GPU_MEMORY, COMM)]))
    # armed: a sync since the path last reached the device (the latest of each before this edge)
    last_sync = np.maximum.accumulate(np.where(is_sync, index, -1))
    last_device = np.maximum.accumulate(np.where(on_device, index, -1))
    armed = np.concatenate(([False], last_sync[:-1] > last_device[:-1]))
    host = armed & ~is_sync & ~on_device & (c.bound == BOUND_CODE[CPU]) & (c.weight > 0)
    if not host.any():
        return 0.0
    merged = intervals.merge(c.src_us[host], c.dst_us[host])
    return intervals.total(*intervals.subtract(merged, busy))


def _spans(path: CriticalPath, events: EventTable) -> PathSpans:
    """The weighted edges of one path as timeline stretches: a kernel or CPU edge lies on its
    thread / stream; a launch edge on the kernel's stream (the wait before it starts)."""
    c = path.path_columns()
    kept = np.flatnonzero((c.bound > 0) & (c.weight > 0))
    src, dst, event, bound = c.src[kept], c.dst[kept], c.event[kept], c.bound[kept]
    on_stream = (bound == BOUND_CODE[LAUNCH_OVERHEAD]) | (bound == BOUND_CODE[GAP])
    where = np.where(on_stream, dst, np.where(event >= 0, event, src))
    # the strings the stretches name (their names, processes and threads), once each
    symbols = np.concatenate([events.name[np.where(event >= 0, event, where)], events.pid[where], events.tid[where]])
    strings = events.symbols.strings
    seen = np.zeros(len(strings), dtype=bool)
    seen[symbols] = True
    used = np.flatnonzero(seen)
    at = (np.cumsum(seen, dtype=np.int64) - 1)[symbols]  # each symbol's place among those used
    names = [*map(strings.__getitem__, used.tolist()), "(between operators)"]
    n = len(kept)
    name = np.where(event == BETWEEN_OPS, len(names) - 1, at[:n])
    return PathSpans(tuple(names), name, bound, c.src_us[kept], c.dst_us[kept], at[n:2 * n], at[2 * n:],
                     events.stream[where].astype(np.int64))


class PathSpans:
    """One step's path stretches as columns (``strings``, and per stretch the index of its name,
    process and thread in them; its bound code; its times; its stream): :class:`PathSpan` rows are
    made only when iterated. The HTML page and the Perfetto overlay draw them; the text and JSON
    outputs do not, and a long step's path holds ~80,000 of them (MTIA's: ~0.05 s of rows, and
    ~0.15 s more for the view's)."""

    __slots__ = ("strings", "name", "bound", "ts_us", "end_us", "pid", "tid", "stream")
    #: the bound kind of each code of ``bound``
    KINDS = BOUNDS

    def __init__(self, strings: tuple[str, ...], name: np.ndarray, bound: np.ndarray, ts_us: np.ndarray,
                 end_us: np.ndarray, pid: np.ndarray, tid: np.ndarray, stream: np.ndarray) -> None:
        self.strings, self.name, self.bound, self.ts_us, self.end_us = strings, name, bound, ts_us, end_us
        self.pid, self.tid, self.stream = pid, tid, stream

    def __len__(self) -> int:
        return len(self.name)

    def __iter__(self) -> Iterator[PathSpan]:
        text = self.strings.__getitem__
        return map(partial(tuple.__new__, PathSpan),
                   zip(map(text, self.name.tolist()), map(self.KINDS.__getitem__, self.bound.tolist()),
                       self.ts_us.tolist(), self.end_us.tolist(), map(text, self.pid.tolist()),
                       map(text, self.tid.tolist()), self.stream.tolist()))
