"""Open Kineto trace files (``.json`` / ``.json.gz``) and directories of per-rank traces.

Contract: :func:`load_trace` returns a :class:`LoadedTrace` (columnar events, memory instants,
top-level metadata, warnings) or raises :class:`~stepscope.errors.InputError` naming the file
and, where known, the byte offset (in the decompressed stream). It never lets a decoder
exception escape. Damaged single events are skipped and counted in ``warnings``.

Rank of a file: ``distributedInfo.rank`` when present (source ``"distributedInfo"``), else a
``rank[-_]N`` / ``rankN`` pattern in the file name (``"file name"``), else the file's position
in the sorted listing (``"order"``). :func:`discover_traces` resolves a directory; two files
claiming the same rank is an error (mismatched ranks), as is an empty directory.

Size guards: decoding stops with an error once the JSON exceeds ``max_json_bytes`` (default
32 GiB), once one piece held in memory — an event, a run of whitespace, a document that must
be decoded whole — exceeds ``max_bytes`` (default :func:`stepscope.limits.max_bytes`, 64 MiB;
``--max-bytes`` / ``STEPSCOPE_MAX_BYTES``), and once a gzip file past ``max_bytes`` inflates more
than :data:`stepscope.limits.MAX_RATIO`:1. Decoding is linear in the file's size, so a gzip
"bomb" is refused in the time it takes to inflate ``max_bytes``. Only regular files are read (a
FIFO would block, a device never ends).
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from stepscope import limits
from stepscope.errors import InputError
from stepscope.heap import no_cycle_scans
from stepscope.traces.ahead import claim
from stepscope.traces.decode import DecodeFailure, DecodeStats, LimitExceeded, dicts_of, iter_event_batches, open_binary
from stepscope.traces import typed
from stepscope.traces.typed import ScannedBatch, TypedBatch
from stepscope.traces.events import EventTable, MemoryTable, TableBuilder
from stepscope.traces.spill import ColumnSink, reuse_freed_memory, sink_for, spiller

MAX_JSON_BYTES = 32 * 1024**3
TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class LoadedTrace:
    """One rank's trace, decoded."""

    path: str
    rank: int
    rank_source: str  # "distributedInfo" | "file name" | "order"
    events: EventTable
    memory: MemoryTable
    meta: dict[str, Any]
    warnings: tuple[str, ...] = ()
    json_bytes: int = 0
    decode_path: str = "streaming"

    @property
    def device_properties(self) -> list[dict[str, Any]]:
        """``deviceProperties`` (or the 2021 ``computeProperties``) with Kineto's key names."""
        props = self.meta.get("deviceProperties")
        if not isinstance(props, list):
            props = self.meta.get("computeProperties")
        out = []
        for item in props if isinstance(props, list) else []:
            if not isinstance(item, dict):
                continue
            item = dict(item)
            item.setdefault("computeMajor", item.get("major"))
            item.setdefault("computeMinor", item.get("minor"))
            item.setdefault("numSms", item.get("multiProcessorCount"))
            out.append(item)
        return out


@dataclass
class _Progress:
    """Reports bytes of the *file* consumed (compressed bytes for .gz), so done <= total."""

    callback: Callable[[int, int], None] | None
    total: int
    raw: Any = None

    def __call__(self, _nbytes: int) -> None:
        if self.callback is not None and self.raw is not None:
            try:
                done = self.raw.tell()
            except (OSError, ValueError):
                return
            self.callback(min(done, self.total), self.total)


def _file_size(path: str) -> int:
    if os.path.isdir(path):
        raise InputError(path, "is a directory; use discover_traces() / pass the directory to analyze")
    return limits.regular_file(path, "trace file")


def load_trace(
    path: str | Path,
    *,
    rank: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_json_bytes: int = MAX_JSON_BYTES,
    max_bytes: int | None = None,
    workers: int = 1,
) -> LoadedTrace:
    """Decode one trace file. ``progress(done_bytes, total_bytes)`` is called per chunk.

    ``max_bytes``: the most JSON held at once (see the module docstring); ``None`` reads
    :func:`stepscope.limits.max_bytes`. ``workers`` > 1: the table a child started by the command
    decoded, if one did (:mod:`stepscope.traces.ahead`); else an uncompressed file of at least 128 MiB
    is decoded in byte ranges on that many processes (:mod:`stepscope.traces.split_load`; the same
    table), anything else in this process.
    """
    path = str(path)
    reuse_freed_memory(path, _file_size(path))  # before any worker is forked: they inherit it
    store = partial(_store, path)
    decoded = None
    if workers > 1:  # decoded by a child the command started (traces/ahead.py), or cut in ranges
        decoded = claim(path, max_json_bytes, max_bytes) or _decode_split(path, workers, store, progress,
                                                                           max_json_bytes, max_bytes)
    builder, meta, stats, json_bytes = decoded or decode_streaming(path, max_json_bytes, max_bytes, progress,
                                                                   decide=sink_for)
    # a large table's columns in files (those of a builder that wrote them while decoding are there already)
    events, memory = builder.build(spill=None if builder.sink is not None else spiller(builder.nbytes()))
    _check_step_numbers(events, path)
    warnings = _warnings(builder, stats)
    found_rank, source = _rank_of(meta, path)
    if found_rank is None:  # neither distributedInfo nor the file name: the caller's order
        found_rank, source = (rank if rank is not None else 0), "order"
    return LoadedTrace(
        path=path,
        rank=found_rank,
        rank_source=source,
        events=events,
        memory=memory,
        meta=meta,
        warnings=warnings,
        json_bytes=json_bytes,
        decode_path=stats.path,
    )


def decode_streaming(path: str, max_json_bytes: int = MAX_JSON_BYTES, max_bytes: int | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     decide: Callable[[int], ColumnSink | None] | None = None,
                     ) -> tuple[TableBuilder, dict[str, Any], DecodeStats, int]:
    """The file decoded in one stream, in this process: (builder, metadata, counters, JSON bytes).
    ``decide``: asked as the table grows whether its columns go on to disk
    (:func:`stepscope.traces.spill.sink_for`)."""
    builder = TableBuilder()
    builder.sink_decision = decide
    store = partial(_store, path)
    meta, stats, json_bytes = _decode(path, lambda batch, stats: store(builder, batch, stats), progress,
                                      max_json_bytes, max_bytes)
    return builder, meta, stats, json_bytes


class _ShortOfMemory(Exception):
    """A child decoding ahead found that the table would have to go to disk."""


def _refuse_to_spill(table_bytes: int) -> ColumnSink | None:
    if sink_for(table_bytes) is not None:
        raise _ShortOfMemory
    return None


def decode_ahead(path: str, max_json_bytes: int = MAX_JSON_BYTES, max_bytes: int | None = None,
                 ) -> tuple[TableBuilder, dict[str, Any], DecodeStats, int]:
    """:func:`decode_streaming` for a child decoding ahead (:mod:`stepscope.traces.ahead`): it gives up
    where the table would have to go to disk (the child hands its columns over in memory), and the
    command then decodes the file itself, to disk; where memory is plentiful it is the same decode."""
    return decode_streaming(path, max_json_bytes, max_bytes, decide=_refuse_to_spill)


def _store(path: str, builder: TableBuilder, batch: Any, stats: DecodeStats) -> None:
    """One decoded batch into the builder's columns."""
    if isinstance(batch, ScannedBatch):  # read by the C scanner; a batch it declines: as msgspec decodes it
        if builder.add_scanned(batch.parsed):
            builder.maybe_flush()
            return
        try:
            decoded = typed.decode_typed(batch.piece)
        except typed.DecodeError:
            decoded = None  # orjson decides below
        if decoded is not None:
            batch = decoded
    if isinstance(batch, TypedBatch | ScannedBatch):  # streamed with a schema; a batch with odd events: as dicts
        if isinstance(batch, TypedBatch) and builder.add_typed(batch.events):
            builder.maybe_flush()
            return
        batch = dicts_of(batch, stats)
    if not isinstance(batch, list):
        raise InputError(path, "'traceEvents' is not a list; this is not a Kineto trace")
    builder.add_batch(batch)
    builder.maybe_flush()


def cut_in_ranges(size: int) -> bool:
    """A file of ``size`` bytes is large enough to be decoded in byte ranges (two of them at least;
    an uncompressed one, with ``workers`` > 1: :mod:`stepscope.traces.split_load`)."""
    return size >= 2 * limits.SPLIT_PART_MIN_BYTES


def _decode_split(path: str, workers: int, store: Callable[[TableBuilder, Any, DecodeStats], None],
                  progress: Callable[[int, int], None] | None, max_json_bytes: int, max_bytes: int | None,
                  ) -> tuple[TableBuilder, dict[str, Any], DecodeStats, int] | None:
    """The file decoded in byte ranges on ``workers`` processes, or None where that does not apply (a
    gzip file, one too small to split, any doubt: :mod:`stepscope.traces.split_load`)."""
    size = _file_size(path)
    if size > max_json_bytes or not cut_in_ranges(size):
        return None  # refused by the streaming decode, with the reason; or not worth cutting
    from stepscope.traces.split_load import decode_split

    limit = limits.max_bytes() if max_bytes is None else max_bytes
    done = decode_split(path, size, workers, store, limit, progress)
    return None if done is None else (*done, size)


def load_raw_events(path: str | Path, max_bytes: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The trace's events as the dicts the file holds, and its top-level metadata, decoded under
    the same guards as :func:`load_trace` (for exports that copy events unchanged: the Perfetto
    timeline). Raises :class:`~stepscope.errors.InputError` like it."""
    path = str(path)
    events: list[dict[str, Any]] = []

    def add(batch: Any, _stats: DecodeStats) -> None:  # decoded into dicts (typed_batches=False below)
        if not isinstance(batch, list):
            raise InputError(path, "'traceEvents' is not a list; this is not a Kineto trace")
        events.extend(item for item in batch if isinstance(item, dict))

    meta, _, _ = _decode(path, add, None, MAX_JSON_BYTES, max_bytes, typed_batches=False)
    return events, meta


def _decode(path: str, on_batch: Callable[[Any, DecodeStats], None], progress: Callable[[int, int], None] | None,
            max_json_bytes: int, max_bytes: int | None, typed_batches: bool = True,
            ) -> tuple[dict[str, Any], DecodeStats, int]:
    """Stream the file's event batches into ``on_batch``; returns (metadata, stats, JSON bytes)."""
    size = _file_size(path)
    limit = limits.max_bytes() if max_bytes is None else max_bytes
    if size == 0:
        raise InputError(path, "the file is empty (a crashed profiler leaves 0-byte traces); re-record it")
    stats = DecodeStats()
    meta: dict[str, Any] = {}
    saw_events = False
    any_event = False
    tracker = _Progress(progress, size)
    try:
        with no_cycle_scans(), open_binary(path) as stream:  # millions of acyclic objects (stepscope.heap)
            tracker.raw = getattr(stream, "fileobj", None) or stream
            guard = _GuardedStream(stream, max_json_bytes, path, limit, tracker.raw if tracker.raw is not stream else None)
            for kind, payload in iter_event_batches(guard, stats, tracker, max_bytes=limit,  # type: ignore[arg-type]
                                                    typed_batches=typed_batches):
                if kind == "events":
                    saw_events = True
                    any_event = any_event or bool(payload)  # a list, or a batch of its length
                    on_batch(payload, stats)
                else:
                    meta = payload
            json_bytes = guard.total
    except LimitExceeded as exc:
        raise limits.too_large(path, exc.what, exc.limit, exc.position) from None
    except DecodeFailure as exc:
        raise InputError(path, f"not valid trace JSON: {exc}", position=exc.position) from None
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(path, f"cannot read or decompress the file ({exc})") from None
    if not saw_events and "traceEvents" not in meta:
        raise InputError(path, "JSON without 'traceEvents': not a torch.profiler (Kineto) trace")
    if not any_event:
        what = "the JSON array holds no events" if stats.bare_array else "'traceEvents' is present but empty"
        raise InputError(path, f"{what}: the profiler recorded nothing (it was stopped before an active step, "
                               "or its schedule never reached one); record at least one active step and export again")
    return meta, stats, json_bytes


class _GuardedStream:
    """Counts decompressed bytes and refuses documents above the size guard."""

    def __init__(self, stream: Any, limit: int, path: str, max_bytes: int = limits.DEFAULT_MAX_BYTES,
                 raw: Any = None) -> None:
        self.stream, self.limit, self.path, self.total = stream, limit, path, 0
        self.max_bytes, self.raw = max_bytes, raw  # raw: the compressed file, for the ratio guard

    def read(self, size: int) -> bytes:
        block: bytes = self.stream.read(size)
        self.total += len(block)
        if self.raw is not None and self.total > self.max_bytes:
            limits.check_ratio(self.path, "the trace", self.total, self.raw.tell(), self.max_bytes)
        if self.total > self.limit:
            raise InputError(
                self.path,
                f"the trace is larger than {self.limit / 1024**3:.0f} GiB of JSON; "
                "record fewer steps (torch.profiler schedule active=1) or split it",
            )
        return block


def _check_step_numbers(events: EventTable, path: str) -> None:
    """Step numbers (``ProfilerStep#N``) must fit in int64: the analyses index arrays with them."""
    symbols = events.symbols
    for ident in symbols.ids_where(lambda text: text.startswith("ProfilerStep#")):
        suffix = symbols.strings[ident].split("#", 1)[1]
        try:
            number = int(suffix)
        except ValueError:
            continue
        if abs(number) >= 2**62:
            raise InputError(path, f"step number {suffix[:30]}{'…' if len(suffix) > 30 else ''} in "
                             f"'ProfilerStep#' is beyond 2^62: the trace is damaged")


def _warnings(builder: TableBuilder, stats: DecodeStats) -> tuple[str, ...]:
    out = [f"skipped {n} event(s): {why}" for why, n in sorted(builder.counts.skipped.items())]
    if stats.replaced_utf8:
        out.append("invalid UTF-8 bytes were replaced by U+FFFD")
    return tuple(out)


def _rank_of(meta: dict[str, Any], path: str) -> tuple[int | None, str]:
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and type(info.get("rank")) is int and info["rank"] >= 0:
        return info["rank"], "distributedInfo"
    found = _RANK_IN_NAME.search(os.path.basename(path))
    if found:
        return int(found.group(1)), "file name"
    return None, "order"


def discover_traces(path: str | Path) -> list[str]:
    """Trace files under a directory (not recursive), or ``[path]`` for a file."""
    path = str(path)
    if not os.path.exists(path):
        raise InputError(path, "no such file or directory")
    if not os.path.isdir(path):
        return [path]
    files = sorted(
        os.path.join(path, name)
        for name in os.listdir(path)
        if name.endswith(TRACE_SUFFIXES) and os.path.isfile(os.path.join(path, name))
    )
    if not files:
        raise InputError(path, "the directory holds no .json or .json.gz trace files")
    return files


def load_traces(
    paths: list[str], progress: Callable[[str, int, int], None] | None = None
) -> list[LoadedTrace]:
    """Load several per-rank files; ranks must be distinct (see module docstring)."""
    loaded: list[LoadedTrace] = []
    for index, file_path in enumerate(paths):
        callback = None if progress is None else (lambda d, t, p=file_path: progress(p, d, t))
        loaded.append(load_trace(file_path, rank=index, progress=callback))
    seen: dict[int, str] = {}
    for trace in loaded:
        if trace.rank in seen and len(loaded) > 1:
            raise InputError(
                trace.path,
                f"rank {trace.rank} (from {trace.rank_source}) is also claimed by {seen[trace.rank]}; "
                "pass traces of one job, one file per rank",
            )
        seen[trace.rank] = trace.path
    return sorted(loaded, key=lambda t: t.rank)
