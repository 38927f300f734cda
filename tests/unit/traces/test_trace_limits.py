"""Decoding stays linear and bounded: gzip bombs, huge events and whitespace runs are refused fast.

Bounds are loose on purpose (a loaded 2-core machine): the failures they catch are quadratic time
(minutes) and memory proportional to the inflated size (GiBs).
"""

from __future__ import annotations

import gzip
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from stepscope import limits
from stepscope.errors import InputError, UsageError
from stepscope.record.samples import load_samples
from stepscope.record.store import load_record
from stepscope.traces import decode
from stepscope.traces.load import load_trace

HOSTILE = Path(__file__).resolve().parents[2] / "data" / "hostile"
sys.path.insert(0, str(HOSTILE))
import generate  # noqa: E402

VALID_RECORD = HOSTILE / "valid_run" / "record.rank0.json.gz"
MIB = 1024 * 1024


def _bounded(load, *, limit_mib: int, seconds: float = 60.0):
    """Run ``load``; it must raise InputError within ``seconds``, allocating < 8x the limit."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InputError) as caught:
            load()
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < seconds, elapsed
    assert peak < 8 * limit_mib * MIB, peak / MIB
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_whitespace_bomb_is_refused_in_bounded_time_and_memory(tmp_path):
    path = generate.whitespace_trace(tmp_path / "bomb.json.gz", gib=5)
    assert path.stat().st_size < 8 * MIB  # 5 GiB of whitespace behind it
    message = _bounded(lambda: load_trace(path, max_bytes=8 * MIB), limit_mib=8)
    assert str(path) in message and "--max-bytes" in message


def test_whitespace_bomb_with_the_default_limit(tmp_path):
    path = generate.whitespace_trace(tmp_path / "bomb.json.gz", gib=5)
    started = time.perf_counter()
    with pytest.raises(InputError, match="exceeds the limit of 64 MiB|inflates more than 200:1"):
        load_trace(path)
    assert time.perf_counter() - started < 60


def test_leading_whitespace_bomb(tmp_path):
    path = generate.leading_whitespace_trace(tmp_path / "lead.json.gz", gib=5)
    _bounded(lambda: load_trace(path, max_bytes=8 * MIB), limit_mib=8)


def test_an_event_larger_than_the_limit_is_refused(tmp_path):
    packed = generate.huge_event_trace(tmp_path / "event.json.gz", mib=200)
    _bounded(lambda: load_trace(packed, max_bytes=16 * MIB), limit_mib=16)
    plain = tmp_path / "event.json"  # no gzip, so no inflation to see: the event's size itself
    plain.write_bytes(gzip.decompress(generate.huge_event_trace(tmp_path / "e.json.gz", mib=24).read_bytes()))
    message = _bounded(lambda: load_trace(plain, max_bytes=8 * MIB), limit_mib=8)
    assert "one trace event" in message


def test_a_large_event_within_the_limit_decodes_in_linear_time(tmp_path, monkeypatch):
    # 32 MiB read 4 KiB at a time: re-copying the buffer on every read was ~8000 copies of ~16 MiB
    monkeypatch.setattr(decode, "CHUNK_BYTES", 4096)
    name = "x" * (32 * MIB)
    path = tmp_path / "big.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 2, '
                    f'"name": "{name}"}}, {{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 5, "dur": 1, '
                    '"name": "small"}]}')
    started = time.perf_counter()
    trace = load_trace(path, max_bytes=64 * MIB)
    assert time.perf_counter() - started < 30
    assert len(trace.events) == 2


def test_whitespace_between_events_decodes_in_linear_time(tmp_path, monkeypatch):
    monkeypatch.setattr(decode, "CHUNK_BYTES", 4096)
    event = '{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "name": "a"}'
    path = tmp_path / "spaced.json"
    path.write_text('{"traceEvents": [' + event + "," + " " * (24 * MIB) + event + "]}")
    started = time.perf_counter()
    assert len(load_trace(path, max_bytes=64 * MIB).events) == 2
    assert time.perf_counter() - started < 30


def test_a_bomb_of_valid_events_is_refused_by_its_inflation(tmp_path):
    event = b'{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "name": "aten::mm"},'
    path = generate._members(tmp_path / "events.json.gz", b'{"traceEvents": [', event * (MIB // len(event)),
                             2048, event[:-1] + b"]}")
    message = _bounded(lambda: load_trace(path, max_bytes=8 * MIB), limit_mib=32)
    assert "inflates more than 200:1" in message


def test_record_bombs_are_refused(tmp_path):
    for make in (generate.zeros_record, generate.whitespace_record):
        record = make(tmp_path / make.__name__, gib=5)
        message = _bounded(lambda: load_record(record.parent), limit_mib=64)  # the default limit
        assert "run record" in message and "exceeds the limit of 64 MiB" in message


def test_samples_bombs_are_refused(tmp_path):
    for make in (generate.zeros_samples, generate.note_flood_samples):
        samples = make(tmp_path / make.__name__, VALID_RECORD, gib=5)
        message = _bounded(lambda: load_samples(samples, max_bytes=2 * MIB), limit_mib=2)
        assert "samples" in message


def test_limit_from_the_environment_and_sizes(monkeypatch):
    assert limits.parse_size("512M") == 512 * MIB and limits.parse_size("2GiB") == 2 * 1024 * MIB
    assert limits.parse_size("4096") == 4096
    for bad in ("", "-1", "0", "lots", "1.5G"):
        with pytest.raises(UsageError):
            limits.parse_size(bad)
    monkeypatch.setenv(limits.ENV_VAR, "1K")
    assert limits.max_bytes() == 1024
    monkeypatch.setenv(limits.ENV_VAR, "nonsense")
    with pytest.raises(UsageError, match=limits.ENV_VAR):
        limits.max_bytes()


def test_gzip_members_and_plain_records_read_whole(tmp_path):
    path = tmp_path / "r.gz"
    path.write_bytes(gzip.compress(b'{"a":') + gzip.compress(b"1}"))
    assert limits.read_gzip_or_plain(path, MIB, "record") == b'{"a":1}'
    path.write_bytes(b'{"a": 1}')
    assert limits.read_gzip_or_plain(path, MIB, "record") == b'{"a": 1}'
    with pytest.raises(InputError, match="exceeds the limit"):
        limits.read_gzip_or_plain(path, 4, "record")


def test_damage_early_in_a_trace_larger_than_the_limit_is_named_as_damage(tmp_path):
    event = '{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "name": "a%d"}'
    events = [event % index for index in range(30_000)]
    events[100] = events[100].replace('"ts"', '"ts" "x"')
    path = tmp_path / "damaged.json"
    path.write_text('{"traceEvents": [' + ",".join(events) + "]}")
    with pytest.raises(InputError, match=r"\(at \d+\): not valid trace JSON: the traceEvents array is damaged"):
        load_trace(path, max_bytes=MIB)
