"""Loader: streaming decode equals whole-document decode, rank discovery, and every kind of bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from stepscope.errors import InputError
from stepscope.traces import decode
from stepscope.traces.load import discover_traces, load_trace, load_traces

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
TRAIN = DATA / "cpu_train.pt.trace.json.gz"
PLAIN = DATA / "cpu_plain.pt.trace.json"


def _events(n=3):
    return [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10.5 * i, "dur": 2.25,
         "args": {"External id": i}}
        for i in range(n)
    ]


def _write(tmp_path, doc, name="t.json", gz=False):
    data = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_loads_recorded_traces():
    trace = load_trace(TRAIN)
    assert len(trace.events) > 1000 and len(trace.memory) > 0
    assert trace.rank == 0 and trace.rank_source == "order"
    assert trace.decode_path == "streaming" and trace.warnings == ()
    plain = load_trace(PLAIN)
    assert len(plain.events) > 10


def test_small_chunks_give_identical_tables(monkeypatch):
    whole = load_trace(TRAIN)
    monkeypatch.setattr(decode, "CHUNK_BYTES", 4096)
    chunked = load_trace(TRAIN)
    assert chunked.meta == whole.meta
    for column in ("name", "cat", "ts", "dur", "external_id", "input_dims"):
        a, b = getattr(whole.events, column), getattr(chunked.events, column)
        assert np.array_equal(a, b) or column in ("name", "cat", "input_dims")
    names_a = [whole.events.symbols.strings[i] for i in whole.events.name]
    names_b = [chunked.events.symbols.strings[i] for i in chunked.events.name]
    assert names_a == names_b


def test_top_level_array_and_metadata_after_events(tmp_path):
    path = _write(tmp_path, _events())
    assert len(load_trace(path).events) == 3
    text = '{"traceEvents": ' + json.dumps(_events()) + ', "distributedInfo": {"rank": 5}, "INFO": ["a]", "b}]"]}'
    trace = load_trace(_write(tmp_path, text.encode(), "late.json"))
    assert trace.rank == 5 and trace.rank_source == "distributedInfo" and len(trace.events) == 3


def test_integers_beyond_64_bits(tmp_path):
    events = _events(2)
    events[0]["args"]["Comms Id"] = 2**70
    trace = load_trace(_write(tmp_path, {"traceEvents": events}))
    assert len(trace.events) == 2


def test_rank_from_file_name(tmp_path):
    trace = load_trace(_write(tmp_path, {"traceEvents": _events()}, "job_rank-3.trace.json"), rank=0)
    assert (trace.rank, trace.rank_source) == (3, "file name")
    other = load_trace(_write(tmp_path, {"traceEvents": _events()}, "worker.json"), rank=5)
    assert (other.rank, other.rank_source) == (5, "order")
    loaded = load_traces([str(tmp_path / "job_rank-3.trace.json"), str(tmp_path / "worker.json")])
    assert [(t.rank, t.rank_source) for t in loaded] == [(1, "order"), (3, "file name")]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty"),
        (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur"', "truncated|damaged"),
        (b"this is not json", "not valid trace JSON"),
        (b'{"schemaVersion": 1, "nodes": []}', "not a torch.profiler"),
        (b'{"traceEvents": {"a": 1}}', "not a list"),
        (b"[1, 2, 3]", "not a torch.profiler|no trace events"),
        (b"\x1f\x8b\x08\x00garbage-not-gzip", "decompress"),
        (b'"just a string"', "not an object"),
    ],
)
def test_bad_files_raise_input_error(tmp_path, content, message):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message) as info:
        load_trace(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content", [b'{"traceEvents": []}', b'{"traceEvents": [ ],\n "deviceProperties": []}',
                                     b'{"schemaVersion": 1, "traceEvents": []}' + b" " * 300_000, b"[]"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_an_empty_event_list_is_said_to_be_empty(tmp_path, content, packed):
    path = tmp_path / "empty.json"
    path.write_bytes(gzip.compress(content) if packed else content)
    with pytest.raises(InputError) as info:
        load_trace(path)
    message = str(info.value)
    expected = "the JSON array holds no events" if content == b"[]" else "'traceEvents' is present but empty"
    assert message.startswith(f"{path}: {expected}: the profiler recorded nothing"), message
    assert "without 'traceEvents'" not in message and "\n" not in message


def test_truncated_real_trace_reports_position(tmp_path):
    data = gzip.decompress(TRAIN.read_bytes())
    path = _write(tmp_path, data[: len(data) // 2], "cut.json")
    with pytest.raises(InputError) as info:
        load_trace(path)
    assert info.value.position is not None


def test_non_utf8_bytes_are_replaced_with_a_warning(tmp_path):
    raw = json.dumps({"traceEvents": _events()}).encode().replace(b"op1", b"op\xff1")
    trace = load_trace(_write(tmp_path, raw))
    assert len(trace.events) == 3
    assert any("UTF-8" in w for w in trace.warnings)


def test_damaged_events_are_skipped_and_counted(tmp_path):
    events = _events(3) + [
        {"ph": "X", "cat": "cpu_op", "name": "neg", "pid": 1, "tid": 1, "ts": 5, "dur": -3},
        {"ph": "X", "cat": "cpu_op", "name": "future", "pid": 1, "tid": 1, "ts": 1e19, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": 7, "pid": 1, "tid": 1, "ts": 5, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "str ts", "pid": 1, "tid": 1, "ts": "5", "dur": 3},
        {"ph": "X", "cat": ["x"], "name": "bad cat", "pid": 1, "tid": 1, "ts": 5, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "obj pid", "pid": {}, "tid": 1, "ts": 5, "dur": 3},
        "not an event",
    ]
    trace = load_trace(_write(tmp_path, {"traceEvents": events}))
    assert len(trace.events) == 3
    text = " ".join(trace.warnings)
    for reason in ("negative 'dur'", "absurd 'ts'", "non-string 'name'", "non-string 'cat'", "not a JSON object"):
        assert reason in text


def test_size_guard(tmp_path):
    path = _write(tmp_path, {"traceEvents": _events(50)})
    with pytest.raises(InputError, match="larger than"):
        load_trace(path, max_json_bytes=100)


def test_directories(tmp_path):
    with pytest.raises(InputError, match="no .json"):
        discover_traces(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        discover_traces(tmp_path / "missing")
    a = _write(tmp_path, {"traceEvents": _events(), "distributedInfo": {"rank": 1}}, "a.json")
    b = _write(tmp_path, {"traceEvents": _events(), "distributedInfo": {"rank": 1}}, "b.json", gz=True)
    assert discover_traces(tmp_path) == [str(a), str(b)]
    with pytest.raises(InputError, match="also claimed"):
        load_traces([str(a), str(b)])


def test_progress_reports_growing_byte_counts(monkeypatch):
    monkeypatch.setattr(decode, "CHUNK_BYTES", 16 * 1024)
    seen = []
    load_trace(TRAIN, progress=lambda done, total: seen.append((done, total)))
    assert len(seen) > 3
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert all(total == TRAIN.stat().st_size and done <= total for done, total in seen)
    assert seen[-1][0] == TRAIN.stat().st_size


def test_core_imports_need_neither_torch_nor_rich():
    import subprocess
    import sys

    code = (
        "import sys; import stepscope.analysis.trace.trace_evidence, stepscope.cli.analyze_cmd; "
        "print(sorted(m for m in ('torch', 'rich', 'pandas') if m in sys.modules))"
    )
    src = str(Path(__file__).resolve().parents[3] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": src}, check=True)
    assert out.stdout.strip() == "[]"
