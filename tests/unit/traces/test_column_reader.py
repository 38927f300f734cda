"""The C column reader (stepscope/traces/_columns.c) gives the tables of the Python reader of
typed batches: every reference trace, and batches built to hit each of its declines and edge
cases (the same rows, symbols, counts, and the same batches sent the careful way)."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from stepscope.traces import fastpath, typed
from stepscope.traces.load import load_trace
from tests.unit.analysis.reference_traces import _rel, _root, kineto_trace_names
from tests.unit.traces.test_typed_decode import _same

pytestmark = pytest.mark.skipif(fastpath.COLUMNS is None, reason="the C column reader is not built")
C = fastpath.COLUMNS
EV = fastpath._EVENT_FIELDS
AR = fastpath._ARG_FIELDS


def _both(path, monkeypatch):
    with_c = load_trace(path)
    monkeypatch.setattr(fastpath, "COLUMNS", None)
    without = load_trace(path)
    monkeypatch.setattr(fastpath, "COLUMNS", C)
    _same(with_c, without)
    return with_c


@pytest.mark.parametrize("rel", kineto_trace_names())
def test_every_reference_trace_gives_the_python_readers_tables(rel, monkeypatch):
    _both(_root(_rel(rel)) / _rel(rel), monkeypatch)


def _write(tmp_path, events, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _op(i, **args):
    return {"ph": "X", "name": f"op{i % 7}", "cat": "cpu_op", "pid": 1, "tid": 2 + i % 3, "ts": 10.0 * i,
            "dur": 5, "args": args}


def test_edge_cases_of_a_batch(tmp_path, monkeypatch):
    events = [_op(i, **{"External id": i, "Input Dims": [[i % 4, 3]], "Call stack": f"f{i % 5}"}) for i in range(3000)]
    events[10]["args"] = {"External id": 1 << 62, "external id": 3}  # masked: the upper one is used (and declines)
    events[20]["args"] = {"external id": 9}  # the older spelling only
    events[30]["cat"] = None
    events[40]["pid"] = "host"  # pids and tids of both kinds
    events[41]["tid"] = "thread a"
    events[50]["args"] = {"est. achieved occupancy %": 7, "blocks per SM": 1.5}  # an int where floats are usual
    events[60]["args"] = {"wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": 12}
    events += [{"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 1.0 * i,
                "args": {"Bytes": 512, "Total Allocated": 512 * i, "Device Type": 1, "Addr": (1 << 62) + i}}
               for i in range(50)]  # an address beyond 2**62 is stored as -1
    events += [{"ph": "I", "name": "mark", "pid": 1, "tid": 2, "ts": 3.0}, {"ph": "M", "name": "process_name"}]
    trace = _both(_write(tmp_path, events), monkeypatch)
    assert len(trace.memory.ts) == 50 and (trace.memory.addr == -1).all()


@pytest.mark.parametrize("change", [
    {"dur": -1}, {"ts": None}, {"name": None}, {"ts": 1e18}, {"pid": None}, {"tid": 1.5},
])
def test_a_damaged_event_sends_its_batch_the_careful_way(tmp_path, monkeypatch, change):
    events = [_op(i, correlation=i) for i in range(500)]
    events[123].update(change)
    _both(_write(tmp_path, events), monkeypatch)


@pytest.mark.parametrize("instant", [
    {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 1.0, "dur": 3},  # an instant with a duration
    {"ph": "i", "name": None, "pid": 1, "tid": 2, "ts": 1.0},
    {"ph": "I", "name": "[memory]", "pid": 1, "tid": 2, "ts": 1e18},
    {"ph": "q", "name": "unknown phase", "pid": 1, "tid": 2, "ts": 1.0},
])
def test_odd_instants_take_the_careful_path(tmp_path, monkeypatch, instant):
    events = [_op(i) for i in range(100)] + [instant, {"ph": "i", "name": "[memory]", "pid": 1, "tid": "t", "ts": 2.0,
                                                        "args": {"Bytes": 4}}]
    _both(_write(tmp_path, events), monkeypatch)


def test_instants_of_both_spellings_keep_file_order(tmp_path, monkeypatch):
    memory = [{"ph": "i" if i % 2 else "I", "name": "[memory]", "pid": 1, "tid": 2, "ts": 100.0 - i,
               "args": {"Bytes": i}} for i in range(20)]
    trace = _both(_write(tmp_path, [_op(0), *memory]), monkeypatch)
    assert trace.memory.nbytes.tolist() == [float(i) for i in range(20)]  # file order, both spellings mixed


def _events(*dicts):
    return typed._DECODER.decode(json.dumps(list(dicts)).encode())


def test_the_readers_functions_directly():
    events = _events({"ph": "X", "name": "a", "ts": 1, "pid": 3, "tid": "x"},
                     {"ph": "i", "name": None, "ts": 2.5, "pid": 3, "tid": 4})
    assert C.objects(events, EV["name"]) == ["a", None]
    assert C.any_none(events, EV["name"]) and not C.any_none(events, EV["ts"])
    assert C.count_none(events, EV["dur"]) == 2
    assert np.frombuffer(C.floats(events, EV["ts"], False), dtype=np.float64).tolist() == [1.0, 2.5]
    assert C.floats(events, EV["dur"], False) is None
    assert np.isnan(np.frombuffer(C.floats(events, EV["dur"], True), dtype=np.float64)).all()
    ids: dict[str, int] = {}

    def intern(text):
        return ids.setdefault(text, len(ids))

    assert C.symbols(events, EV["name"], ids, intern, False) is None  # a None not allowed
    assert np.frombuffer(C.symbols(events, EV["name"], ids, intern, True), dtype=np.int32).tolist() == [0, -1]
    seen = []
    column = C.scalars(events, EV["tid"], lambda v: seen.append(v) or len(seen) + 10)
    assert np.frombuffer(column, dtype=np.int32).tolist() == [11, 12] and seen == ["x", 4]
    matching, others = C.partition(events, EV["ph"], "X")
    assert matching == [events[0]] and others == [events[1]]
    big = _events({"args": {"Addr": 1 << 62}}, {"args": {"Addr": 5}})
    args = C.objects(big, EV["args"])
    assert C.ints(args, AR["addr"]) is None
    assert np.frombuffer(C.ints(args, AR["addr"], -1), dtype=np.int64).tolist() == [-1, 5]
    raw = _events({"args": {"Input Dims": [[1, 2]]}}, {"args": {"Input Dims": None}}, {"args": {}})
    cache: dict[bytes, int] = {}
    column = C.raw_symbols(C.objects(raw, EV["args"]), AR["dims"], cache, lambda b: 7)
    assert np.frombuffer(column, dtype=np.int32).tolist() == [7, -1, -1] and cache == {b"[[1, 2]]": 7}
    assert C.raw_symbols(C.objects(raw, EV["args"]), AR["dims"], {}, lambda b: None) is None


def test_the_reader_refuses_what_it_cannot_read():
    events = _events({"name": "a"})
    with pytest.raises(TypeError):
        C.objects([*events, "not an event"], EV["name"])
    with pytest.raises(TypeError):
        C.objects(tuple(events), EV["name"])
    with pytest.raises(TypeError):
        C.objects(events, AR["addr"])  # a field of another struct
    with pytest.raises(TypeError):
        C.objects(events, "name")
    with pytest.raises(TypeError):
        C.floats(events, EV["ts"])
    with pytest.raises(ZeroDivisionError):
        C.scalars(_events({"tid": 1}), EV["tid"], lambda v: 1 / 0)
    with pytest.raises(msgspec.ValidationError):
        typed._DECODER.decode(b'[{"tid": true}]')
