"""Byte-level decoding of Kineto (Chrome-trace JSON) documents into batches of event dicts.

Contract: :func:`iter_event_batches` yields ``(metadata, events)`` pieces without ever holding
the whole document as Python objects. Only one batch of event dicts (a few MB of JSON) is alive
at a time; the caller turns each batch into columns and drops it.

Algorithm (streaming fast path):

1. Read the (optionally gzip-compressed) file in chunks of :data:`CHUNK_BYTES`.
2. Find ``"traceEvents": [`` in the head; everything before it is the metadata head.
3. Cut the buffer at the last candidate boundary ``} , {`` and decode ``[`` + slice + ``]`` with
   orjson. A candidate inside a string or a nested object cannot decode (unbalanced brackets or
   an open string), so a successful decode proves the cut was between two top-level events; on
   failure the previous candidate is tried, then the next chunk is appended.
4. At end of file the array's closing ``]`` is located the same way, and the metadata object is
   decoded from head + ``[]`` + tail.

When the layout is not the usual one (a top-level array, ``traceEvents`` not near the start) or a
decode fails for good, the whole document is decoded at once (``whole-document`` path), which
also produces the exact error position. orjson refuses integers beyond 64 bits (Kineto's
``Comms Id``); such pieces are decoded again with the standard library, which accepts them.
Invalid UTF-8 is replaced by U+FFFD and counted, so one damaged name does not lose the trace.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import orjson

CHUNK_BYTES = 1024 * 1024  # bytes of JSON decoded at once: bounds the transient dicts
HEAD_SEARCH_BYTES = 64 * 1024 * 1024
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_CLOSE = re.compile(rb"\}\s*\]")
_ANY_CLOSE = re.compile(rb"\]")


class DecodeFailure(Exception):
    """The bytes are not a decodable JSON document; ``position`` is a byte offset when known."""

    def __init__(self, message: str, position: int | None = None):
        super().__init__(message)
        self.position = position


class DecodeStats:
    """Counters of repairs done while decoding (reported as warnings, never silently)."""

    def __init__(self) -> None:
        self.replaced_utf8 = 0
        self.big_int_pieces = 0
        self.path = "streaming"


def open_binary(path: str) -> BinaryIO:
    """Open a trace file, transparently decompressing gzip (detected by magic bytes)."""
    raw = open(path, "rb")  # noqa: SIM115 - returned to the caller
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _loads(data: bytes, stats: DecodeStats, offset: int) -> Any:
    """orjson first; the standard library only for what orjson refuses but JSON allows."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        message = str(exc)
        if "Integer" not in message and "utf-8" not in message.lower() and "control" not in message:
            raise DecodeFailure(exc.msg, offset + exc.pos) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        stats.replaced_utf8 += 1
    try:
        value = json.loads(text, strict=False)
    except (json.JSONDecodeError, RecursionError) as exc:
        pos = getattr(exc, "pos", 0)
        prefix = text[:pos].encode("utf-8", errors="replace")
        raise DecodeFailure(getattr(exc, "msg", "too deeply nested"), offset + len(prefix)) from None
    if "Integer" in message:
        stats.big_int_pieces += 1
    return value


def _read_all(stream: BinaryIO, progress: Callable[[int], None] | None) -> bytes:
    parts = []
    while True:
        block = _read(stream)
        if not block:
            break
        parts.append(block)
        if progress:
            progress(len(block))
    return b"".join(parts)


def _read(stream: BinaryIO) -> bytes:
    try:
        return stream.read(CHUNK_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        raise DecodeFailure(f"cannot decompress: {exc}") from None


def iter_event_batches(
    stream: BinaryIO, stats: DecodeStats, progress: Callable[[int], None] | None = None
) -> Iterator[tuple[str, Any]]:
    """Yield ``("events", list)`` batches and finally one ``("meta", dict)`` item.

    Raises :class:`DecodeFailure` for bytes that are not JSON.
    """
    head = b""
    while not _EVENTS_KEY.search(head) and len(head) < HEAD_SEARCH_BYTES:
        block = _read(stream)
        if not block:
            break
        if progress:
            progress(len(block))
        head += block
    match = _EVENTS_KEY.search(head)
    if match is None or not head.lstrip().startswith(b"{"):
        yield from _whole_document(head + _read_all(stream, progress), stats)
        return
    meta_head = head[: match.end() - 1]  # keeps '"traceEvents":'
    buffer = head[match.end() :]
    consumed = match.end()  # byte offset of buffer[0]
    eof = False
    while True:
        if not eof:
            block = _read(stream)
            if progress and block:
                progress(len(block))
            if block:
                buffer += block
            else:
                eof = True
        if eof:
            events, tail = _split_end(buffer, stats, consumed)
            if events:
                yield "events", events
            yield "meta", _meta(meta_head, tail, stats, consumed)
            return
        if len(buffer) < CHUNK_BYTES and not eof:
            continue
        cut = _cut(buffer, stats, consumed)
        if cut is None:
            continue
        events, used = cut
        yield "events", events
        buffer = buffer[used:]
        consumed += used


def _cut(buffer: bytes, stats: DecodeStats, offset: int) -> tuple[list, int] | None:
    """Decode the longest prefix of whole events, trying the last few candidate boundaries."""
    start = len(buffer)
    for _attempt in range(8):
        brace = buffer.rfind(b"}", 0, start)
        if brace < 0:
            return None
        found = _BOUNDARY.match(buffer, brace) if brace >= 0 else None
        start = brace
        if found is None:
            continue
        try:
            events = _loads(b"[" + buffer[: brace + 1] + b"]", stats, offset - 1)
        except DecodeFailure:
            continue
        if isinstance(events, list):
            return events, found.end() - 1
    return None


def _split_end(buffer: bytes, stats: DecodeStats, offset: int) -> tuple[list, bytes]:
    """At end of file: find the ``]`` closing traceEvents (after the last event's ``}``)."""
    stripped = buffer.lstrip()
    if stripped.startswith(b"]"):
        return [], stripped[1:]
    last_error: DecodeFailure | None = None
    # usual case: the last event is an object ("} ]"); else any "]" (a damaged last element)
    for closer, attempts in ((_CLOSE, 64), (_ANY_CLOSE, 16)):
        end = len(buffer)
        for _attempt in range(attempts):
            end = buffer.rfind(b"}" if closer is _CLOSE else b"]", 0, end)
            if end < 0:
                break
            close = closer.match(buffer, end)
            if close is None:
                continue
            stop = end + 1 if closer is _CLOSE else end
            try:
                events = _loads(b"[" + buffer[:stop] + b"]", stats, offset - 1)
            except DecodeFailure as exc:
                last_error = last_error or exc
                continue
            if isinstance(events, list):
                return events, buffer[close.end() :]
    if last_error is not None and last_error.position is not None:
        raise DecodeFailure(f"the traceEvents array is damaged or truncated ({last_error})", last_error.position)
    raise DecodeFailure("the traceEvents array is never closed (truncated file?)", offset + len(buffer))


def _meta(head: bytes, tail: bytes, stats: DecodeStats, offset: int) -> dict:
    doc = _loads(head + b"[]" + tail, stats, 0)
    if not isinstance(doc, dict):
        raise DecodeFailure("the top level is not a JSON object", 0)
    doc.pop("traceEvents", None)
    return doc


def _whole_document(data: bytes, stats: DecodeStats) -> Iterator[tuple[str, Any]]:
    stats.path = "whole-document"
    if not data.strip():
        raise DecodeFailure("the file is empty", 0)
    doc = _loads(data, stats, 0)
    if isinstance(doc, list):  # Chrome "JSON Array Format": a bare list of events
        if doc and not any(isinstance(item, dict) for item in doc[:1000]):
            raise DecodeFailure("a JSON array without trace events: not a torch.profiler (Kineto) trace", 0)
        yield "events", doc
        yield "meta", {}
        return
    if not isinstance(doc, dict):
        raise DecodeFailure(f"the top level is a JSON {type(doc).__name__}, not an object", 0)
    events = doc.pop("traceEvents", None)
    if events is not None:
        yield "events", events
    yield "meta", doc
