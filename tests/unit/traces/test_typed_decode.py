"""The typed (msgspec) decode gives the very tables of the dict (orjson) decode: every reference
trace, column by column, symbol by symbol, with the same warnings; a batch it cannot take goes the
careful way."""

from __future__ import annotations

import dataclasses
import gzip
import json

import numpy as np
import pytest

from stepscope.traces import typed
from stepscope.traces.load import load_trace
from tests.unit.analysis.reference_traces import _rel, _root, kineto_trace_names

pytestmark = pytest.mark.skipif(not typed.AVAILABLE, reason="msgspec is not installed")


def _tables(path, monkeypatch, use_typed: bool):
    monkeypatch.setattr(typed, "AVAILABLE", use_typed)
    trace = load_trace(path)
    return trace


def _same(a, b) -> None:
    for field in dataclasses.fields(a.events):
        if field.name == "symbols":
            continue
        assert np.array_equal(getattr(a.events, field.name), getattr(b.events, field.name), equal_nan=True), field.name
    assert a.events.symbols.strings == b.events.symbols.strings
    for field in dataclasses.fields(a.memory):
        assert np.array_equal(getattr(a.memory, field.name), getattr(b.memory, field.name), equal_nan=True), field.name
    assert a.warnings == b.warnings and a.meta == b.meta


@pytest.mark.parametrize("rel", kineto_trace_names())
def test_every_reference_trace_gives_the_same_tables(rel, monkeypatch):
    path = _root(_rel(rel)) / _rel(rel)
    _same(_tables(path, monkeypatch, True), _tables(path, monkeypatch, False))


def test_odd_events_in_a_batch_take_the_careful_path(tmp_path, monkeypatch):
    events = [{"ph": "X", "name": f"op{i}", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 10.0 * i, "dur": 5,
               "args": {"External id": i, "Input Dims": [[2, 3], []]}} for i in range(2000)]
    events[700]["dur"] = -1  # skipped and counted
    events[900]["args"] = {"correlation": "7"}  # a string where an int is usual: decoded, converted
    events.append({"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 5.0,
                   "args": {"Bytes": 512, "Total Allocated": 512, "Device Type": 0, "Addr": 123}})
    events.append({"ph": "b", "name": "async", "pid": 1, "tid": 2, "ts": 1.0, "id": 3})
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=1))  # spaced: Input Dims interned as orjson writes it
    with_typed, without = _tables(path, monkeypatch, True), _tables(path, monkeypatch, False)
    _same(with_typed, without)
    assert len(with_typed.events) == 1999 and len(with_typed.memory.ts) == 1
    assert with_typed.events.symbols.decode(int(with_typed.events.input_dims[0])) == "[[2,3],[]]"


def test_a_gzip_trace_streams_typed_batches(tmp_path, monkeypatch):
    events = [{"ph": "X", "name": "k", "cat": "kernel", "pid": 0, "tid": 7, "ts": float(i), "dur": 0.5,
               "args": {"correlation": i, "stream": 7, "device": 0}} for i in range(40000)]
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    seen = []
    original = typed.decode_batch

    def spy(piece):
        batch = original(piece)  # the C scanner's, or msgspec's
        seen.append(batch is not None)
        return batch

    monkeypatch.setattr(typed, "decode_batch", spy)
    trace = load_trace(path)
    assert len(trace.events) == 40000 and seen and all(seen)
