"""The C scanner (``stepscope.traces._scan``) gives the very tables of the typed (msgspec) decode:
every reference trace, column by column, symbol by symbol; a batch it reads is one msgspec reads
the same way, mutated or hostile bytes included; and what it cannot read goes the typed way."""

from __future__ import annotations

import dataclasses
import json
import random

import msgspec
import numpy as np
import pytest

from stepscope.traces import typed
from stepscope.traces.decode import DecodeStats, open_binary
from stepscope.traces.events import TableBuilder
from stepscope.traces.load import load_trace
from tests.unit.analysis.reference_traces import _rel, _root, kineto_trace_names

pytestmark = pytest.mark.skipif(typed.SCAN is None, reason="the C scanner is not built")

RESNET = "kineto_tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


def _same_tables(a, b) -> None:
    for field in dataclasses.fields(a.events):
        if field.name != "symbols":
            assert np.array_equal(getattr(a.events, field.name), getattr(b.events, field.name), equal_nan=True), \
                field.name
    assert a.events.symbols.strings == b.events.symbols.strings
    for field in dataclasses.fields(a.memory):
        assert np.array_equal(getattr(a.memory, field.name), getattr(b.memory, field.name), equal_nan=True)
    assert a.warnings == b.warnings and a.meta == b.meta and a.decode_path == b.decode_path


def _counting_scanner(monkeypatch) -> list[bool]:
    """Each batch offered to the scanner: whether it read it."""
    taken: list[bool] = []
    scan = typed.SCAN

    class Counting:
        Scanner = scan.Scanner

        @staticmethod
        def parse(piece):
            parsed = scan.parse(piece)
            taken.append(parsed is not None)
            return parsed

    monkeypatch.setattr(typed, "SCAN", Counting)
    return taken


@pytest.mark.parametrize("rel", kineto_trace_names())
def test_every_reference_trace_gives_the_typed_tables(rel, monkeypatch):
    path = _root(_rel(rel)) / _rel(rel)
    taken = _counting_scanner(monkeypatch)
    scanned = load_trace(path)
    monkeypatch.setattr(typed, "SCAN", None)
    _same_tables(scanned, load_trace(path))
    if path.stat().st_size > 2 * 1024 * 1024:  # streamed in batches: the scanner read most of them
        assert taken.count(True) >= 0.8 * len(taken) > 0


def _pieces(rel: str, limit: int = 3) -> list[bytes]:
    """The first batches the streaming decode cuts from a reference trace."""
    from stepscope.traces.decode import iter_event_batches

    pieces: list[bytes] = []
    original = typed.decode_batch

    def keep(piece):
        pieces.append(bytes(piece))
        return original(piece)

    typed.decode_batch = keep
    try:
        with open_binary(str(_root(rel) / rel)) as stream:
            for _ in iter_event_batches(stream, DecodeStats()):
                if len(pieces) >= limit:
                    break
    finally:
        typed.decode_batch = original
    return pieces


def _state(builder: TableBuilder) -> tuple:
    return ({k: bytes(v) for k, v in builder.buffers().items()}, list(builder.symbols.strings),
            dict(builder.counts.ignored), dict(builder.counts.skipped))


def _both_ways(piece: bytes) -> tuple[tuple | None, tuple | None]:
    """(the scanner's builder state or None where it declines, msgspec's or None where it declines)."""
    parsed = typed.SCAN.parse(bytearray(piece))
    scanned = None
    if parsed is not None:
        builder = TableBuilder()
        scanned = _state(builder) if builder.add_scanned(parsed) else ("declined", *_state(builder)[1:2])
    try:
        batch = typed.decode_typed(piece)
    except msgspec.DecodeError:
        assert parsed is None, "the scanner read bytes msgspec calls malformed"
        return scanned, None
    builder = TableBuilder()
    if batch is None:
        return scanned, None
    typed_state = _state(builder) if builder.add_typed(batch.events) else ("declined", *_state(builder)[1:2])
    return scanned, typed_state


def test_a_batch_reads_as_msgspec_reads_it():
    piece = _pieces(RESNET, 1)[0]
    scanned, typed_state = _both_ways(piece)
    assert scanned is not None and scanned == typed_state
    assert len(scanned[0]["name"]) > 1000


def test_mutated_batches_are_declined_or_read_as_msgspec_reads_them():
    """Random damage to a real batch: the scanner never reads what msgspec refuses, and what it
    reads gives msgspec's columns (the same symbols, the same declines)."""
    base = _pieces(RESNET, 1)[0][:60000]
    base = base[: base.rindex(b"},") + 1] + b"]"
    rng = random.Random(7)
    inserts = [b"\\", b'"', b"e5", b"\x00", "é".encode(), b"\xff", b"}", b"{", b",", b"1" * 20, b" ", b"-", b".",
               b'"ph":"i",', b'"name":"x",', b"null", b"[", b"]"]
    read = declined = 0
    for _ in range(400):
        data = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.4:
                data[at:at] = rng.choice(inserts)
            elif choice < 0.7:
                data[at] = rng.randrange(256)
            elif choice < 0.85:
                del data[at: at + rng.randint(1, 8)]
            else:
                data = data[:at]
        scanned, typed_state = _both_ways(bytes(data))
        if scanned is None:
            declined += 1
            continue
        read += 1
        assert typed_state is not None and scanned == typed_state
    assert read > 50 and declined > 50  # both sides of the contract were exercised


def _event(**fields) -> dict:
    event = {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 10, "dur": 5,
             "args": {"External id": 3}}
    event.update(fields)
    return event


def _piece(*events, raw: bytes | None = None) -> bytes:
    return raw if raw is not None else json.dumps(list(events)).encode()


@pytest.mark.parametrize("piece", [
    _piece(_event(name="a\\nb")),  # an escape in a string the tables read
    _piece(raw=b'[{"ph":"X","name":"n","pid":1,"tid":2,"ts":1e3,"dur":5,"args":{}}]'),  # an exponent
    _piece(raw=b'[{"ph":"X","name":"n","name":"m","pid":1,"tid":2,"ts":1,"dur":5,"args":{}}]'),  # a field twice
    _piece(_event(ph="i")),  # an instant with a duration: the typed path decides
    _piece(_event(ph="i", dur=None, name=None)), _piece(_event(ph="b", dur=None)),
    _piece(raw=b'[{"ph":"i","name":"[memory]","pid":1,"ts":1,"args":{"Bytes":8}}]'),  # a [memory] without a thread
    _piece(_event(pid=1.5)), _piece(_event(pid=True)), _piece(_event(args=None)), _piece(_event(ts="1")),
    _piece(_event(args={"correlation": 12345678901234567890})),  # beyond 18 digits
    _piece(_event(args={"deep": json.loads("[" * 80 + "]" * 80)})),
    _piece(raw=b'[{"ph":"X","name":"\xff","pid":1,"tid":2,"ts":1,"dur":5,"args":{}}]'),  # not UTF-8
    _piece(raw=b'[{"ph":"X","name":"\xed\xa0\x80","pid":1,"tid":2,"ts":1,"dur":5,"args":{}}]'),  # a surrogate
    _piece(raw=b'[{"ph":"X","name":"n","pid":1,"tid":2,"ts":1,"dur":5,"args":{}}] x'),
    _piece(raw=b'[{"ph":"X","name":"n","pid":01,"tid":2,"ts":1,"dur":5,"args":{}}]'),
    _piece(raw=b"[]"), _piece(raw=b"[1]"), _piece(raw=b'[{"ph":"X"'),
])
def test_what_the_scanner_leaves_to_msgspec(piece):
    assert typed.SCAN.parse(bytearray(piece)) is None


@pytest.mark.parametrize("text", ["0.1", "1661203463292512.5", "123.456789012345678", "-0.0", "0.000001",
                                  "99999999999999.99", "1661203463292512", "-7", "3.14159265358979323846"])
def test_times_are_read_as_msgspec_reads_them(text):
    raw = f'[{{"ph":"X","name":"n","pid":1,"tid":2,"ts":{text},"dur":{text.lstrip("-")},"args":{{}}}}]'.encode()
    scanned, typed_state = _both_ways(raw)
    assert scanned == typed_state and scanned is not None
    ts = np.frombuffer(scanned[0]["ts"], dtype=np.float64)
    assert ts.tobytes() == np.array([float(text)]).tobytes()  # the same double, the sign of zero included


def test_odd_but_valid_fields_are_read_as_msgspec_reads_them():
    events = [_event(name="données ⚡", pid="Spans", tid="stream 7", cat=None,
                     args={"Input Dims": [[1, 2], []], "Call stack": "a.py(3): f", "external id": 9,
                           "unknown": {"nested": ["\\u00e9", 1e300, -0.5e-3, True, None]},
                           "wait_on_stream": 7, "blocks per SM": 1.5}),
              _event(ph="M", name="process_name", args={"name": "python"}),
              _event(ph="f", args={}), _event(args={"Input Dims": None, "External id": None})]
    scanned, typed_state = _both_ways(json.dumps(events, ensure_ascii=False).encode())
    assert scanned is not None and scanned == typed_state
    assert "données ⚡" in scanned[1] and "[[1,2],[]]" in scanned[1]
    assert scanned[2] == {"M": 1, "f": 1}


def test_instants_are_counted_and_memory_instants_read_as_msgspec_reads_them():
    events = [_event(), _event(ph="i", dur=None, name="[memory]", tid=9,
                              args={"Bytes": 512, "Total Allocated": 1024.5, "Device Type": 1, "Device Id": 0,
                                    "Addr": 123456789, "Total Reserved": None}),
              _event(ph="I", dur=None, name="marker"), _event(ph="f", args={}),
              _event(ph="i", dur=None, name="[memory]", tid="t", args={"Bytes": -512})]
    scanned, typed_state = _both_ways(json.dumps(events).encode())
    assert scanned is not None and scanned == typed_state
    assert scanned[2] == {"f": 1, "instant": 1}
    assert np.frombuffer(scanned[0]["memory.nbytes"], dtype=np.float64).tolist() == [512.0, -512.0]
    assert np.frombuffer(scanned[0]["memory.addr"], dtype=np.int64).tolist() == [123456789, -1]  # -1: absent


def test_a_batch_the_columns_decline_goes_the_typed_way(tmp_path, monkeypatch):
    """Read by the scanner, declined by the column checks (a negative duration): the typed and then
    the careful path take it, and the table is the one without the scanner."""
    events = [_event(ts=float(i), args={"External id": i}) for i in range(20000)]
    events[4000]["dur"] = -1
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    taken = _counting_scanner(monkeypatch)
    scanned = load_trace(path)
    monkeypatch.setattr(typed, "SCAN", None)
    plain = load_trace(path)
    _same_tables(scanned, plain)
    assert any(taken) and len(scanned.events) == 19999


def test_a_build_of_other_source_or_the_switch_leaves_the_scanner_out(monkeypatch):
    """The loader's C extensions are used only when built from the source beside them: a stale
    build, STEPSCOPE_PURE_PYTHON or a missing build each mean the Python (msgspec) path."""
    from stepscope.traces import _scan, native

    assert native.usable(_scan) is _scan
    monkeypatch.setattr(_scan, "SOURCE_SHA", "0" * 16)
    assert native.usable(_scan) is None
    monkeypatch.undo()
    monkeypatch.setenv("STEPSCOPE_PURE_PYTHON", "1")
    assert native.usable(_scan) is None and typed._scanner() is None
    assert native.usable(None) is None
