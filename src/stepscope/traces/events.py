"""Columnar event storage: :class:`EventTable`, :class:`MemoryTable`, :class:`SymbolTable`.

Contract: a trace becomes a handful of numpy arrays (one row per complete event, ``ph == "X"``
or any event with a numeric ``dur``), plus a small table of ``[memory]`` instants. Strings
(names, categories, pids/tids, input shapes, call stacks) are interned once in a
:class:`SymbolTable` and stored as ``int32`` ids; ``-1`` means "absent". No per-event dict
survives :class:`TableBuilder.add_batch`: clean batches of complete events are converted one
column at a time (:mod:`~stepscope.traces.fastpath`); a batch with anything unusual goes through
the per-event loop below, which applies the validation rules one event at a time.

Per-event validation (a damaged event is skipped and counted, never fatal): the event must be
an object; ``ts``/``dur`` must be finite numbers with ``dur >= 0`` and ``|ts| <`` 10^17 µs
(year 5138: anything later is a corrupt timestamp, e.g. a bogus ``Record Window End``); ``name``
and ``cat`` must be strings. Metadata (``M``), flow (``s``/``f``) and counter (``C``) events are
counted but not stored: no analysis here reads them.

Integer args (``External id``, ``correlation``, ``stream``, ``device``) are coerced like HTA does:
numeric strings become ints, anything else (or a value beyond ±2^62) becomes -1. 2021 traces spell
``external id`` in lower case; both spellings are read. The two args of CUDA event synchronisation
(``wait_on_stream``, ``wait_on_cuda_event_record_corr_id``, on ``Event Sync`` and ``Stream Wait
Event`` rows) are kept sparsely: :attr:`EventTable.wait_rows` lists the rows that carry either.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import eq
from typing import Any

import numpy as np
import orjson

from stepscope.heap import trim
from stepscope.traces import typed
from stepscope.traces.spill import ColumnSink

from stepscope.traces.fastpath import (
    complete_columns,
    dims_symbol,
    sort_typed_rest,
    split_complete,
    typed_complete_columns,
    typed_memory_columns,
)

FAR_TS_US = 1e17
#: How often (in rows) a builder asks whether its columns go to disk, and then writes them there.
FLUSH_ROWS = 1 << 20
_BIG = 1 << 62
_IGNORED_PHASES = frozenset(("M", "s", "f", "t", "C"))
#: The sparse columns of CUDA-event waits: rows, then the two args.
WAIT_COLUMNS = ("wait_rows", "wait_on_stream", "wait_on_record")
# the builder's columns of symbol ids (by their names in :meth:`TableBuilder.buffers`); -1: absent
SYMBOL_COLUMNS = frozenset(("name", "cat", "pid", "tid", "input_dims", "call_stack", "memory.tid"))


def symbol_mask(values: np.ndarray, ids: np.ndarray | list[int], n_symbols: int) -> np.ndarray:
    """``np.isin(values, ids)`` for symbol ids (``-1`` = absent never matches), by table lookup (no
    sort, and not ``np.isin``'s lazy import of ``numpy.ma``)."""
    table = np.zeros(n_symbols + 1, dtype=bool)  # values == -1 read the last slot
    if len(ids):
        table[np.asarray(ids, dtype=np.int64)] = True
        table[-1] = False
    mask: np.ndarray = table[values]
    return mask


class SymbolTable:
    """Interned strings; ``ids[s]`` is stable for the life of one trace."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.ids: dict[str, int] = {}

    def intern(self, text: str) -> int:
        found = self.ids.get(text)
        if found is None:
            found = len(self.strings)
            self.ids[text] = found
            self.strings.append(text)
        return found

    def get(self, text: str) -> int:
        return self.ids.get(text, -2)

    def decode(self, ident: int) -> str:
        return self.strings[ident] if ident >= 0 else ""

    def ids_where(self, predicate: Callable[[str], bool]) -> np.ndarray:
        return np.array([i for i, s in enumerate(self.strings) if predicate(s)], dtype=np.int32)


@dataclass(frozen=True)
class EventTable:
    """Complete events, one row each, in file order. Times in µs as in the trace."""

    symbols: SymbolTable
    name: np.ndarray  # int32 symbol
    cat: np.ndarray  # int32 symbol, -1 = missing
    pid: np.ndarray  # int32 symbol of str(pid)
    tid: np.ndarray  # int32 symbol of str(tid)
    ts: np.ndarray  # float64 µs
    dur: np.ndarray  # float64 µs
    # the four id columns: int32 when every value of the trace fits, else int64; -1 when absent
    external_id: np.ndarray
    correlation: np.ndarray
    stream: np.ndarray  # -1: HTA's "not a GPU row"
    device: np.ndarray
    blocks_per_sm: np.ndarray  # float64, nan
    occupancy: np.ndarray  # float64 (percent, as Kineto writes it), nan
    input_dims: np.ndarray  # int32 symbol of the JSON text of "Input Dims", -1
    call_stack: np.ndarray  # int32 symbol, -1
    # sparse: the rows with a CUDA-event wait arg (ascending), and their two args (-1 = absent)
    wait_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    wait_on_stream: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    wait_on_record: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def end(self) -> np.ndarray:
        ends: np.ndarray = self.ts + self.dur
        return ends

    def end_at(self, rows: np.ndarray) -> np.ndarray:
        """The end of each of ``rows`` (:attr:`end` at those rows, without the whole column)."""
        ends: np.ndarray = self.ts[rows] + self.dur[rows]
        return ends

    def cat_mask(self, *names: str) -> np.ndarray:
        ids = [self.symbols.get(n) for n in names]
        return symbol_mask(self.cat, [i for i in ids if i >= 0], len(self.symbols.strings))

    def name_mask(self, predicate: Callable[[str], bool]) -> np.ndarray:
        return symbol_mask(self.name, self.symbols.ids_where(predicate), len(self.symbols.strings))


@dataclass(frozen=True)
class MemoryTable:
    """``[memory]`` instants (allocator events), in file order."""

    ts: np.ndarray
    tid: np.ndarray  # int32 symbol
    device_type: np.ndarray  # int64: 0 CPU, 1 CUDA, ...
    device_id: np.ndarray  # int64
    addr: np.ndarray  # int64
    nbytes: np.ndarray  # float64 (negative = free)
    total_allocated: np.ndarray  # float64, nan
    total_reserved: np.ndarray  # float64, nan

    def __len__(self) -> int:
        return len(self.ts)


@dataclass
class SkipCounts:
    """Why events were not stored: reason -> count."""

    skipped: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)


def _to_int(value: Any) -> int:
    if type(value) is int:
        return value if -_BIG < value < _BIG else -1
    if type(value) is float:
        return int(value) if math.isfinite(value) and abs(value) < _BIG else -1
    if type(value) is str:
        try:
            number = int(value)
        except ValueError:
            return -1
        return number if -_BIG < number < _BIG else -1
    return -1


def _to_float(value: Any) -> float:
    t = type(value)
    if t is float or t is int:
        return float(value)
    return math.nan


class TableBuilder:
    """Accumulates batches of event dicts into typed arrays."""

    def __init__(self) -> None:
        self.symbols = SymbolTable()
        self.counts = SkipCounts()
        self._i32 = {k: array("i") for k in ("name", "cat", "pid", "tid", "input_dims", "call_stack")}
        self._f64 = {k: array("d") for k in ("ts", "dur", "blocks_per_sm", "occupancy")}
        self._i64 = {k: array("q") for k in ("external_id", "correlation", "stream", "device")}
        self._wait = {k: array("q") for k in WAIT_COLUMNS}
        self._mem_f = {k: array("d") for k in ("ts", "nbytes", "total_allocated", "total_reserved")}
        self._mem_i = {k: array("q") for k in ("device_type", "device_id", "addr")}
        self._mem_tid = array("i")
        self._scalar_ids: dict[tuple[type, Any], int] = {}
        self._dims_ids: dict[bytes, int] = {}
        self._scanner: Any = None  # the C scanner's caches of this table's symbols (add_scanned)
        # the event columns on disk (stepscope.traces.spill): where they go, how many rows went there
        self.sink: ColumnSink | None = None
        self.sink_decision: Callable[[int], ColumnSink | None] | None = None  # asked every FLUSH_ROWS rows
        self.flushed_rows = 0
        self._flushed_bytes = 0
        self._next_check = FLUSH_ROWS

    def rows(self) -> int:
        """The complete events added so far."""
        return self.flushed_rows + len(self._f64["ts"])

    def event_buffers(self) -> dict[str, array[Any]]:
        """The event columns' buffers (what :meth:`flush` writes), by name."""
        return {**self._i32, **self._f64, **self._i64}

    def maybe_flush(self) -> None:
        """Every :data:`FLUSH_ROWS` rows: ask :attr:`sink_decision` (once it says yes, from then on)
        whether the event columns go to disk, and if so write the buffered rows there."""
        if len(self._f64["ts"]) < self._next_check:
            return
        if self.sink is None and self.sink_decision is not None:
            self.sink = self.sink_decision(self.nbytes())
        if self.sink is None:
            self._next_check = len(self._f64["ts"]) + FLUSH_ROWS
            return
        self.flush()

    def add_flushed(self, rows: int, nbytes: int) -> None:
        """Count ``rows`` rows (``nbytes`` bytes of event columns) that were written to :attr:`sink`
        directly (a split decode's other parts)."""
        self.flushed_rows += rows
        self._flushed_bytes += nbytes

    def flush(self) -> None:
        """The buffered rows of every event column appended to :attr:`sink`'s files; buffers emptied.
        A write that fails (a full disk) brings the columns back into memory and drops the sink: the
        table is then built as without one."""
        sink = self.sink
        if sink is None:
            return
        groups = (self._i32, self._f64, self._i64)
        try:
            for group in groups:
                for key, buf in group.items():
                    sink.write(key, buf)
        except OSError:
            self.sink = None
            self.sink_decision = None
            for group in groups:
                for key, buf in group.items():
                    back: array[Any] = array(buf.typecode)
                    back.frombytes(sink.column(key, np.dtype(buf.typecode), self.flushed_rows).tobytes())
                    back.frombytes(buf.tobytes())
                    group[key] = back
            sink.close()
            self.flushed_rows = self._flushed_bytes = 0
            return
        count = len(self._f64["ts"])
        for group in groups:
            for key, buf in group.items():
                self._flushed_bytes += len(buf) * buf.itemsize
                group[key] = array(buf.typecode)
        self.flushed_rows += count
        self._next_check = FLUSH_ROWS

    def _scalar(self, value: Any) -> int:
        key = (type(value), value)
        found = self._scalar_ids.get(key)
        if found is None:
            found = self.symbols.intern(str(value))
            self._scalar_ids[key] = found
        return found

    def add_batch(self, events: list[Any]) -> None:
        """Add a batch: clean complete events column-wise, everything else one by one."""
        try:
            phases = list(map(dict.get, events, ["ph"] * len(events)))
        except TypeError:  # an item that is not an object: sort them out one by one
            phases = None
        if phases is None:
            complete = [e for e in events if type(e) is dict and e.get("ph") == "X"]
            rest = [e for e in events if not (type(e) is dict and e.get("ph") == "X")] if len(complete) < len(events) else []
        elif phases.count("X") == len(events):
            complete, rest = events, []
        else:
            complete = list(compress(events, map(eq, phases, repeat("X"))))
            # metadata, flow and counter events are only counted: no need to visit them one by one
            try:
                seen = Counter(phases)
            except TypeError:  # an unhashable "ph"
                seen = Counter(ph for ph in phases if type(ph) is str)
            ignored = {ph: count for ph, count in seen.items() if ph in _IGNORED_PHASES}
            self.counts.ignored.update(ignored)
            if len(complete) + sum(ignored.values()) < len(events):
                rest = [e for e, ph in zip(events, phases) if ph != "X" and not (type(ph) is str and ph in _IGNORED_PHASES)]
                rest = self._add_memory_instants(rest) if rest else rest
            else:
                rest = []
        columns = complete_columns(complete, self.symbols, self._scalar_ids, self._scalar) if complete else None
        if columns is None:
            self._add_events(complete + rest if complete else rest)
            return
        self._append_columns(columns)
        if rest:
            self._add_events(rest)

    def add_typed(self, events: list[Any]) -> bool:
        """Add a batch decoded by :mod:`stepscope.traces.typed`, or return False having added nothing
        when any event needs the careful path (the caller then decodes the batch into dicts for
        :meth:`add_batch`). Takes complete events, the ignored phases, instants and clean
        ``[memory]`` instants — the same rows, symbols and counts as :meth:`add_batch`."""
        complete, rest = split_complete(events)
        sorted_rest = sort_typed_rest(rest, _IGNORED_PHASES)
        if sorted_rest is None:
            return False
        memory, ignored, instants = sorted_rest
        for event in memory:  # add_batch interns the [memory] instants' threads before the complete events'
            self._scalar(event.tid)
        columns = typed_complete_columns(complete, self.symbols, self._scalar, self._dims_ids) if complete else {}
        if columns is None:
            return False
        self.counts.ignored.update(ignored)
        if instants:
            self.counts.ignored["instant"] += instants
        if memory:
            self._add_typed_memory(memory)
        self._append_columns(columns)
        return True

    def add_scanned(self, parsed: Any) -> bool:
        """Add a batch read by the C scanner (:func:`stepscope.traces.typed.decode_batch`), or return
        False having added nothing but symbols when :meth:`add_typed` would decline it (the caller
        then decodes the batch with msgspec): the same rows, symbols and counts as :meth:`add_typed`."""
        if self._scanner is None:
            symbols = self.symbols
            self._scanner = typed.SCAN.Scanner(symbols.ids, symbols.intern, self._scalar,
                                               lambda text_bytes: dims_symbol(text_bytes, symbols))
        done = self._scanner.columns(parsed)
        if done is None:
            return False
        columns, ignored, instants, memory = done
        self.counts.ignored.update(dict(ignored))
        if instants:
            self.counts.ignored["instant"] += instants
        if memory is not None:
            self._append_memory(memory)
        self._append_columns(columns)
        return True

    def _append_columns(self, columns: dict[str, np.ndarray] | dict[str, bytes]) -> None:
        """Columns (numpy arrays, or the C scanner's bytes) appended to the stores."""
        rows = columns.pop("wait_rows", None)
        if rows is not None:
            local = np.frombuffer(rows, dtype=np.int64) if isinstance(rows, bytes) else rows
            self._wait["wait_rows"].frombytes((local + self.rows()).tobytes())
            for key in WAIT_COLUMNS[1:]:
                self._wait[key].frombytes(_as_bytes(columns.pop(key)))
        for key, values in columns.items():
            store = self._i32[key] if key in self._i32 else self._f64[key] if key in self._f64 else self._i64[key]
            store.frombytes(_as_bytes(values))

    def _add_typed_memory(self, events: list[Any]) -> None:
        columns = typed_memory_columns(events, self._scalar)
        if columns is not None:
            self._append_memory(columns)
            return
        scalar = self._scalar
        self._mem_f["ts"].frombytes(np.array([e.ts for e in events], dtype=np.float64).tobytes())
        self._mem_tid.frombytes(np.array([scalar(e.tid) for e in events], dtype=np.int32).tobytes())
        args = [e.args for e in events]
        for key in ("device_type", "device_id", "addr"):
            self._mem_i[key].frombytes(np.array([_to_int(getattr(a, key)) for a in args], dtype=np.int64).tobytes())
        for key in ("nbytes", "total_allocated", "total_reserved"):
            self._mem_f[key].frombytes(np.array([_to_float(getattr(a, key)) for a in args], dtype=np.float64).tobytes())

    def _append_memory(self, columns: dict[str, bytes]) -> None:
        """The ``[memory]`` instants' columns (bytes, by :class:`MemoryTable` field) appended."""
        for key, values in columns.items():
            store = self._mem_tid if key == "tid" else self._mem_i[key] if key in self._mem_i else self._mem_f[key]
            store.frombytes(values)

    def _add_events(self, events: list[Any]) -> None:  # noqa: C901 - one tight loop on purpose
        skipped, ignored = self.counts.skipped, self.counts.ignored
        intern, scalar = self.symbols.intern, self._scalar
        a_name, a_cat, a_pid, a_tid = (self._i32[k].append for k in ("name", "cat", "pid", "tid"))
        a_dims, a_stack = self._i32["input_dims"].append, self._i32["call_stack"].append
        a_ts, a_dur, a_bps, a_occ = (self._f64[k].append for k in ("ts", "dur", "blocks_per_sm", "occupancy"))
        a_ext, a_corr, a_stream, a_dev = (self._i64[k].append for k in ("external_id", "correlation", "stream", "device"))
        nan, isfinite = math.nan, math.isfinite
        for event in events:
            if type(event) is not dict:
                skipped["not a JSON object"] += 1
                continue
            ph = event.get("ph")
            if ph in ("M", "s", "f", "t", "C"):
                ignored[ph] += 1
                continue
            ts: Any = event.get("ts")
            tt = type(ts)
            if (tt is not float and tt is not int) or abs(ts) >= FAR_TS_US or not isfinite(ts):
                skipped["missing or absurd 'ts'"] += 1
                continue
            name = event.get("name")
            if type(name) is not str:
                skipped["missing or non-string 'name'"] += 1
                continue
            pid, tid = event.get("pid"), event.get("tid")
            if type(pid) in (dict, list) or type(tid) in (dict, list):
                skipped["non-scalar 'pid'/'tid'"] += 1
                continue
            args = event.get("args")
            if type(args) is not dict:
                args = {}
            dur: Any = event.get("dur")
            if dur is None and ph in ("i", "I"):
                if name == "[memory]":
                    self._add_memory(ts, scalar(tid), args)
                else:
                    ignored["instant"] += 1
                continue
            dt = type(dur)
            if (dt is not float and dt is not int) or abs(dur) >= FAR_TS_US or not isfinite(dur):
                skipped["missing, non-numeric or absurd 'dur'"] += 1
                continue
            if dur < 0:
                skipped["negative 'dur'"] += 1
                continue
            cat = event.get("cat")
            if cat is not None and type(cat) is not str:
                skipped["non-string 'cat'"] += 1
                continue
            a_name(intern(name))
            a_cat(intern(cat) if cat is not None else -1)
            a_pid(scalar(pid))
            a_tid(scalar(tid))
            a_ts(ts)
            a_dur(dur)
            if args:
                ext = args.get("External id")
                if ext is None:
                    ext = args.get("external id")
                a_ext(_to_int(ext) if ext is not None else -1)
                value = args.get("correlation")
                a_corr(_to_int(value) if value is not None else -1)
                value = args.get("stream")
                a_stream(_to_int(value) if value is not None else -1)
                value = args.get("device")
                a_dev(_to_int(value) if value is not None else -1)
                value = args.get("blocks per SM")
                a_bps(_to_float(value) if value is not None else nan)
                value = args.get("est. achieved occupancy %")
                a_occ(_to_float(value) if value is not None else nan)
                value = args.get("Input Dims")
                a_dims(intern(orjson.dumps(value).decode()) if value is not None else -1)
                value = args.get("Call stack")
                a_stack(intern(value) if type(value) is str else -1)
                wait_stream, wait_record = args.get("wait_on_stream"), args.get("wait_on_cuda_event_record_corr_id")
                if wait_stream is not None or wait_record is not None:
                    self._wait["wait_rows"].append(self.rows() - 1)
                    self._wait["wait_on_stream"].append(_to_int(wait_stream) if wait_stream is not None else -1)
                    self._wait["wait_on_record"].append(_to_int(wait_record) if wait_record is not None else -1)
            else:
                a_ext(-1)
                a_corr(-1)
                a_stream(-1)
                a_dev(-1)
                a_bps(nan)
                a_occ(nan)
                a_dims(-1)
                a_stack(-1)

    def _add_memory_instants(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Store the batch's clean ``[memory]`` instants column-wise; return the other events.
        All-or-nothing: when any ``[memory]`` instant needs the careful path, none is taken here."""
        memory = [
            e for e in events if e.get("name") == "[memory]" and e.get("ph") in ("i", "I") and e.get("dur") is None
        ]
        if not memory:
            return events
        n = len(memory)
        ts = [e.get("ts") for e in memory]
        if not set(map(type, ts)) <= {int, float}:
            return events
        tids = [e.get("tid") for e in memory]
        pid_types = {type(e.get("pid")) for e in memory}
        if dict in pid_types or list in pid_types or not set(map(type, tids)).isdisjoint((dict, list)):
            return events
        ts_arr = np.array(ts, dtype=np.float64)
        if not np.isfinite(ts_arr).all() or (np.abs(ts_arr) >= FAR_TS_US).any():
            return events
        args = [a if type(a) is dict else {} for a in (e.get("args") for e in memory)]

        def ints(key: str) -> np.ndarray:
            values = list(map(dict.get, args, [key] * n))
            if set(map(type, values)) <= {int, type(None)}:
                try:
                    column = np.array([-1 if v is None else v for v in values], dtype=np.int64)
                    return np.where(np.abs(column) < _BIG, column, -1)
                except OverflowError:
                    pass
            return np.array([_to_int(v) for v in values], dtype=np.int64)

        def floats(key: str) -> np.ndarray:
            values = list(map(dict.get, args, [key] * n))
            if set(map(type, values)) <= {int, float, type(None)}:
                return np.array([math.nan if v is None else v for v in values], dtype=np.float64)
            return np.array([_to_float(v) for v in values], dtype=np.float64)

        scalar = self._scalar
        self._mem_f["ts"].frombytes(ts_arr.tobytes())
        self._mem_tid.frombytes(np.array([scalar(t) for t in tids], dtype=np.int32).tobytes())
        for key, arg in (("device_type", "Device Type"), ("device_id", "Device Id"), ("addr", "Addr")):
            self._mem_i[key].frombytes(ints(arg).tobytes())
        for key, arg in (("nbytes", "Bytes"), ("total_allocated", "Total Allocated"), ("total_reserved", "Total Reserved")):
            self._mem_f[key].frombytes(floats(arg).tobytes())
        taken = {id(e) for e in memory}
        return [e for e in events if id(e) not in taken]

    def _add_memory(self, ts: float, tid: int, args: dict[str, Any]) -> None:
        self._mem_f["ts"].append(ts)
        self._mem_tid.append(tid)
        self._mem_i["device_type"].append(_to_int(args.get("Device Type")))
        self._mem_i["device_id"].append(_to_int(args.get("Device Id")))
        self._mem_i["addr"].append(_to_int(args.get("Addr")))
        self._mem_f["nbytes"].append(_to_float(args.get("Bytes")))
        self._mem_f["total_allocated"].append(_to_float(args.get("Total Allocated")))
        self._mem_f["total_reserved"].append(_to_float(args.get("Total Reserved")))

    def buffers(self) -> dict[str, array[Any]]:
        """Every column's buffer by name (the ``[memory]`` instants' prefixed ``memory.``), in a fixed
        order: what :mod:`stepscope.traces.split_load` writes from a worker's builder and appends to
        the parent's."""
        out: dict[str, array[Any]] = {**self._i32, **self._f64, **self._i64, **self._wait}
        out.update({f"memory.{k}": v for k, v in self._mem_f.items()})
        out.update({f"memory.{k}": v for k, v in self._mem_i.items()})
        out["memory.tid"] = self._mem_tid
        return out

    def nbytes(self) -> int:
        """The bytes of the event columns built so far (what :meth:`build` may spill)."""
        return self._flushed_bytes + sum(len(buf) * buf.itemsize for buf in self.event_buffers().values())

    def build(self, spill: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[EventTable, MemoryTable]:
        """The tables, once: the builder's id columns are given up (narrowed, see :func:`narrowed`).
        ``spill`` (:class:`~stepscope.traces.spill.Spill`) moves each event column to a file mapping
        as it is built, and the builder gives up that column's buffer: the table is never held twice."""
        def column(group: dict[str, array[Any]], key: str, dtype: type[np.generic]) -> np.ndarray:
            values = _view(group[key], dtype)
            if spill is None:
                return values
            values = spill(values)
            group[key] = array(group[key].typecode)  # the buffer goes once its column is in the file,
            trim()  # and its pages back to the kernel, for the next column's file to reuse
            return values

        if self.sink is not None:
            return self._build_from_sink()
        cols = {k: column(self._i32, k, np.int32) for k in list(self._i32)}
        cols.update({k: column(self._f64, k, np.float64) for k in list(self._f64)})
        for key in list(self._i64):
            narrow = narrowed(_view(self._i64[key], np.int64))
            self._i64[key] = array("q")  # the wide buffer is freed once its narrowed copy exists
            cols[key] = narrow if spill is None else spill(narrow)
            del narrow
            if spill is not None:
                trim()
        return self._tables(cols)

    def _build_from_sink(self) -> tuple[EventTable, MemoryTable]:
        """The tables of a builder whose event columns went to disk: each column mapped from its file."""
        sink = self.sink
        assert sink is not None
        self.flush()
        count = self.flushed_rows
        cols = {k: sink.column(k, np.int32, count) for k in self._i32}
        cols.update({k: sink.column(k, np.float64, count) for k in self._f64})
        cols.update({k: sink.narrowed(k, count) for k in self._i64})
        sink.close()  # the mappings keep the data
        self.sink = None
        return self._tables(cols)

    def _tables(self, cols: dict[str, np.ndarray]) -> tuple[EventTable, MemoryTable]:
        cols.update({k: _view(v, np.int64) for k, v in self._wait.items()})
        table = EventTable(symbols=self.symbols, **cols)
        memory = MemoryTable(
            tid=_view(self._mem_tid, np.int32),
            **{k: _view(v, np.float64) for k, v in self._mem_f.items()},
            **{k: _view(v, np.int64) for k, v in self._mem_i.items()},
        )
        return table, memory


def _as_bytes(values: np.ndarray | bytes) -> bytes:
    return values if isinstance(values, bytes) else values.tobytes()


def _view(buf: array[Any], dtype: type[np.generic]) -> np.ndarray:
    """A read-only view on a builder's buffer: no copy at the peak of the load."""
    return np.frombuffer(buf, dtype=dtype) if len(buf) else np.zeros(0, dtype=dtype)


_INT32 = np.iinfo(np.int32)


def position_dtype(rows: int) -> np.dtype[Any]:
    """The type of positions in (and signed differences of) a table of ``rows`` rows: int32 below
    2**31 rows, as :func:`narrowed` would make them, built narrow instead of narrowed after."""
    return np.dtype(np.int32) if rows < _INT32.max else np.dtype(np.int64)


#: Rows handled at a time where a whole column of temporaries is not needed (:func:`row_chunks`).
CHUNK_ROWS = 1 << 20
#: Rows of a mask searched at a time by :func:`positions_where`.
_WHERE_CHUNK = 1 << 22


def row_chunks(n: int, size: int = CHUNK_ROWS) -> list[slice]:
    """``[0, n)`` as consecutive slices of ``size`` rows (the last one shorter), in order."""
    return [slice(lo, min(lo + size, n)) for lo in range(0, n, size)]


def positions_where(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` in :func:`position_dtype`, found a chunk of rows at a time: the
    same positions without a whole int64 column of them first."""
    kind = position_dtype(len(mask))
    if kind == np.int64 or len(mask) <= _WHERE_CHUNK:
        return np.flatnonzero(mask).astype(kind, copy=False)
    out = np.empty(int(np.count_nonzero(mask)), dtype=kind)
    at = 0
    for part in row_chunks(len(mask), _WHERE_CHUNK):
        found = np.flatnonzero(mask[part])
        found += part.start
        out[at : at + len(found)] = found
        at += len(found)
    return out


def narrowed(values: np.ndarray) -> np.ndarray:
    """An int64 column of ids or row positions as int32 when every value fits (ids, streams,
    devices and the positions of a table under 2**31 rows nearly always do): the same values in
    half the memory (4.8 M events: 19 MB a column instead of 38 MB). A column holding a wider
    value stays int64."""
    if not len(values) or values.dtype == np.int32:
        return values
    if int(values.min()) >= _INT32.min and int(values.max()) <= _INT32.max:
        return values.astype(np.int32)
    return values
