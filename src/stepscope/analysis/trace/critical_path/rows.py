"""The critical path's columns over HTA's kept rows of a trace (built once per trace), the
windows it analyses, and which rows of a window it reads."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

from stepscope.analysis.trace.critical_path.model import COMM, GPU_COMPUTE, GPU_MEMORY, SYNC_WAIT, IntArray
from stepscope.traces import intervals
from stepscope.traces.events import EventTable, position_dtype, positions_where
from stepscope.traces.links import COMMUNICATION, COMPUTATION, is_dataloader, last_match, links_of, symbol_mask
from stepscope.traces.spill import follow
from stepscope.traces.timeline import timeline_of


class Gathered:
    """A column of the event table at HTA's kept rows, read at positions (``column[index[pos]]``)
    without a copy of the whole column: the columns a window reads only at its own rows."""

    __slots__ = ("column", "index")

    def __init__(self, column: np.ndarray, index: IntArray):
        self.column, self.index = column, index

    def __getitem__(self, pos: IntArray | npt.NDArray[np.bool_] | int) -> np.ndarray:
        return self.column[self.index[pos]]

    def __len__(self) -> int:
        return len(self.index)


class Rows:
    """The window's columns over HTA's kept rows (positions index the kept rows)."""

    def __init__(self, events: EventTable):
        links = links_of(events)
        hta = links.hta
        # the columns kept for every window go to disk where the table did (a 26 M-row trace's
        # would otherwise hold ~500 MB of the process's own memory through the whole path)
        spill = follow(events.ts)
        self.links, self.events, self.index = links, events, hta.index
        self.ts, self.end = hta.ts, hta.end
        self.dur = spill(self.end - self.ts)
        rows = hta.index
        self.name = spill(events.name[rows])
        self.stream = spill(events.stream[rows])
        # read only at a window's rows: gathered from the table on use rather than kept as copies
        self.cat = Gathered(events.cat, rows)
        self.corr = Gathered(events.correlation, rows)
        self.pid = Gathered(events.pid, rows)
        self.tid = Gathered(events.tid, rows)
        self.role = Gathered(links.role, rows)
        self.ktype = hta.ktype
        symbols = events.symbols
        self.n_symbols = len(symbols.strings)
        self.strings = symbols.strings
        ids = symbols.ids
        self.sym = lambda text: ids.get(text, -2)
        self.ic = spill(self._index_correlation(events.correlation[rows]))
        wait_pos = np.searchsorted(rows, events.wait_rows)
        ok = np.zeros(len(wait_pos), dtype=bool)
        if len(rows):
            ok = rows[np.minimum(wait_pos, len(rows) - 1)] == events.wait_rows
        self.wait_stream = dict(zip(wait_pos[ok].tolist(), events.wait_on_stream[ok].tolist()))
        self.wait_record = dict(zip(wait_pos[ok].tolist(), events.wait_on_record[ok].tolist()))

    def _index_correlation(self, corr: IntArray) -> IntArray:
        """HTA's ``index_correlation`` (positions): -1 unlinked, a CPU row -> the last GPU row with its
        correlation, a GPU row (or Event/Context Sync) -> the last CPU row with it; -2 = correlated
        but the partner is not in the trace (HTA's 0). Positions as int32 below 2**31 rows."""
        ic = np.full(len(corr), -2, dtype=position_dtype(len(corr)))
        unlinked = corr == -1
        ic[unlinked] = -1
        linked = positions_where(~unlinked)
        del unlinked
        sync_names = [i for i in (self.sym("Event Sync"), self.sym("Context Sync")) if i >= 0]
        is_gpu = ((self.stream[linked] >= 0) & (corr[linked] >= 0)) | symbol_mask(self.name[linked], sync_names,
                                                                                   self.n_symbols)
        cpu, gpu = linked[~is_gpu], linked[is_gpu]
        del linked, is_gpu
        for side, other in ((cpu, gpu), (gpu, cpu)):
            partner = last_match(corr[other], other, corr[side])
            found = partner >= 0
            ic[side[found]] = partner[found]
        return ic

    def device_during(self, start: float, end: float) -> tuple[tuple[str, float], ...]:
        """What the device did while a host call blocked in [start, end]: time computing, in
        collectives, copying (in that precedence where they overlap), and the rest (``sync_wait``:
        the device idle, or busy elsewhere than the trace shows)."""
        busy = self._device_busy()
        out = []
        left = end - start
        for kind in (GPU_COMPUTE, COMM, GPU_MEMORY):
            starts, ends = busy[kind]
            lo, hi = int(ends.searchsorted(start, side="right")), int(starts.searchsorted(end, side="left"))
            us = float((np.minimum(ends[lo:hi], end) - np.maximum(starts[lo:hi], start)).sum()) if hi > lo else 0.0
            if us > 0:
                out.append((kind, us))
                left -= us
        if left > 0:
            out.append((SYNC_WAIT, left))
        return tuple(out)

    def _device_busy(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The rank's device timeline (:func:`~stepscope.traces.timeline.timeline_of`, the busy
        unions every trace view reads) split without overlap: compute, then collectives, then the
        rest of the busy time."""
        found: dict[str, tuple[np.ndarray, np.ndarray]] | None = self.__dict__.get("_busy")
        if found is None:
            timeline = timeline_of(self.links)
            empty = (np.zeros(0), np.zeros(0))
            if timeline is None:
                found = {GPU_COMPUTE: empty, COMM: empty, GPU_MEMORY: empty}
            else:
                compute = timeline.kinds[COMPUTATION]
                comm = intervals.subtract(timeline.kinds[COMMUNICATION], compute)
                taken = intervals.merge(np.concatenate([compute[0], comm[0]]), np.concatenate([compute[1], comm[1]]))
                found = {GPU_COMPUTE: compute, COMM: comm, GPU_MEMORY: intervals.subtract(timeline.busy, taken)}
            self.__dict__["_busy"] = found
        return found

    @property
    def busy(self) -> tuple[np.ndarray, np.ndarray]:
        """The union of the device's rows (the rank's device timeline)."""
        timeline = timeline_of(self.links)
        return timeline.busy if timeline is not None else (np.zeros(0), np.zeros(0))

    def names_where(self, predicate: Callable[[str], bool]) -> npt.NDArray[np.int32]:
        """Symbol ids of the event names (only names) satisfying ``predicate``."""
        return self.links.names_where(predicate)

    def names_matching(self, key: tuple[str, ...], predicate: Callable[[str], bool]) -> npt.NDArray[np.int32]:
        """:meth:`names_where`, kept under ``key`` (every step asks for the same names)."""
        memo: dict[tuple[str, ...], npt.NDArray[np.int32]] = self.__dict__.setdefault("_names", {})
        found = memo.get(key)
        if found is None:
            found = memo[key] = self.names_where(predicate)
        return found

    def names_containing(self, word: str) -> npt.NDArray[np.int32]:
        return self.names_matching(("in", word), lambda s: word in s)

    def names(self, names: Iterable[str]) -> npt.NDArray[np.int32]:
        return np.array([i for i in (self.sym(n) for n in names) if i >= 0], dtype=np.int32)

    def name_in(self, names: Iterable[str], pos: IntArray | None = None) -> npt.NDArray[np.bool_]:
        values = self.name if pos is None else self.name[pos]
        return symbol_mask(values, self.names(names), self.n_symbols)

    def decode(self, pos: int) -> str:
        return self.strings[int(self.name[pos])] if pos >= 0 else ""


def rows_of(events: EventTable) -> Rows:
    """The critical path's columns of ``events``, built on first use and kept with the table (every
    step and every call reads the same, with their per-trace caches)."""
    found: Rows | None = events.__dict__.get("_critical_rows")
    if found is None:
        found = events.__dict__["_critical_rows"] = Rows(events)
    return found


def step_windows(events: EventTable) -> list[tuple[str, float, float]]:
    """The ``ProfilerStep`` windows HTA would analyse, in order: the linked table's step rows that
    HTA keeps (with two steps or more it drops the last one's), with HTA's rounded times."""
    rows = rows_of(events)
    steps = rows.links.step_rows
    pos = np.minimum(np.searchsorted(rows.index, steps), max(len(rows.index) - 1, 0))
    pos = pos[rows.index[pos] == steps] if len(rows.index) else pos[:0]
    return [(rows.decode(int(p)), float(rows.ts[p]), float(rows.end[p])) for p in pos.tolist()]

def window_rows(rows: Rows, start: float, end: float, hta: bool = True) -> IntArray:
    """HTA's window: CPU rows starting in it with a duration; GPU rows whose launch did; and every
    ``Stream Wait Event`` row. HTA finds a GPU row from its launch's link, which names one row:
    in the default mode every GPU row whose own link names a launch in the window is kept (a
    CUDA graph's replay launches many)."""
    cpu = rows.stream == -1
    in_window = (rows.ts >= start) & (rows.ts <= end) & (rows.dur > 0)
    keep = cpu & in_window
    gpu = np.flatnonzero(~cpu)
    # the host rows whose index_correlation points at a GPU row (HTA joins the GPU row to them)
    launchers = np.flatnonzero(cpu & (rows.ic >= 0))
    targets = rows.ic[launchers]
    hit = np.zeros(len(rows.ts), dtype=bool)
    good = in_window[launchers]
    hit[targets[good]] = True
    keep[gpu[hit[gpu]]] = True
    if not hta:
        linked = gpu[rows.ic[gpu] >= 0]
        launcher = rows.ic[linked]
        keep[linked[(rows.stream[launcher] == -1) & in_window[launcher]]] = True
    keep[gpu[rows.name_in(("Stream Wait Event",), gpu)]] = True
    return np.flatnonzero(keep)


def data_loading_names(rows: Rows, hta: bool, patterns: tuple[str, ...] | None) -> npt.NDArray[np.int32]:
    if patterns is not None:
        compiled = [re.compile(p) for p in patterns]
        return rows.names_matching(("re", *patterns), lambda s: any(c.search(s) for c in compiled))
    if hta:
        return np.zeros(0, dtype=np.int32)
    return rows.names_matching(("dataloader",), is_dataloader)


def data_loading_ranges(rows: Rows, window: IntArray, hta: bool,
                         patterns: tuple[str, ...] | None) -> list[tuple[float, float, int, int]]:
    names = data_loading_names(rows, hta, patterns)
    if not len(names):
        return []
    pos = window[symbol_mask(rows.name[window], names, rows.n_symbols)]
    return [(float(rows.ts[p]), float(rows.end[p]), int(rows.pid[p]), int(rows.tid[p])) for p in pos.tolist()]
