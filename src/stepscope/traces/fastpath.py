"""Column-at-a-time conversion of a batch of complete (``ph == "X"``) events.

Contract: :func:`complete_columns` turns a list of event dicts into the typed columns of
:class:`~stepscope.traces.events.EventTable`, or returns ``None`` when any event needs the careful
per-event path (a wrong type, a negative or absurd time, an integer beyond 2^62): the caller then
runs the per-event loop, which skips and counts the damaged events. It is all-or-nothing, so a
batch is never half-added.

Why: one list comprehension per field plus numpy conversion costs far less per event than one
Python loop iteration that appends a dozen values, and clean batches are the norm.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from stepscope.traces import typed
from stepscope.traces.native import usable

FAR_TS_US = 1e17
_NUM = {int, float}
_BIG = float(1 << 62)
_EMPTY: dict[str, Any] = {}


_TOP = itemgetter("name", "pid", "tid", "ts", "dur")
_TOP_ALL = itemgetter("name", "pid", "tid", "ts", "dur", "cat", "args")
_NONE = type(None)


def _ints(values: list[Any] | tuple[Any, ...]) -> np.ndarray | None:
    """Integer column (-1 for missing) when every value is an int or None and fits in ±2^62."""
    types = set(map(type, values))
    if not types <= {int, _NONE}:
        return None
    try:
        if _NONE in types:
            array = np.array([-1 if v is None else v for v in values], dtype=np.int64)
        else:
            array = np.array(values, dtype=np.int64)
    except OverflowError:
        return None
    if len(array) and np.abs(array).max() >= _BIG:
        return None
    return array


def _floats(values: list[Any] | tuple[Any, ...], missing_ok: bool = True) -> np.ndarray | None:
    types = set(map(type, values))
    if not types <= ({int, float, _NONE} if missing_ok else {int, float}):
        return None
    try:
        if _NONE in types:
            return np.array([math.nan if v is None else v for v in values], dtype=np.float64)
        return np.array(values, dtype=np.float64)
    except OverflowError:
        return None


def _symbols(values: list[str] | tuple[str, ...], symbols: Any) -> np.ndarray:
    """Symbol ids of strings (interned on first sight)."""
    found = list(map(symbols.ids.get, values))
    if None in found:
        intern = symbols.intern
        found = [f if f is not None else intern(v) for f, v in zip(found, values)]
    return np.array(found, dtype=np.int32)


def _scalars(values: tuple[Any, ...] | list[Any], scalar: Callable[[Any], int]) -> np.ndarray:
    """Symbol ids of pid/tid values (ints or strings: never equal to each other, so one dict)."""
    mapping = {value: scalar(value) for value in dict.fromkeys(values)}  # first-sight order
    return np.array(list(map(mapping.__getitem__, values)), dtype=np.int32)


def _times(ts_v: Any, dur_v: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``ts`` and ``dur`` columns, or None when a time is missing, not finite, negative or absurd."""
    ts = _floats(ts_v, missing_ok=False)
    dur = _floats(dur_v, missing_ok=False)
    if ts is None or dur is None:
        return None
    return (ts, dur) if _times_valid(ts, dur) else None


def _times_valid(ts: np.ndarray, dur: np.ndarray) -> bool:
    with np.errstate(invalid="ignore"):
        if not (np.isfinite(ts).all() and np.isfinite(dur).all()):
            return False
        return not ((np.abs(ts) >= FAR_TS_US).any() or (dur < 0).any() or (dur >= FAR_TS_US).any())


def _identity_columns(names: Any, cats: Any, pids: Any, tids: Any, symbols: Any,
                      scalar: Callable[[Any], int]) -> dict[str, np.ndarray]:
    """Symbol columns of names, categories (-1: none), pids and tids, interned in that order."""
    n = len(names)
    name_ids = _symbols(names, symbols)
    if None in cats:
        present = [c for c in cats if c is not None]
        cat_ids = np.full(n, -1, dtype=np.int32)
        if present:
            cat_ids[[i for i, c in enumerate(cats) if c is not None]] = _symbols(present, symbols)
    else:
        cat_ids = _symbols(cats, symbols)
    return {"name": name_ids, "cat": cat_ids, "pid": _scalars(pids, scalar), "tid": _scalars(tids, scalar)}


def _arg_columns(ext: list[Any], lower: list[Any], corr: list[Any], stream: list[Any], device: list[Any],
                 bps: list[Any], occ: list[Any]) -> dict[str, np.ndarray] | None:
    """The numeric args' columns (``External id``, else ``external id``), or None when a value
    needs the careful path."""
    n = len(ext)
    if lower.count(None) != n:
        ext = [v if v is not None else low for v, low in zip(ext, lower)]
    columns = {}
    for key, values in (("external_id", ext), ("correlation", corr), ("stream", stream), ("device", device)):
        converted = _ints(values)
        if converted is None:
            return None
        columns[key] = converted
    for key, values in (("blocks_per_sm", bps), ("occupancy", occ)):
        floats = _floats(values)
        if floats is None:
            return None
        columns[key] = floats
    return columns


def complete_columns(
    events: list[dict[str, Any]], symbols: Any, scalar_ids: dict[Any, int], scalar: Callable[[Any], int]
) -> dict[str, np.ndarray] | None:
    if not events:
        return None
    n = len(events)
    cats: list[Any] | tuple[Any, ...]
    args: list[Any] | tuple[Any, ...]
    try:  # one C-level pass over the events (each dict is visited once: they do not fit in cache)
        names, pids, tids, ts_v, dur_v, cats, args = zip(*map(_TOP_ALL, events))
    except KeyError:  # some event has no "cat" or no "args"
        try:
            names, pids, tids, ts_v, dur_v = zip(*map(_TOP, events))
        except KeyError:
            return None
        cats = list(map(dict.get, events, ["cat"] * n))
        args = list(map(dict.get, events, ["args"] * n))
    times = _times(ts_v, dur_v)
    if times is None:
        return None
    if set(map(type, names)) != {str}:
        return None
    if not set(map(type, cats)) <= {str, _NONE}:
        return None
    if not set(map(type, pids)) <= {int, str} or not set(map(type, tids)) <= {int, str}:
        return None
    arg_types = set(map(type, args))
    if not arg_types <= {dict, _NONE}:
        return None
    if _NONE in arg_types:
        args = [a if a is not None else _EMPTY for a in args]
    identity = _identity_columns(names, cats, pids, tids, symbols, scalar)

    def arg(key: str) -> list[Any]:
        return list(map(dict.get, args, [key] * n))

    numeric = _arg_columns(arg("External id"), arg("external id"), arg("correlation"), arg("stream"), arg("device"),
                           arg("blocks per SM"), arg("est. achieved occupancy %"))
    if numeric is None:
        return None
    dims_ids = np.full(n, -1, dtype=np.int32)
    stack_ids = np.full(n, -1, dtype=np.int32)
    dims = arg("Input Dims")
    if dims.count(None) != n:
        ids, intern = symbols.ids, symbols.intern
        for i, value in enumerate(dims):
            if value is not None:
                try:
                    text = orjson.dumps(value).decode()
                except TypeError:  # e.g. an integer beyond 64 bits
                    text = repr(value)
                found = ids.get(text)
                dims_ids[i] = found if found is not None else intern(text)
    stacks = arg("Call stack")
    if stacks.count(None) != n:
        for i, value in enumerate(stacks):
            if type(value) is str:
                stack_ids[i] = symbols.intern(value)
    waits = _wait_columns(arg("wait_on_stream"), arg("wait_on_cuda_event_record_corr_id"))
    if waits is None:
        return None
    return {**identity, "input_dims": dims_ids, "call_stack": stack_ids, "ts": times[0], "dur": times[1], **numeric,
            **waits}


def _wait_columns(streams: list[Any], records: list[Any]) -> dict[str, np.ndarray] | None:
    """The sparse CUDA-event wait columns of a batch (rows local to it); {} without any; None when
    a value needs the careful path."""
    n = len(streams)
    if streams.count(None) == n and records.count(None) == n:
        return {}
    rows = [i for i, (a, b) in enumerate(zip(streams, records)) if a is not None or b is not None]
    stream_ints = _ints([streams[i] for i in rows])
    record_ints = _ints([records[i] for i in rows])
    if stream_ints is None or record_ints is None:
        return None
    return {"wait_rows": np.array(rows, dtype=np.int64), "wait_on_stream": stream_ints, "wait_on_record": record_ints}


def typed_complete_columns(
    events: list[Any], symbols: Any, scalar: Callable[[Any], int], dims_cache: dict[bytes, int]
) -> dict[str, np.ndarray] | None:
    """:func:`complete_columns` for events decoded by :mod:`stepscope.traces.typed` (structs whose
    fields are already typed); None when any event needs the careful path. Same columns, same
    symbols: an ``Input Dims`` value is interned as orjson writes it, whatever the spacing of the
    file (``dims_cache`` maps the raw bytes seen to their symbol)."""
    if not events:
        return None
    if COLUMNS is not None:
        return _typed_columns_c(events, symbols, scalar, dims_cache)
    names = [e.name for e in events]
    pids = [e.pid for e in events]
    tids = [e.tid for e in events]
    if None in names or None in pids or None in tids:
        return None
    times = _times([e.ts for e in events], [e.dur for e in events])
    if times is None:
        return None
    n = len(events)
    identity = _identity_columns(names, [e.cat for e in events], pids, tids, symbols, scalar)
    args = [e.args for e in events]
    numeric = _arg_columns([a.ext for a in args], [a.ext_lower for a in args], [a.corr for a in args],
                           [a.stream for a in args], [a.device for a in args], [a.bps for a in args],
                           [a.occ for a in args])
    if numeric is None:
        return None
    dims_ids = _dims_ids([a.dims for a in args], symbols, dims_cache)
    if dims_ids is None:
        return None
    stack_ids = np.full(n, -1, dtype=np.int32)
    stacks = [a.stack for a in args]
    if stacks.count(None) != n:
        for i, value in enumerate(stacks):
            if value is not None:
                stack_ids[i] = symbols.intern(value)
    waits = _wait_columns([a.wait_stream for a in args], [a.wait_record for a in args])
    if waits is None:
        return None
    return {**identity, "input_dims": dims_ids, "call_stack": stack_ids, "ts": times[0], "dur": times[1], **numeric,
            **waits}


def _dims_ids(dims: list[Any], symbols: Any, dims_cache: dict[bytes, int]) -> np.ndarray | None:
    """Symbol ids of the batch's ``Input Dims`` (raw JSON values; -1: none), interned as orjson
    writes them; None when a value needs the careful path."""
    dims_ids = np.full(len(dims), -1, dtype=np.int32)
    if any(dims):  # an absent value is an empty Raw
        for i, raw in enumerate(dims):
            text_bytes = bytes(raw)
            if text_bytes and text_bytes != b"null":
                found = dims_cache.get(text_bytes)
                if found is None:
                    found = dims_symbol(text_bytes, symbols)
                    if found is None:
                        return None
                    dims_cache[text_bytes] = found
                dims_ids[i] = found
    return dims_ids


def dims_symbol(text_bytes: bytes, symbols: Any) -> int | None:
    """The symbol of a raw ``Input Dims`` value, interned as orjson writes it (whatever the spacing
    of the file); None when it needs the careful path."""
    try:
        text = orjson.dumps(orjson.loads(text_bytes)).decode()
    except (orjson.JSONDecodeError, TypeError):  # e.g. an integer beyond 64 bits
        return None
    return int(symbols.intern(text))


def split_complete(events: list[Any]) -> tuple[list[Any], list[Any]]:
    """A typed batch's complete (``ph == "X"``) events and the others, each in file order."""
    if COLUMNS is not None:
        result: tuple[list[Any], list[Any]] = COLUMNS.partition(events, _EVENT_FIELDS["ph"], "X")
        return result
    phases = [event.ph for event in events]
    if phases.count("X") == len(events):  # the usual batch: complete events only
        return events, []
    return ([event for event, ph in zip(events, phases) if ph == "X"],
            [event for event, ph in zip(events, phases) if ph != "X"])


def _typed_columns_c(
    events: list[Any], symbols: Any, scalar: Callable[[Any], int], dims_cache: dict[bytes, int]
) -> dict[str, np.ndarray] | None:
    """:func:`typed_complete_columns` with each field read by the C extension
    (:mod:`stepscope.traces._columns`): the same checks in the same order, so the same columns,
    symbols and declined batches."""
    c, ev, ar = COLUMNS, _EVENT_FIELDS, _ARG_FIELDS
    if c.any_none(events, ev["name"]) or c.any_none(events, ev["pid"]) or c.any_none(events, ev["tid"]):
        return None
    ts_b, dur_b = c.floats(events, ev["ts"], False), c.floats(events, ev["dur"], False)
    if ts_b is None or dur_b is None:
        return None
    ts, dur = np.frombuffer(ts_b, dtype=np.float64), np.frombuffer(dur_b, dtype=np.float64)
    if not _times_valid(ts, dur):
        return None
    ids, intern = symbols.ids, symbols.intern
    columns: dict[str, np.ndarray] = {}
    for key, field, none_ok in (("name", "name", False), ("cat", "cat", True)):
        column = c.symbols(events, ev[field], ids, intern, none_ok)
        if column is None:
            return None
        columns[key] = np.frombuffer(column, dtype=np.int32)
    for key in ("pid", "tid"):
        column = c.scalars(events, ev[key], scalar)
        if column is None:
            return None
        columns[key] = np.frombuffer(column, dtype=np.int32)
    args = c.objects(events, ev["args"])
    lower = c.objects(args, ar["ext_lower"])
    if lower.count(None) != len(lower):  # "external id" (older traces) where "External id" is absent
        external = _ints([v if v is not None else low for v, low in zip(c.objects(args, ar["ext"]), lower)])
    else:
        raw = c.ints(args, ar["ext"])
        external = None if raw is None else np.frombuffer(raw, dtype=np.int64)
    if external is None:
        return None
    columns["external_id"] = external
    for key, field in (("correlation", "corr"), ("stream", "stream"), ("device", "device")):
        raw = c.ints(args, ar[field])
        if raw is None:
            return None
        columns[key] = np.frombuffer(raw, dtype=np.int64)
    for key, field in (("blocks_per_sm", "bps"), ("occupancy", "occ")):
        raw = c.floats(args, ar[field], True)
        if raw is None:
            return None
        columns[key] = np.frombuffer(raw, dtype=np.float64)
    dims = c.raw_symbols(args, ar["dims"], dims_cache, lambda text_bytes: dims_symbol(text_bytes, symbols))
    if dims is None:
        return None
    dims_ids = np.frombuffer(dims, dtype=np.int32)
    stacks = c.symbols(args, ar["stack"], ids, intern, True)
    if stacks is None:
        return None
    waits = _wait_columns(c.objects(args, ar["wait_stream"]), c.objects(args, ar["wait_record"]))
    if waits is None:
        return None
    return {"name": columns.pop("name"), "cat": columns.pop("cat"), "pid": columns.pop("pid"),
            "tid": columns.pop("tid"), "input_dims": dims_ids, "call_stack": np.frombuffer(stacks, dtype=np.int32),
            "ts": ts, "dur": dur, **columns, **waits}


def sort_typed_rest(rest: list[Any], ignored_phases: frozenset[str]) -> tuple[list[Any], Counter[str], int] | None:
    """The typed batch's events other than complete ones, sorted: its clean ``[memory]`` instants,
    the counts of the phases the tables ignore, and the number of other instants; None when one
    needs the careful path (another phase, an instant with a duration, a missing or absurd time, no
    name)."""
    if COLUMNS is None:
        return _sort_typed_rest(rest, ignored_phases)
    c, ev = COLUMNS, _EVENT_FIELDS
    ignored: Counter[str] = Counter(c.objects(rest, ev["ph"]))
    lower, upper = ignored.pop("i", 0), ignored.pop("I", 0)
    if not set(ignored) <= ignored_phases:
        return None
    if not lower and not upper:
        return [], ignored, 0
    if lower and upper:  # both spellings: keep them in file order
        instants = [event for event in rest if event.ph == "i" or event.ph == "I"]
    else:
        instants = c.partition(rest, ev["ph"], "i" if lower else "I")[0]
    if c.count_none(instants, ev["dur"]) != len(instants) or c.any_none(instants, ev["name"]):
        return None
    ts = c.floats(instants, ev["ts"], False)
    if ts is None or (np.abs(np.frombuffer(ts, dtype=np.float64)) >= FAR_TS_US).any():
        return None
    memory, other = c.partition(instants, ev["name"], "[memory]")
    return memory, ignored, len(other)


def _sort_typed_rest(rest: list[Any], ignored_phases: frozenset[str]) -> tuple[list[Any], Counter[str], int] | None:
    memory: list[Any] = []
    ignored: Counter[str] = Counter()
    instants = 0
    for event in rest:
        ph = event.ph
        if ph in ignored_phases:
            ignored[ph] += 1
        elif (ph == "i" or ph == "I") and event.dur is None:
            ts = event.ts
            if ts is None or abs(ts) >= FAR_TS_US or event.name is None:
                return None
            if event.name == "[memory]":
                memory.append(event)
            else:
                instants += 1
        else:
            return None
    return memory, ignored, instants


def typed_memory_columns(events: list[Any], scalar: Callable[[Any], int]) -> dict[str, bytes] | None:
    """The columns of typed ``[memory]`` instants (their times checked by :func:`sort_typed_rest`)
    as bytes; None without the C reader or for a thread id of an odd type (the caller's Python
    path then converts them)."""
    if COLUMNS is None:
        return None
    c, ev, ar = COLUMNS, _EVENT_FIELDS, _ARG_FIELDS
    tid = c.scalars(events, ev["tid"], scalar)
    if tid is None:
        return None
    args = c.objects(events, ev["args"])
    columns = {"ts": c.floats(events, ev["ts"], False), "tid": tid}
    for key in ("device_type", "device_id", "addr"):
        columns[key] = c.ints(args, ar[key], -1)
    for key in ("nbytes", "total_allocated", "total_reserved"):
        columns[key] = c.floats(args, ar[key], True)
    if any(value is None for value in columns.values()):
        return None
    return columns


def _c_columns() -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The C column reader and the typed events' field descriptors, or (None, {}, {}) when it is not
    built, was built from other source, or STEPSCOPE_PURE_PYTHON is set."""
    if not typed.AVAILABLE:
        return None, {}, {}
    try:
        from stepscope.traces import _columns
    except ImportError:
        return None, {}, {}
    if usable(_columns) is None:
        return None, {}, {}
    fields = {name: vars(typed.Event)[name] for name in typed.Event.__struct_fields__}
    arg_fields = {name: vars(typed.Args)[name] for name in typed.Args.__struct_fields__}
    return _columns, fields, arg_fields


#: The C column reader (stepscope/traces/_columns.c) when it is used, else None.
COLUMNS, _EVENT_FIELDS, _ARG_FIELDS = _c_columns()
