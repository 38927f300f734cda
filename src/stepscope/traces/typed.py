"""Typed decoding of a batch of trace events with msgspec: only the fields the tables need.

Contract: :func:`decode_typed` turns the JSON array of one batch (as cut by
:mod:`~stepscope.traces.decode`) into a :class:`TypedBatch` of ``msgspec.Struct`` events, or
returns ``None`` when the batch is valid JSON but not of the usual shape (a field of an odd type,
an integer beyond 64 bits, an element that is not an object): the caller then decodes it with
orjson into dicts and takes the careful path, which skips and counts damaged events. Bytes that are
not JSON raise :class:`msgspec.DecodeError`.

Why: decoding with a schema skips every key the tables do not read and builds no dict per event.
On the reference traces' complete events it runs at 134–217 MB/s here, against 52–59 MB/s for
``orjson.loads`` (BENCHMARKS.md, "Trace analysis"). :class:`TypedBatch` keeps the batch's bytes so
that a batch with events the typed path does not handle can still be decoded the other way.
"""

from __future__ import annotations

from typing import Any, Union

try:
    import msgspec
except ImportError:  # optional: without it every batch takes the orjson path
    AVAILABLE = False
else:
    AVAILABLE = True

__all__ = ["AVAILABLE", "DecodeError", "TypedBatch", "decode_typed"]

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


def decode_typed(piece: bytes | bytearray) -> TypedBatch | None:
    """The batch ``piece`` (a JSON array) as a :class:`TypedBatch`; None when it is valid JSON of an
    unusual shape. Raises ``msgspec.DecodeError`` when it is not JSON (a wrong cut, damage)."""
    try:
        return TypedBatch(_DECODER.decode(piece), piece)
    except msgspec.ValidationError:
        return None
