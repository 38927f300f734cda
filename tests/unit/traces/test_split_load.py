"""A large uncompressed trace decoded in byte ranges on several processes gives the table of the
streaming decode: every reference trace, row by row (symbols compared as the strings they stand
for), the same memory instants, warnings and metadata, the same analysis; and every doubt — a cut
inside a string or a nested object, damage, a gzip file, a failing worker, no temporary directory —
falls back to the streaming decode, with its error and byte offset."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.trace.rank_analysis import analyze_rank
from stepscope import limits
from stepscope.errors import InputError
from stepscope.traces import split_load
from stepscope.traces.events import SYMBOL_COLUMNS
from stepscope.traces.load import load_trace
from tests.unit.analysis.reference_traces import _rel, _root, kineto_trace_names

SYMBOL_FIELDS = {"name", "cat", "pid", "tid", "input_dims", "call_stack"}


@pytest.fixture
def small_parts(monkeypatch):
    """Every file is worth cutting: ranges of any size."""
    monkeypatch.setattr(limits, "SPLIT_PART_MIN_BYTES", 1)


def _plain_copy(rel: str, tmp_path):
    source = _root(rel) / rel
    target = tmp_path / "trace.json"
    opener = gzip.open if source.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(source, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return target


def _strings(trace, column: np.ndarray) -> list[str]:
    return [trace.events.symbols.decode(int(i)) for i in column]


def _same_tables(a, b) -> None:
    assert len(a.events) == len(b.events)
    for field in dataclasses.fields(a.events):
        if field.name == "symbols":
            continue
        left, right = getattr(a.events, field.name), getattr(b.events, field.name)
        if field.name in SYMBOL_FIELDS:
            assert _strings(a, left) == _strings(b, right), field.name
        else:
            assert left.dtype == right.dtype and np.array_equal(left, right, equal_nan=True), field.name
    for field in dataclasses.fields(a.memory):
        left, right = getattr(a.memory, field.name), getattr(b.memory, field.name)
        if field.name == "tid":
            assert _strings(a, left) == _strings(b, right)
        else:
            assert np.array_equal(left, right, equal_nan=True), field.name
    assert set(a.events.symbols.strings) == set(b.events.symbols.strings)
    assert a.warnings == b.warnings and a.meta == b.meta and list(a.meta) == list(b.meta)
    assert a.rank == b.rank and a.json_bytes == b.json_bytes


@pytest.mark.parametrize("rel", kineto_trace_names())
def test_every_reference_trace_gives_the_same_table_in_three_ranges(rel, tmp_path, small_parts):
    path = _plain_copy(_rel(rel), tmp_path)
    streamed, split = load_trace(path), load_trace(path, workers=3)
    assert streamed.decode_path == "streaming"
    if len(streamed.events) > 100:  # a few-event trace may have no boundary to cut at
        assert split.decode_path == "split"
    _same_tables(streamed, split)


CONTROL = "hta/trace_diff/control/control.json.gz"


@pytest.mark.skipif(not (_root(CONTROL) / CONTROL).is_file(), reason="the shared reference set is not beside the repository")
def test_the_analysis_is_the_same(tmp_path, small_parts):
    path = _plain_copy(CONTROL, tmp_path)
    streamed, split = load_trace(path), load_trace(path, workers=4)
    assert split.decode_path == "split"
    assert analyze_rank(split).to_dict() == analyze_rank(streamed).to_dict()


def _events(n: int, name=lambda i: f"op{i}", args=lambda i: {"External id": i}) -> list[dict]:
    return [{"ph": "X", "name": name(i), "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 10.0 * i, "dur": 5.0,
             "args": args(i)} for i in range(n)]


def _write(path, events, **meta):
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, **meta}))
    return path


def test_cuts_that_land_inside_strings_or_nested_objects_fall_back(tmp_path, small_parts):
    # every event holds "}, {" in its name and in a list of objects: most even offsets find a
    # "boundary" inside an event; the ranges that end there cannot decode as whole events
    events = _events(3000, name=lambda i: f"x}}, {{y{i}", args=lambda i: {"rows": [{"a": i}, {"b": i}]})
    path = _write(tmp_path / "tricky.json", events, traceName="after the array")
    streamed, split = load_trace(path), load_trace(path, workers=8)
    _same_tables(streamed, split)
    assert split.meta["traceName"] == "after the array"


def test_a_cut_inside_a_string_is_never_taken_for_a_boundary(tmp_path, monkeypatch):
    path = _write(tmp_path / "one.json", _events(50, name=lambda i: "a}, {b" if i == 25 else f"op{i}"))

    def cut_inside_the_name(fh, size, parts, max_bytes):
        data = fh.read()
        start = data.index(b"[") + 1
        fake = split_load.BOUNDARY.search(data, data.index(b"a}, {b"))
        return data[: start - 1].rstrip(), [(start, fake.start() + 1, False), (fake.end() - 1, size, True)]

    monkeypatch.setattr(limits, "SPLIT_PART_MIN_BYTES", 1)
    monkeypatch.setattr(split_load, "_plan", cut_inside_the_name)
    split = load_trace(path, workers=2)
    assert split.decode_path == "streaming"  # the first range, ending inside the string, did not decode
    _same_tables(load_trace(path), split)


def test_damage_gives_the_streaming_error_and_offset(tmp_path, small_parts):
    text = json.dumps({"traceEvents": _events(4000)})
    broken = text[: len(text) // 2] + "#" + text[len(text) // 2 + 1:]
    path = tmp_path / "damaged.json"
    path.write_text(broken)
    with pytest.raises(InputError) as streamed:
        load_trace(path)
    with pytest.raises(InputError) as split:
        load_trace(path, workers=3)
    assert str(split.value) == str(streamed.value)


def test_a_gzip_trace_and_a_small_one_are_not_cut(tmp_path, monkeypatch):
    path = _write(tmp_path / "small.json", _events(2000))
    assert load_trace(path, workers=4).decode_path == "streaming"  # under 128 MiB a range
    zipped = tmp_path / "small.json.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    monkeypatch.setattr(limits, "SPLIT_PART_MIN_BYTES", 1)
    assert load_trace(zipped, workers=4).decode_path == "streaming"


def test_a_worker_that_fails_or_no_temporary_directory_falls_back(tmp_path, small_parts, monkeypatch):
    path = _write(tmp_path / "t.json", _events(3000))
    streamed = load_trace(path)
    monkeypatch.setattr(split_load, "_decode_range", _dies)
    failed = load_trace(path, workers=3)
    assert failed.decode_path == "streaming"
    _same_tables(streamed, failed)
    monkeypatch.undo()
    monkeypatch.setattr(limits, "SPLIT_PART_MIN_BYTES", 1)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    nowhere = load_trace(path, workers=3)
    assert nowhere.decode_path == "streaming"
    _same_tables(streamed, nowhere)


def _dies(*_args, **_kwargs):
    raise MemoryError("a worker that ran out of memory")


def test_symbol_columns_are_named_as_the_builder_names_them():
    from stepscope.traces.events import TableBuilder

    names = set(TableBuilder().buffers())
    assert SYMBOL_COLUMNS <= names and "memory.ts" in names and "ts" in names and "wait_rows" in names


HOSTILE = sorted((Path(__file__).resolve().parents[2] / "data" / "hostile" / "traces").iterdir())


@pytest.mark.parametrize("path", HOSTILE, ids=lambda path: path.name)
def test_every_hostile_trace_ends_as_the_streaming_decode_ends(path, small_parts):
    outcomes = []
    for workers in (1, 3):
        try:
            trace = load_trace(path, workers=workers)
        except InputError as exc:
            outcomes.append(("error", str(exc)))
        else:
            outcomes.append(("table", len(trace.events), trace.warnings))
    assert outcomes[0] == outcomes[1]


def test_a_damaged_trace_cut_in_ranges_is_one_line_and_exit_2_on_the_command_line(tmp_path, small_parts, capsys):
    from stepscope.cli.main import main

    text = json.dumps({"traceEvents": _events(4000)})
    path = tmp_path / "damaged.json"
    path.write_text(text[: len(text) // 2] + "#" + text[len(text) // 2 + 1:])
    assert main(["analyze", str(path), "--jobs", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepscope: error: ") and err.count("\n") == 1 and str(path) in err
    assert "Traceback" not in err
