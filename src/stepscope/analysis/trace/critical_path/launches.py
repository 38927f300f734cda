"""Launch and queue bookkeeping over the whole trace (built once per trace and mode): queue
lengths per stream, the launches of many rows, recorded events and the launches around them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from stepscope.analysis.trace.critical_path.model import GRAPH_LAUNCH_CALLS, KERNEL_LAUNCH_CALLS, LAUNCH_CALLS, IntArray
from stepscope.analysis.trace.critical_path.rows import Rows
from stepscope.traces.links import last_match
from stepscope.traces.spill import follow


#: An absent queue length in :func:`_queue_lengths`' arrays.
NO_LENGTH = np.iinfo(np.int32).min


def _queue_lengths(rows: Rows, launch_calls: frozenset[str]) -> tuple[np.ndarray, np.ndarray, dict[int, int],
                                                                       dict[int, int]]:
    """HTA's queue length per stream, over the whole trace: +1 at a launch for each GPU row it
    launched, -1 at each GPU row's start. Returns two int32 columns over the rows: the length
    after each launch (at launch positions) and after each GPU row's start (at its position), both
    :data:`NO_LENGTH` elsewhere; each launched row's place among the rows of its launch where it
    is not 0 (a CUDA graph's replay launches many), and the launches of more than one GPU row
    with their counts (by the rows' index_correlation). Columns and sparse dicts, not a dict per
    row: a trace of 4.8 M events holds 1.2 M launches and launched rows, ~140 MB as Python dicts."""
    n = len(rows.ts)
    launch = np.flatnonzero(rows.name_in(launch_calls))
    gpu = np.flatnonzero(rows.stream != -1)
    if not len(launch) or not len(gpu):
        return np.full(n, NO_LENGTH, dtype=np.int32), np.full(n, NO_LENGTH, dtype=np.int32), {}, {}
    launcher = last_match(rows.corr[launch], launch, rows.corr[gpu])
    ok = launcher >= 0
    launched, by = gpu[ok], launcher[ok]
    del gpu, launcher, ok
    count = len(by)
    pos = np.concatenate([by, launched])
    stream = rows.stream[launched]
    stream = np.concatenate([stream, stream])
    # at one microsecond, launches first. HTA's unstable sort leaves such ties to chance: on the
    # reference traces 12 of ~78,000 edges differ that way (a launch delay for a kernel gap), never
    # on the path (docs/critical-path.md)
    order = np.lexsort((np.arange(len(pos)), rows.ts[pos], stream))
    stream = stream[order]
    launches = order < count  # the first half of ``pos`` are the launches
    at = pos[order]
    del pos, order
    # the running length per stream: one cumulative sum, less the sum before each stream's first row
    lengths = np.cumsum(np.where(launches, np.int32(1), np.int32(-1)), dtype=np.int64)
    firsts = np.flatnonzero(stream[1:] != stream[:-1]) + 1
    before = np.zeros(len(firsts) + 1, dtype=np.int64)
    before[1:] = lengths[firsts - 1]
    group = np.zeros(len(stream), dtype=np.int32)
    group[firsts] = 1
    lengths -= before[np.cumsum(group, dtype=np.int32)]
    del stream, group
    spill = follow(rows.ts)  # kept for every window: on disk where the table is
    columns = []
    for side in (launches, ~launches):
        where, value = at[side], lengths[side]
        # a launch of many rows is met once per row: its length is the one met last
        last = len(where) - 1 - np.unique(where[::-1], return_index=True)[1]
        column = np.full(n, NO_LENGTH, dtype=np.int32)
        column[where[last]] = value[last]
        del where, value, last
        columns.append(spill(column))
    after_launch, after_start = columns
    del at, lengths, launches, columns
    # each launched row's place among its launch's rows, in (start, position) order
    by_time = np.lexsort((launched, rows.ts[launched]))
    ordered_by = by[by_time]
    grouped = np.argsort(ordered_by, kind="stable")
    keys = ordered_by[grouped]
    places = np.arange(len(keys)) - np.searchsorted(keys, keys, side="left")
    later = places > 0
    place = dict(zip(launched[by_time[grouped[later]]].tolist(), places[later].tolist()))
    # the launches of several rows, by the launched rows' index_correlation
    targets = rows.ic[launched]
    ids, counts = np.unique(targets[targets >= 0], return_counts=True)
    several = counts > 1
    return after_launch, after_start, place, dict(zip(ids[several].tolist(), counts[several].tolist()))


def _on_keys(columns: tuple[np.ndarray, ...], keys: set[tuple[int, ...]]) -> np.ndarray:
    """Per row, whether its values in ``columns`` form one of ``keys`` (a handful: streams,
    threads), without a Python tuple per row; every row when there are more than 32 keys (one
    pass over the rows per key)."""
    if len(keys) > 32:
        return np.ones(len(columns[0]), dtype=bool)
    out = np.zeros(len(columns[0]), dtype=bool)
    for key in keys:
        match = np.ones(len(columns[0]), dtype=bool)
        for column, value in zip(columns, key):
            match &= column == value
        out |= match
    return out


def _launch_before(rows: Rows, calls: IntArray, stream_of: dict[int, tuple[int, int]],
                   launch_calls: frozenset[str]) -> dict[int, int]:
    """For each cudaEventRecord position: the GPU row launched last on its (device, stream) before it."""
    if not stream_of:  # no recorded event has a known stream: nothing to find
        return {}
    launch = np.flatnonzero(rows.name_in(launch_calls) & (rows.ic >= 0))
    if not len(launch):
        return {}
    target = rows.ic[launch]
    # only the launches onto a stream some record was made on can precede a record
    on_record_stream = _on_keys((rows.pid[target], rows.stream[target]), set(stream_of.values()))
    launch, target = launch[on_record_stream], target[on_record_stream]
    key_of_launch = list(zip(rows.pid[target].tolist(), rows.stream[target].tolist()))
    out: dict[int, int] = {}
    by_key: dict[tuple[int, int], list[tuple[float, int, int]]] = defaultdict(list)
    for p, k, t in zip(launch.tolist(), key_of_launch, target.tolist()):
        by_key[k].append((float(rows.ts[p]), 0, t))
    for p in calls.tolist():
        where = stream_of.get(p)
        if where is not None:
            by_key[where].append((float(rows.ts[p]), 1, p))
    for items in by_key.values():
        items.sort(key=lambda item: item[0])
        previous = -1
        for _, is_record, value in items:
            if is_record:
                if previous >= 0:
                    out[value] = previous
            else:
                previous = value
    return out


@dataclass(frozen=True)
class Launches:
    """The whole trace's launch bookkeeping, computed once per trace and mode (every step reads it)."""

    after_launch: np.ndarray  # int32 over the rows (:func:`_queue_lengths`)
    after_start: np.ndarray
    place: dict[int, int]  # a launched row's place among its launch's rows, where not 0
    launched_by: dict[int, int]  # launches of more than one GPU row (by index_correlation): their count
    corr_to_record: dict[int, int]
    previous: dict[int, int]  # cudaEventRecord -> the GPU row launched last before it on its stream
    waits_next: dict[int, int]  # cudaStreamWaitEvent -> the GPU row of the next launch on its stream


def launches_of(rows: Rows, hta: bool) -> Launches:
    cache: dict[bool, Launches] = rows.__dict__.setdefault("_launches", {})
    found = cache.get(hta)
    if found is not None:
        return found
    launch_calls = LAUNCH_CALLS if hta else LAUNCH_CALLS | GRAPH_LAUNCH_CALLS
    after_launch, after_start, place, launched_by = _queue_lengths(rows, launch_calls)  # launched_by: default mode only
    records = np.flatnonzero(rows.name == rows.sym("cudaEventRecord"))
    # each recorded CUDA event: the stream and device it was recorded on (from the waits that name it)
    record_stream: dict[int, tuple[int, int]] = {}
    corr_to_record = dict(zip(rows.corr[records].tolist(), records.tolist()))
    for p, stream in rows.wait_stream.items():
        record = corr_to_record.get(rows.wait_record.get(p, -1))
        if record is not None and stream > -1:
            record_stream.setdefault(record, (int(rows.pid[p]), stream))
    previous = _launch_before(rows, records, record_stream, launch_calls)
    waits_next = _next_launch_after_waits(rows, launch_calls) if rows.sym("Stream Wait Event") >= 0 else {}
    found = cache[hta] = Launches(after_launch, after_start, place, launched_by, corr_to_record, previous, waits_next)
    return found


def synchronous_launches(rows: Rows, window: IntArray) -> tuple[IntArray, IntArray]:
    """Copy, memset and submission calls in the window whose GPU row ran wholly inside the call (a
    blocking copy, a synchronous submission such as MTIA's ``runFunction``): the calls and their
    rows. A kernel launch is never taken as one: a slow launch of a short kernel is still async."""
    calls = window[(rows.stream[window] == -1) & rows.name_in(LAUNCH_CALLS - KERNEL_LAUNCH_CALLS, window)
                   & (rows.ic[window] >= 0)]
    launched = rows.ic[calls]
    inside = (rows.stream[launched] >= 0) & (rows.ts[launched] >= rows.ts[calls]) & (rows.end[launched] <= rows.end[calls])
    inside &= rows.end[launched] > rows.ts[launched]
    return calls[inside], launched[inside]


def _next_launch_after_waits(rows: Rows, launch_calls: frozenset[str]) -> dict[int, int]:
    """For each cudaStreamWaitEvent call (position): the GPU row of the next launch on the same
    thread onto the waiting stream."""
    waits = np.flatnonzero((rows.name == rows.sym("cudaStreamWaitEvent")) & (rows.ic >= 0))
    launch = np.flatnonzero(rows.name_in(launch_calls) & (rows.ic >= 0))
    if not len(waits) or not len(launch):
        return {}
    wait_target = rows.ic[waits]
    wait_keys: set[tuple[int, ...]] = set(zip(rows.pid[waits].tolist(), rows.tid[waits].tolist(),
                                              rows.stream[wait_target].tolist()))
    # only the launches from a thread onto a stream some wait names can follow a wait
    launch = launch[_on_keys((rows.pid[launch], rows.tid[launch], rows.stream[rows.ic[launch]]), wait_keys)]
    by_key: dict[tuple[int, int, int], list[tuple[float, int, int]]] = defaultdict(list)
    for p in launch.tolist():
        target = int(rows.ic[p])
        by_key[(int(rows.pid[p]), int(rows.tid[p]), int(rows.stream[target]))].append((float(rows.ts[p]), 1, target))
    for p in waits.tolist():
        target = int(rows.ic[p])  # the Stream Wait Event row, on the waiting stream
        by_key[(int(rows.pid[p]), int(rows.tid[p]), int(rows.stream[target]))].append((float(rows.ts[p]), 0, p))
    out = {}
    for items in by_key.values():
        items.sort(key=lambda item: item[0])
        pending: list[int] = []
        for _, is_launch, value in items:
            if is_launch:
                for wait in pending:
                    out[wait] = value
                pending = []
            else:
                pending.append(value)
    return out
