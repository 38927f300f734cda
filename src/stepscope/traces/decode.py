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
   failure the previous candidate is tried, then more chunks are appended and the next attempt
   waits until the buffer has doubled. The buffer is a ``bytearray`` appended to and cut from the
   front in place, so every byte is copied a constant number of times: decoding is linear in the
   file's size however large one event, or one run of whitespace, is. A buffer that grows past
   ``max_bytes`` without a cut is an error (:class:`LimitExceeded`), or the damage that prevents
   the cut when there is one.
4. At end of file the array's closing ``]`` is located the same way, and the metadata object is
   decoded from head + ``[]`` + tail.

When the layout is not the usual one (a top-level array, ``traceEvents`` not near the start) or a
decode fails for good, the whole document is decoded at once (``whole-document`` path, at most
``max_bytes``), which also produces the exact error position. orjson refuses integers beyond 64 bits (Kineto's
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

from stepscope.traces import typed

CHUNK_BYTES = 1024 * 1024  # bytes of JSON decoded at once: bounds the transient dicts
HEAD_SEARCH_BYTES = 64 * 1024 * 1024
EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_CLOSE = re.compile(rb"\}\s*\]")
_ANY_CLOSE = re.compile(rb"\]")
KEY_OVERLAP = 4096  # "traceEvents" : [ split across two reads, with some whitespace


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
        self.bare_array = False  # the document is a bare JSON array of events (no "traceEvents" key)


def open_binary(path: str) -> BinaryIO:
    """Open a trace file, transparently decompressing gzip (detected by magic bytes)."""
    raw = open(path, "rb")  # noqa: SIM115 - returned to the caller
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _loads(data: bytes | bytearray, stats: DecodeStats, offset: int) -> Any:
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


class LimitExceeded(DecodeFailure):
    """A piece of the document is larger than the caller's limit (see :mod:`stepscope.limits`)."""

    def __init__(self, what: str, limit: int, position: int | None = None):
        super().__init__(what, position)
        self.what, self.limit = what, limit


def _read_all(stream: BinaryIO, progress: Callable[[int], None] | None, limit: int, have: int) -> bytes:
    """The rest of the stream, refusing more than ``limit`` bytes in all (``have`` already read)."""
    parts = []
    total = have
    while True:
        block = _read(stream)
        if not block:
            break
        total += len(block)
        if total > limit:
            raise LimitExceeded("a trace that is not laid out as {\"traceEvents\": [...]} and is decoded as a "
                                "whole document", limit)
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
    stream: BinaryIO, stats: DecodeStats, progress: Callable[[int], None] | None = None,
    max_bytes: int | None = None, typed_batches: bool = True,
) -> Iterator[tuple[str, Any]]:
    """Yield ``("events", batch)`` items and finally one ``("meta", dict)`` item. A batch is a list
    of event dicts, or — with ``typed_batches`` and msgspec installed, on the streaming path — a
    :class:`~stepscope.traces.typed.TypedBatch` (only the fields the tables read) or, where the C
    scanner takes the batch, a :class:`~stepscope.traces.typed.ScannedBatch` (its columns' values).

    Linear in the size of the document, and holds at most about ``max_bytes`` of it at once
    (default :func:`stepscope.limits.max_bytes`): the undecoded rest — one event, or a run of
    whitespace — longer than that raises :class:`LimitExceeded`, as does a document decoded whole
    (not laid out as ``{"traceEvents": [...]}``) longer than that.

    Raises :class:`DecodeFailure` for bytes that are not JSON.
    """
    if max_bytes is None:
        from stepscope.limits import max_bytes as default_limit

        max_bytes = default_limit()
    head = bytearray()
    searched = 0  # the key was not found before this offset of head
    match = None
    while len(head) < min(HEAD_SEARCH_BYTES, max_bytes):
        block = _read(stream)
        if not block:
            break
        if progress:
            progress(len(block))
        head += block
        match = EVENTS_KEY.search(head, max(0, searched - KEY_OVERLAP))
        if match is not None:
            break
        searched = len(head)
    if match is None or not head.lstrip().startswith(b"{"):
        yield from _whole_document(bytes(head) + _read_all(stream, progress, max_bytes, len(head)), stats)
        return
    meta_head = bytes(head[: match.end() - 1])  # keeps '"traceEvents":'
    buffer = head
    del buffer[: match.end()]
    consumed = match.end()  # byte offset of buffer[0]
    attempt_at = CHUNK_BYTES  # try a cut once the buffer holds this much
    while True:
        block = _read(stream)
        if progress and block:
            progress(len(block))
        if not block:
            events, tail = _split_end(bytes(buffer), stats, consumed)
            yield "events", events  # also an empty list: the key is there (``"traceEvents": []``)
            yield "meta", decode_meta(meta_head, tail, stats, consumed)
            return
        buffer += block
        if len(buffer) < attempt_at and len(buffer) <= max_bytes:
            continue
        cut = _cut(buffer, stats, consumed, typed_batches)
        if cut is None:
            if len(buffer) > max_bytes:
                raise _overflow(buffer, stats, consumed, max_bytes)
            # no event ends here yet (a very large event): try again only once the buffer has doubled,
            # so the decode attempts add up to a constant times the bytes read, however large it grows
            attempt_at = 2 * len(buffer)
            continue
        batch, used = cut
        yield "events", batch
        del buffer[:used]
        consumed += used
        attempt_at = len(buffer) + CHUNK_BYTES


def _bracketed(buffer: bytes | bytearray, stop: int) -> bytearray:
    """``[`` + ``buffer[:stop]`` + ``]`` with one copy of the slice (it may be hundreds of MB)."""
    piece = bytearray()
    with memoryview(buffer) as view:
        piece += b"["
        piece += view[:stop]
        piece += b"]"
    return piece


def _cut(buffer: bytearray, stats: DecodeStats, offset: int,
         typed_batches: bool = True) -> tuple[list[Any] | typed.TypedBatch | typed.ScannedBatch, int] | None:
    """Decode the longest prefix of whole events, trying the last few candidate boundaries."""
    start = len(buffer)
    for _attempt in range(8):
        brace = buffer.rfind(b"}", 0, start)
        if brace < 0:
            return None
        found = BOUNDARY.match(buffer, brace)
        start = brace
        if found is None:
            continue
        piece = _bracketed(buffer, brace + 1)
        if typed_batches and typed.AVAILABLE:
            try:
                batch = typed.decode_batch(piece)
            except typed.DecodeError:
                batch = None  # not JSON as cut here, or JSON only the careful decode accepts: orjson decides
            if batch is not None:
                return batch, found.end() - 1
        try:
            events = _loads(piece, stats, offset - 1)
        except DecodeFailure:
            continue
        if isinstance(events, list):
            return events, found.end() - 1
    return None


def _overflow(buffer: bytearray, stats: DecodeStats, offset: int, limit: int) -> DecodeFailure:
    """Why no event ends within ``limit`` bytes: damage earlier in the buffer, or a huge event/whitespace."""
    brace = buffer.rfind(b"}")
    if brace > 0:
        try:
            _loads(_bracketed(buffer, brace + 1), stats, offset - 1)
        except DecodeFailure as exc:
            # an error well before the end is damage; at the end, the decoder only ran out of input
            if exc.position is not None and exc.position < offset + brace - 64:
                return DecodeFailure(f"the traceEvents array is damaged ({exc})", exc.position)
    return LimitExceeded("one trace event (or a run of whitespace between events)", limit, offset)


def _split_end(buffer: bytes, stats: DecodeStats, offset: int) -> tuple[list[Any], bytes]:
    """At end of file: find the ``]`` closing traceEvents (after the last event's ``}``)."""
    stripped = buffer.lstrip()
    if stripped.startswith(b"]"):
        return [], stripped[1:]
    last_error: DecodeFailure | None = None
    budget = 8 * len(buffer) + CHUNK_BYTES  # bytes decoded in failed attempts: keeps this linear
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
            budget -= stop
            if budget < 0:
                break
            try:
                events = _loads(_bracketed(buffer, stop), stats, offset - 1)
            except DecodeFailure as exc:
                last_error = last_error or exc
                continue
            if isinstance(events, list):
                return events, buffer[close.end() :]
    if last_error is not None and last_error.position is not None:
        raise DecodeFailure(f"the traceEvents array is damaged or truncated ({last_error})", last_error.position)
    raise DecodeFailure("the traceEvents array is never closed (truncated file?)", offset + len(buffer))


def decode_meta(head: bytes, tail: bytes, stats: DecodeStats, offset: int) -> dict[str, Any]:
    """The top-level keys other than ``traceEvents``: ``head`` (up to ``"traceEvents":``) + ``[]`` + ``tail``."""
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
        stats.bare_array = True
        yield "events", doc
        yield "meta", {}
        return
    if not isinstance(doc, dict):
        raise DecodeFailure(f"the top level is a JSON {type(doc).__name__}, not an object", 0)
    events = doc.pop("traceEvents", None)
    if events is not None:
        yield "events", events
    yield "meta", doc


def dicts_of(batch: typed.TypedBatch | typed.ScannedBatch, stats: DecodeStats) -> list[Any]:
    """A typed batch the typed path could not take, decoded into dicts for the careful path."""
    events = _loads(batch.piece, stats, 0)
    return events if isinstance(events, list) else [events]
