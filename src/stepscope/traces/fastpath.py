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
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

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
    with np.errstate(invalid="ignore"):
        if not (np.isfinite(ts).all() and np.isfinite(dur).all()):
            return None
        if (np.abs(ts) >= FAR_TS_US).any() or (dur < 0).any() or (dur >= FAR_TS_US).any():
            return None
    return ts, dur


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
    dims_ids = np.full(n, -1, dtype=np.int32)
    stack_ids = np.full(n, -1, dtype=np.int32)
    dims = [a.dims for a in args]
    if any(dims):  # an absent value is an empty Raw
        for i, raw in enumerate(dims):
            text_bytes = bytes(raw)
            if text_bytes and text_bytes != b"null":
                found = dims_cache.get(text_bytes)
                if found is None:
                    try:
                        text = orjson.dumps(orjson.loads(text_bytes)).decode()
                    except (orjson.JSONDecodeError, TypeError):  # e.g. an integer beyond 64 bits
                        return None
                    found = dims_cache[text_bytes] = symbols.intern(text)
                dims_ids[i] = found
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
