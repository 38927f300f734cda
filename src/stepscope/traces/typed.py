"""Typed decoding of a batch of trace events with msgspec: only the fields the tables need.

Contract: :func:`decode_typed` turns the JSON array of one batch (as cut by
:mod:`~stepscope.traces.decode`) into a :class:`TypedBatch` of ``msgspec.Struct`` events, or
returns ``None`` when the batch is valid JSON but not of the usual shape (a field of an odd type,
an integer beyond 64 bits, an element that is not an object): the caller then decodes it with
orjson into dicts and takes the careful path, which skips and counts damaged events. Bytes that are
not JSON raise :class:`msgspec.DecodeError`.

:func:`decode_batch` first offers the batch to the C scanner (:mod:`stepscope.traces._scan`),
which reads a batch of the usual shape from its bytes into columns without creating the structs
(a :class:`ScannedBatch`); whatever it does not take is decoded as above.

Why: decoding with a schema skips every key the tables do not read and builds no dict per event.
On the reference traces' complete events it runs at 134–217 MB/s here, against 52–59 MB/s for
``orjson.loads`` (BENCHMARKS.md, "Trace analysis"). :class:`TypedBatch` keeps the batch's bytes so
that a batch with events the typed path does not handle can still be decoded the other way.
"""

from __future__ import annotations

from typing import Any, Union

from stepscope.traces.native import usable

try:
    import msgspec
except ImportError:  # optional: without it every batch takes the orjson path
    AVAILABLE = False
else:
    AVAILABLE = True

__all__ = ["AVAILABLE", "SCAN", "DecodeError", "ScannedBatch", "TypedBatch", "decode_batch", "decode_typed"]

if AVAILABLE:
    DecodeError: type[Exception] = msgspec.DecodeError

    class Args(msgspec.Struct, frozen=True, rename={
        "ext": "External id", "ext_lower": "external id", "corr": "correlation", "bps": "blocks per SM",
        "occ": "est. achieved occupancy %", "dims": "Input Dims", "stack": "Call stack", "nbytes": "Bytes",
        "total_allocated": "Total Allocated", "total_reserved": "Total Reserved", "device_type": "Device Type",
        "device_id": "Device Id", "addr": "Addr", "wait_stream": "wait_on_stream",
        "wait_record": "wait_on_cuda_event_record_corr_id"}):
        ext: Union[int, None] = None
        ext_lower: Union[int, None] = None
        corr: Union[int, None] = None
        stream: Union[int, None] = None
        device: Union[int, None] = None
        bps: Union[float, None] = None
        occ: Union[float, None] = None
        dims: msgspec.Raw = msgspec.Raw()  # empty when absent (a Raw cannot be in a Union)
        stack: Union[str, None] = None
        nbytes: Union[float, None] = None
        total_allocated: Union[float, None] = None
        total_reserved: Union[float, None] = None
        device_type: Union[int, None] = None
        device_id: Union[int, None] = None
        addr: Union[int, None] = None
        wait_stream: Union[int, None] = None
        wait_record: Union[int, None] = None

    NO_ARGS = Args()

    class Event(msgspec.Struct):
        ph: Union[str, None] = None
        name: Union[str, None] = None
        cat: Union[str, None] = None
        pid: Union[int, str, None] = None
        tid: Union[int, str, None] = None
        ts: Union[float, None] = None
        dur: Union[float, None] = None
        args: Args = NO_ARGS

    _DECODER: Any = msgspec.json.Decoder(list[Event])


class TypedBatch:
    """One batch's events as structs, with the bytes they came from."""

    __slots__ = ("events", "piece")

    def __init__(self, events: list[Any], piece: bytes | bytearray):
        self.events, self.piece = events, piece

    def __len__(self) -> int:
        return len(self.events)


class ScannedBatch:
    """One batch read by the C scanner (its events' fields, ``_scan.Parsed``), with its bytes."""

    __slots__ = ("parsed", "piece")

    def __init__(self, parsed: Any, piece: bytes | bytearray):
        self.parsed, self.piece = parsed, piece

    def __len__(self) -> int:
        return len(self.parsed)


def _scanner() -> Any:
    if not AVAILABLE:  # the scanner's fallback is the typed decode
        return None
    try:
        from stepscope.traces import _scan
    except ImportError:
        return None
    return usable(_scan)


#: The C scanner (stepscope/traces/_scan.c) where it is used, else None.
SCAN: Any = _scanner()


def decode_batch(piece: bytes | bytearray) -> ScannedBatch | TypedBatch | None:
    """The batch ``piece`` read by the C scanner where it takes it, else :func:`decode_typed`."""
    if SCAN is not None:
        parsed = SCAN.parse(piece)
        if parsed is not None:
            return ScannedBatch(parsed, piece)
    return decode_typed(piece)


def decode_typed(piece: bytes | bytearray) -> TypedBatch | None:
    """The batch ``piece`` (a JSON array) as a :class:`TypedBatch`; None when it is valid JSON of an
    unusual shape. Raises ``msgspec.DecodeError`` when it is not JSON (a wrong cut, damage)."""
    try:
        return TypedBatch(_DECODER.decode(piece), piece)
    except msgspec.ValidationError:
        return None
