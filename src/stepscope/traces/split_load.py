"""Decode one large uncompressed trace on several cores: its ``traceEvents`` array cut into byte ranges.

Contract: :func:`decode_split` fills a :class:`~stepscope.traces.events.TableBuilder` with the same
rows, columns, skip counts and metadata as the streaming decode of :mod:`stepscope.traces.decode`
(the symbol ids may be numbered in another order; every id maps to the same string), or returns
``None`` having changed nothing, and the caller decodes the file in one stream. It never raises for
the file's content: a range that does not decode, a layout it does not expect, a worker that fails,
a temporary directory that cannot be written all end in ``None``, so every error the user sees
comes from the streaming decode, with its byte offset.

Why the cuts are safe. The parent picks each cut at the first ``} , {`` after an evenly spaced
offset, without knowing whether that spot lies between two top-level events or inside a string or a
nested object. Each worker decodes ``{"traceEvents": [`` + its range + ``]}`` with the streaming
decoder. The first range starts right after the array's ``[``, a top-level position. A range that
starts at a top-level position decodes into whole events, and ends cleanly before the ``]`` appended
to it, only when its end is a top-level position too (a cut inside a string leaves the string open,
one inside an object leaves a bracket unbalanced): so when every worker succeeds, every cut was
between two top-level events, by induction from the first. A worker that fails, or whose document
does not end exactly where its range does (metadata other than the appended ``]}``), turns the
whole split decode into ``None``.

The last range runs to the end of the file, so the array's closing ``]`` and the metadata after it
are found exactly as the streaming decode finds them; the metadata before the array is decoded by
the parent. The parent decodes the first range itself, into the builder that becomes the table,
while worker processes decode the others and write their columns to files in a temporary directory
(``TMPDIR``; about a quarter of their share of the JSON); the parent then appends those, renumbering
each part's symbols into its own table: no column is pickled, and the parent holds one copy of the
columns.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from stepscope import limits
from stepscope.heap import no_cycle_scans
from stepscope.traces.decode import (BOUNDARY, CHUNK_BYTES, EVENTS_KEY, HEAD_SEARCH_BYTES, KEY_OVERLAP, DecodeStats,
                                     decode_meta, iter_event_batches)
from stepscope.traces.events import SYMBOL_COLUMNS, TableBuilder
from stepscope.traces.spill import ColumnSink, sink_for

CUT_SEARCH_BYTES = 4 * 1024 * 1024  # how far past an even offset a boundary between events is looked for
_PREFIX = b'{"traceEvents": ['
_SUFFIX = b"]}"


def parts_for(size: int, workers: int) -> int:
    """How many ranges a file of ``size`` bytes is cut into with ``workers`` processes (1: not cut)."""
    return max(1, min(workers, size // max(1, limits.SPLIT_PART_MIN_BYTES)))


def decode_split(path: str, size: int, workers: int, add: Callable[[TableBuilder, Any, DecodeStats], None],
                 max_bytes: int, progress: Callable[[int, int], None] | None = None,
                 ) -> tuple[TableBuilder, dict[str, Any], DecodeStats] | None:
    """The builder, metadata and decode counters of ``path`` (``size`` bytes) decoded in up to
    ``workers`` ranges, or None (see the module docstring). ``add(builder, batch, stats)`` stores one
    decoded batch, as the streaming load does. ``progress(done_bytes, total_bytes)`` is called as
    ranges finish."""
    count = parts_for(size, workers)
    if count < 2:
        return None
    try:
        with open(path, "rb") as fh:
            plan = _plan(fh, size, count, max_bytes)
    except OSError:
        return None
    if plan is None:
        return None
    meta_head, ranges = plan
    stats = DecodeStats()
    try:
        head_meta = decode_meta(meta_head, b"}", stats, 0)
    except Exception:  # noqa: BLE001 - the streaming decode reports what is wrong with the head
        return None
    import tempfile  # here: a trace too small to cut never needs it (~4 ms to import)

    builder: TableBuilder | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="stepscope-split-") as scratch:
            done = _run(path, ranges, scratch, add, max_bytes, progress, size)
            if done is None:
                return None
            builder, first, parts = done
            _append(builder, parts)
    except OSError:  # the temporary directory: full, read-only, gone
        if builder is not None and builder.sink is not None:
            builder.sink.close()
        return None
    meta = dict(head_meta)
    for part in (first, *parts):
        meta.update(part["meta"])
        stats.replaced_utf8 += part["replaced_utf8"]
        stats.big_int_pieces += part["big_int_pieces"]
    stats.path = "split"
    return builder, meta, stats


def _plan(fh: BinaryIO, size: int, parts: int, max_bytes: int) -> tuple[bytes, list[tuple[int, int, bool]]] | None:
    """The metadata head (up to and including ``"traceEvents":``) and the ranges ``(start, stop, last)``."""
    if fh.read(2) == b"\x1f\x8b":
        return None
    fh.seek(0)
    head = bytearray()
    match = None
    while match is None and len(head) < min(HEAD_SEARCH_BYTES, max_bytes):
        block = fh.read(CHUNK_BYTES)
        if not block:
            return None
        searched = len(head)
        head += block
        match = EVENTS_KEY.search(head, max(0, searched - KEY_OVERLAP))
    if match is None or not head.lstrip().startswith(b"{"):
        return None
    start = match.end()
    cuts = []
    for i in range(1, parts):
        fh.seek(start + (size - start) * i // parts)
        window = fh.read(CUT_SEARCH_BYTES)
        found = BOUNDARY.search(window)
        if found is None:
            return None
        offset = start + (size - start) * i // parts
        cuts.append((offset + found.start() + 1, offset + found.end() - 1))  # (end of one range, start of next)
    ranges = []
    begin = start
    for stop, following in cuts:
        if stop <= begin:  # two even offsets found the same boundary (small events, many parts)
            continue
        ranges.append((begin, stop, False))
        begin = following
    if not ranges:
        return None
    ranges.append((begin, size, True))
    return bytes(head[: match.end() - 1]), ranges


def _run(path: str, ranges: list[tuple[int, int, bool]], scratch: str,
         add: Callable[[TableBuilder, Any, DecodeStats], None], max_bytes: int,
         progress: Callable[[int, int], None] | None, size: int,
         ) -> tuple[TableBuilder, dict[str, Any], list[dict[str, Any]]] | None:
    """The first range decoded here, into the builder that becomes the table, while worker processes
    decode the others into column files: (builder, its part's counters, the other parts in order)."""
    from concurrent.futures import as_completed

    from stepscope.executors import local_executor

    done = ranges[0][0]  # the head counts as read

    def finished(index: int) -> None:
        nonlocal done
        done += ranges[index][1] - ranges[index][0]
        if progress is not None:
            progress(min(done, size), size)

    parts: dict[int, dict[str, Any]] = {}
    with local_executor(len(ranges) - 1) as pool:
        futures = {pool.submit(_decode_range, path, start, stop, last, os.path.join(scratch, str(index)), add,
                               max_bytes): index
                   for index, (start, stop, last) in enumerate(ranges) if index}
        builder = TableBuilder()
        builder.sink_decision = sink_for  # its columns on to disk as it grows, where memory is short
        first = _decode_into(builder, path, *ranges[0], add, max_bytes)
        if first is None:
            _cancel(futures)
            return None
        finished(0)
        for future in as_completed(futures):
            part = _outcome(future)
            if part is None:
                _cancel(futures)
                return None
            parts[futures[future]] = part
            finished(futures[future])
    return builder, first, [parts[index] for index in range(1, len(ranges))]


def _cancel(futures: dict[Any, int]) -> None:
    for future in futures:
        future.cancel()


def _outcome(future: Any) -> dict[str, Any] | None:
    """A worker's part, or None where it failed or died (memory, a signal): decode in one stream."""
    try:
        result: dict[str, Any] | None = future.result()
    except Exception:  # noqa: BLE001
        return None
    return result


class _Range:
    """``{"traceEvents": [`` + bytes ``start:stop`` of the file (+ ``]}`` unless it runs to the end)."""

    def __init__(self, fh: BinaryIO, start: int, stop: int, last: bool):
        fh.seek(start)
        self.fh, self.left = fh, stop - start
        self.prefix, self.suffix = _PREFIX, b"" if last else _SUFFIX

    def read(self, size: int) -> bytes:
        if self.prefix:
            out, self.prefix = self.prefix, b""
            return out
        if self.left > 0:
            block = self.fh.read(min(size, self.left))
            self.left = self.left - len(block) if block else 0
            return block
        out, self.suffix = self.suffix, b""
        return out


def _decode_into(builder: TableBuilder, path: str, start: int, stop: int, last: bool,
                 add: Callable[[TableBuilder, Any, DecodeStats], None], max_bytes: int) -> dict[str, Any] | None:
    """One range decoded into ``builder``: its metadata and decode counters, or None when the range
    is not a run of whole events (a cut inside an event, damage: the caller then decodes in one
    stream)."""
    stats = DecodeStats()
    meta: dict[str, Any] | None = None
    try:
        with no_cycle_scans(), open(path, "rb") as fh:
            batches = iter_event_batches(_Range(fh, start, stop, last), stats, None,  # type: ignore[arg-type]
                                         max_bytes=max_bytes)
            for kind, payload in batches:
                if kind == "events":
                    add(builder, payload, stats)
                else:
                    meta = payload
    except Exception:  # noqa: BLE001 - whatever went wrong, the streaming decode says it properly
        return None
    if meta is None or stats.path != "streaming" or (meta and not last):
        return None
    return {"meta": meta, "replaced_utf8": stats.replaced_utf8, "big_int_pieces": stats.big_int_pieces}


def _decode_range(path: str, start: int, stop: int, last: bool, prefix: str,
                  add: Callable[[TableBuilder, Any, DecodeStats], None], max_bytes: int) -> dict[str, Any] | None:
    """A worker: one range decoded into columns written to ``prefix.<column>`` (None as :func:`_decode_into`)."""
    builder = TableBuilder()
    # the event columns go to their files as they are decoded: the worker never holds its part whole
    builder.sink = ColumnSink(os.path.dirname(prefix), prefix=prefix)
    try:
        part = _decode_into(builder, path, start, stop, last, add, max_bytes)
        if part is None:
            return None
        builder.flush()
        events = builder.event_buffers()
        sizes = {key: builder.flushed_rows for key in events}
        for key, buffer in builder.buffers().items():
            if key in events:
                continue
            with open(f"{prefix}.{key}", "wb") as out:
                buffer.tofile(out)
            sizes[key] = len(buffer)
    except OSError:
        return None
    finally:
        builder.sink.close()
    return {**part, "prefix": prefix, "symbols": builder.symbols.strings, "sizes": sizes,
            "skipped": builder.counts.skipped, "ignored": builder.counts.ignored}


def _append(builder: TableBuilder, parts: list[dict[str, Any]]) -> None:
    """The parts' column files appended to ``builder``, in file order; each part's symbols renumbered."""
    intern = builder.symbols.intern
    for part in parts:
        # index -1 (a missing symbol) stays -1
        renumber = np.array([intern(s) for s in part["symbols"]] + [-1], dtype=np.int32)
        rows = builder.rows()  # the part's wait rows count from here
        if builder.sink is not None:
            builder.flush()  # the rows before this part go first (a failed write: back in memory)
        sink = builder.sink
        if sink is not None:
            _stream_part(builder, sink, part, renumber)
        buffers = builder.buffers()
        for key, buffer in buffers.items():
            count = part["sizes"][key]
            if not count or (sink is not None and key in builder.event_buffers()):
                continue
            before = len(buffer)
            with open(f"{part['prefix']}.{key}", "rb") as fh:
                buffer.fromfile(fh, count)
            os.unlink(f"{part['prefix']}.{key}")
            if key in SYMBOL_COLUMNS or key == "wait_rows":
                view = np.frombuffer(buffer, dtype=np.int32 if key in SYMBOL_COLUMNS else np.int64)[before:]
                if key == "wait_rows":
                    view += rows
                else:
                    view[:] = _renumbered(view, renumber)
                del view
        builder.counts.skipped.update(part["skipped"])
        builder.counts.ignored.update(part["ignored"])
        builder.maybe_flush()  # a table grown past the memory left goes on to disk from here


_STREAM_ROWS = 1 << 22


def _renumbered(ids: np.ndarray, renumber: np.ndarray) -> np.ndarray:
    """A part's symbol ids in the parent's numbering (``-1``, absent, stays ``-1``)."""
    if len(ids) and int(ids.min()) < -1:
        raise OSError("a symbol column holds an id below -1")
    out: np.ndarray = renumber[ids]
    return out


def _stream_part(builder: TableBuilder, sink: ColumnSink, part: dict[str, Any], renumber: np.ndarray) -> None:
    """A part's event columns appended to ``sink``'s files a few million rows at a time, symbols
    renumbered: the part is never held whole in this process."""
    rows = part["sizes"]["ts"]
    nbytes = 0
    for key, buffer in builder.event_buffers().items():
        dtype = np.dtype(buffer.typecode)
        with open(f"{part['prefix']}.{key}", "rb") as fh:
            for start in range(0, rows, _STREAM_ROWS):
                chunk = np.fromfile(fh, dtype=dtype, count=min(_STREAM_ROWS, rows - start))
                if len(chunk) != min(_STREAM_ROWS, rows - start):
                    raise OSError(f"the part's column {key} is shorter than its count")
                if key in SYMBOL_COLUMNS:
                    chunk = _renumbered(chunk, renumber)
                sink.write(key, chunk)
                nbytes += chunk.nbytes
        os.unlink(f"{part['prefix']}.{key}")
    builder.add_flushed(rows, nbytes)


__all__ = ["decode_split", "parts_for"]
