"""Property test: damaged real traces never crash with a traceback (success or InputError only).

Mutations of a real recorded trace: truncation, byte flips, insertions and deletions, structural
edits of the decoded document (wrong types, missing fields, absurd values), and gzip damage.
Whatever loads must also survive every analysis.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analysis.trace.rank_analysis import analyze_rank
from stepscope.errors import InputError
from stepscope.traces.load import load_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
RAW = (DATA / "cpu_plain.pt.trace.json").read_bytes()
DOC = json.loads(RAW)
WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False), st.text(max_size=5), st.lists(st.integers(), max_size=2), st.builds(dict),
)


def _check(data: bytes, suffix: str = ".json") -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"trace{suffix}"
        path.write_bytes(data)
        try:
            trace = load_trace(path)
        except InputError as exc:
            assert str(path) in str(exc)
            return
        analyze_rank(trace)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_byte_mutations(data):
    raw = bytearray(RAW)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
        pos = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if kind == "truncate":
            del raw[pos:]
        elif kind == "flip" and raw:
            raw[pos] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif raw:
            del raw[pos : pos + data.draw(st.integers(1, 16))]
    _check(bytes(raw))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_structural_mutations(data):
    doc = json.loads(json.dumps(DOC))
    events = doc["traceEvents"]
    for _ in range(data.draw(st.integers(1, 6))):
        event = events[data.draw(st.integers(0, len(events) - 1))]
        if not isinstance(event, dict):
            continue
        key = data.draw(st.sampled_from(["ts", "dur", "name", "cat", "ph", "pid", "tid", "args"]))
        if data.draw(st.booleans()):
            event.pop(key, None)
        else:
            event[key] = data.draw(WEIRD)
        if isinstance(event.get("args"), dict):
            arg = data.draw(st.sampled_from(["External id", "correlation", "stream", "Input Dims", "Bytes"]))
            event["args"][arg] = data.draw(WEIRD)
    if data.draw(st.booleans()):
        doc["traceEvents"] = data.draw(st.sampled_from([None, 3, "x", {}, events[:1]]))
    _check(json.dumps(doc).encode())


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2000), st.integers(0, 255))
def test_gzip_damage(pos, value):
    packed = bytearray(gzip.compress(RAW))
    packed[pos % len(packed)] = value
    _check(bytes(packed), ".json.gz")


SHARED_GPU = DATA / "reference" / "hta" / "critical_path" / "cuda_event_sync" / "event_sync_trace.json.gz"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_gpu_trace_mutations(data):
    doc = json.loads(gzip.decompress(SHARED_GPU.read_bytes()))
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    for _ in range(data.draw(st.integers(1, 8))):
        event = events[data.draw(st.integers(0, len(events) - 1))]
        key = data.draw(st.sampled_from(["ts", "dur", "name", "cat", "pid", "tid"]))
        event[key] = data.draw(WEIRD)
        args = event.setdefault("args", {})
        if isinstance(args, dict):
            arg = data.draw(st.sampled_from(["correlation", "stream", "External id", "blocks per SM", "device"]))
            args[arg] = data.draw(WEIRD)
    doc["traceEvents"] = events
    _check(json.dumps(doc).encode())
