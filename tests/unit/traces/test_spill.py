"""A large table's columns spilled to file mappings: the same analysis on every reference trace, the
same values read-only, nothing left in the temporary directory, every failure back to memory, and
the decision — what the process has left (the machine, its memory cgroup), ``STEPSCOPE_SPILL``, a
``tmpfs`` or a full disk — taken as documented."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from stepscope import limits
from stepscope.analysis.trace.rank_analysis import analyze_rank
from stepscope.errors import UsageError
from stepscope.traces import events, spill
from stepscope.traces.links import links_of
from stepscope.traces.load import decode_streaming, load_trace
from tests.unit.analysis.reference_traces import _rel, _root, analysis, kineto_trace_names
from tests.unit.traces.test_split_load import _plain_copy, _same_tables


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """Every table spills, whatever its size, into a temporary directory of the test's own."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    monkeypatch.setenv(spill.ENV_VAR, "0")
    monkeypatch.setattr(spill, "MIN_ARRAY_BYTES", 0)
    return directory


@pytest.mark.parametrize("rel", kineto_trace_names())
def test_every_reference_trace_spilled_gives_the_same_analysis_and_leaves_no_file(rel, scratch, monkeypatch):
    name = _rel(rel)
    monkeypatch.setenv(spill.ENV_VAR, "off")
    expected = analysis(name).to_dict()  # in memory (cached by the reference tests, or made here)
    monkeypatch.setenv(spill.ENV_VAR, "0")
    trace = load_trace(_root(name) / name)
    if len(trace.events):
        assert spill.is_spilled(trace.events.ts) and spill.is_spilled(trace.events.name)
        links = links_of(trace.events)
        assert spill.is_spilled(links.role) and spill.is_spilled(links.hta.ts) and spill.is_spilled(links.step)
        assert not trace.events.ts.flags.writeable
    assert analyze_rank(trace).to_dict() == expected
    assert list(scratch.iterdir()) == []  # each file's name went as soon as it was mapped


def test_the_columns_the_views_keep_follow_a_spilled_table_to_disk(scratch):
    """What the views keep from one stage to the next (the critical path's columns and queue
    lengths, the device timeline, the rows of a role, the operator tree, the launch rows) is on disk
    where the table is: those were ~600 MB of a 10 GB trace's process memory otherwise."""
    from stepscope.analysis.trace.critical_path.launches import launches_of
    from stepscope.analysis.trace.critical_path.rows import rows_of
    from stepscope.analysis.trace.launch_stats import launch_stats
    from stepscope.analysis.trace.op_tree import build_op_tree
    from stepscope.traces.links import RUNTIME
    from stepscope.traces.timeline import timeline_of

    name = "kineto_tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
    trace = load_trace(_root(name) / name)
    links = links_of(trace.events)
    rows = rows_of(trace.events)
    queues = launches_of(rows, False)
    timeline = timeline_of(links)
    tree = build_op_tree(links)
    launches = launch_stats(links, 0)
    kept = {"path dur": rows.dur, "path name": rows.name, "path stream": rows.stream, "path link": rows.ic,
            "queue lengths": queues.after_launch, "busy": timeline.busy[0], "runtime rows": links.rows(RUNTIME),
            "tree parent": tree.parent, "tree kept": tree.kept, "launch delays": launches.launch_delay}
    assert all(len(column) for column in kept.values())
    assert [key for key, column in kept.items() if not spill.is_spilled(column)] == []


def test_each_chunk_written_is_handed_to_the_kernel_to_write_at_once(tmp_path, monkeypatch):
    """``sync_file_range(SYNC_FILE_RANGE_WRITE)`` over exactly the bytes each write added (a memory
    cgroup cannot reclaim dirty pages); the column reads back the same; where the call does not exist
    the write goes on without it."""
    calls = []
    monkeypatch.setattr(spill, "_sync_file_range", lambda: lambda fd, offset, count, flags: calls.append((offset, count, flags)))
    monkeypatch.setattr(spill.os, "write", lambda fd, data, write=os.write: write(fd, data[:(24 << 20)]))  # short writes
    sink = spill.ColumnSink(str(tmp_path))
    values = np.arange(10 << 20, dtype=np.int64)  # 80 MiB: four writes
    sink.write("ts", values[: 6 << 20])
    sink.write("ts", values[6 << 20 :])
    mib = 1 << 20
    assert calls == [(0, 24 * mib, 2), (24 * mib, 24 * mib, 2), (48 * mib, 24 * mib, 2), (72 * mib, 8 * mib, 2)]
    assert np.array_equal(sink.column("ts", np.int64, len(values)), values)
    sink.close()
    monkeypatch.setattr(spill, "_sync_file_range", lambda: None)
    other = spill.ColumnSink(str(tmp_path))
    other.write("ts", values[:10])
    assert np.array_equal(other.column("ts", np.int64, 10), values[:10])
    other.close()


def test_a_spilled_array_is_the_same_values_read_only_and_pickles_as_an_array(tmp_path):
    values = np.arange(300_000, dtype=np.int32) * 7 - 5
    keep = spill.Spill(str(tmp_path))
    out = keep(values)
    assert spill.is_spilled(out) and spill.is_spilled(out[10:20]) and not spill.is_spilled(values)
    assert out.dtype == values.dtype and out.shape == values.shape and np.array_equal(out, values)
    assert type(out) is np.ndarray and not out.flags.writeable
    with pytest.raises(ValueError):
        out[0] = 1
    again = pickle.loads(pickle.dumps(out))
    assert np.array_equal(again, values) and not spill.is_spilled(again)
    assert keep.bytes == values.nbytes and list(tmp_path.iterdir()) == []
    tiny = np.arange(10)
    assert keep(tiny) is tiny  # below MIN_ARRAY_BYTES an array stays in memory


def test_a_directory_that_cannot_be_written_keeps_the_columns_in_memory(tmp_path):
    keep = spill.Spill(str(tmp_path / "missing"))
    values = np.ones(400_000)
    assert keep(values) is values and keep.failed
    assert keep(np.zeros(400_000)).flags.writeable  # after a failure the next ones are not tried


def test_a_full_disk_keeps_the_columns_in_memory(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill.os, "write", full)
    keep = spill.Spill(str(tmp_path))
    values = np.ones(400_000)
    assert keep(values) is values and keep.failed and list(tmp_path.iterdir()) == []


def test_the_decision_reads_the_room_left_the_setting_and_the_filesystem(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(spill.ENV_VAR, raising=False)
    mapped = []  # large blocks mapped (the allocator's setting) only where memory is short
    monkeypatch.setattr(spill.heap, "map_large_blocks", lambda: mapped.append(True))
    table = 500 * 2**20
    monkeypatch.setattr(spill, "headroom", lambda: 100 * table)
    assert spill.spiller(table) is None and not mapped  # it fits: the table stays in memory
    monkeypatch.setattr(spill, "headroom", lambda: table)
    assert isinstance(spill.spiller(table), spill.Spill) and mapped == [True]  # the views would not fit beside it
    monkeypatch.setattr(spill, "headroom", lambda: None)
    assert spill.spiller(table) is None  # nothing known: as before
    monkeypatch.setenv(spill.ENV_VAR, "off")
    monkeypatch.setattr(spill, "headroom", lambda: 0)
    assert spill.spiller(table) is None
    monkeypatch.setenv(spill.ENV_VAR, "600M")
    assert spill.spiller(table) is None and isinstance(spill.spiller(700 * 2**20), spill.Spill)
    monkeypatch.setenv(spill.ENV_VAR, "0")
    assert isinstance(spill.spiller(table), spill.Spill) and mapped == [True]  # asked for: the allocator as it was
    monkeypatch.setattr(spill, "_filesystem", lambda directory: "tmpfs")
    assert spill.spiller(table) is None  # the file would be held in memory anyway
    monkeypatch.setattr(spill, "_filesystem", lambda directory: "ext4")
    assert spill.spiller(1 << 50) is None  # no room on the disk for it twice
    monkeypatch.setenv(spill.ENV_VAR, "lots")
    with pytest.raises(UsageError, match="STEPSCOPE_SPILL"):
        spill.spiller(table)


def test_a_memory_cgroup_s_room_is_its_limit_less_what_it_holds_but_its_page_cache(tmp_path):
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("2000000000\n")
    (v1 / "memory.usage_in_bytes").write_text("1500000000\n")
    (v1 / "memory.stat").write_text("cache 1000000000\nrss 500000000\n")
    assert spill._room_in(str(v1), "memory.limit_in_bytes", "memory.usage_in_bytes", "cache") == 1_500_000_000
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("max\n")
    assert spill._room_in(str(v2), "memory.max", "memory.current", "file") is None  # no limit
    (v2 / "memory.max").write_text("1000000000\n")
    (v2 / "memory.current").write_text("1200000000\n")
    (v2 / "memory.stat").write_text("anon 1100000000\nfile 100000000\n")
    assert spill._room_in(str(v2), "memory.max", "memory.current", "file") == 0
    (v2 / "memory.stat").write_text("garbage\n")
    assert spill._room_in(str(v2), "memory.max", "memory.current", "file") == 0
    (v2 / "memory.current").write_text("not a number\n")
    assert spill._room_in(str(v2), "memory.max", "memory.current", "file") is None
    room = spill.headroom()
    assert room is None or room > 0


def test_a_bad_setting_is_one_line_and_exit_2_on_the_command_line(tmp_path):
    name = kineto_trace_names()[0]
    trace = _root(_rel(name)) / _rel(name)
    env = {**os.environ, spill.ENV_VAR: "lots", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "stepscope", "analyze", str(trace)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "STEPSCOPE_SPILL" in lines[0] and "Traceback" not in done.stderr


@pytest.fixture
def while_decoding(scratch, monkeypatch):
    """The columns go to disk while the trace is decoded: every few rows, from the first check."""
    monkeypatch.setattr(events, "FLUSH_ROWS", 64)
    return scratch


@pytest.mark.parametrize("rel", kineto_trace_names())
def test_columns_written_while_decoding_in_one_stream_or_in_ranges_give_the_same_table(rel, while_decoding, tmp_path,
                                                                                       monkeypatch):
    path = _plain_copy(_rel(rel), tmp_path)
    monkeypatch.setenv(spill.ENV_VAR, "off")
    expected = load_trace(path)
    monkeypatch.setenv(spill.ENV_VAR, "0")
    monkeypatch.setattr(limits, "SPLIT_PART_MIN_BYTES", 1)
    for workers in (1, 3):
        trace = load_trace(path, workers=workers)
        if len(trace.events) > 64:
            assert spill.is_spilled(trace.events.ts)
        _same_tables(expected, trace)
    assert list(while_decoding.iterdir()) == []


CONTROL = "hta/trace_diff/control/control.json.gz"


@pytest.mark.skipif(not (_root(CONTROL) / CONTROL).is_file(), reason="the shared reference set is not beside the repository")
def test_a_trace_decoded_to_disk_in_ranges_gives_the_same_analysis(while_decoding, tmp_path, monkeypatch):
    path = _plain_copy(CONTROL, tmp_path)
    monkeypatch.setattr(limits, "SPLIT_PART_MIN_BYTES", 1)
    monkeypatch.setenv(spill.ENV_VAR, "off")
    expected = analyze_rank(load_trace(path)).to_dict()
    monkeypatch.setenv(spill.ENV_VAR, "0")
    trace = load_trace(path, workers=4)
    assert trace.decode_path == "split" and spill.is_spilled(trace.events.correlation)
    assert analyze_rank(trace).to_dict() == expected


@pytest.mark.parametrize("failing_call", [8, 100])  # inside the first flush; after several
def test_a_write_that_fails_while_decoding_brings_the_columns_back_into_memory(failing_call, while_decoding, tmp_path,
                                                                               monkeypatch):
    rel = CONTROL if (_root(CONTROL) / CONTROL).is_file() else _rel(kineto_trace_names()[0])
    if failing_call > 14 and rel != CONTROL:
        pytest.skip("the shared reference set is not beside the repository: no trace of several batches")
    path = _plain_copy(rel, tmp_path)
    monkeypatch.setenv(spill.ENV_VAR, "off")
    expected = load_trace(path)
    monkeypatch.setenv(spill.ENV_VAR, "0")
    calls = []
    real = spill.ColumnSink.write

    def fails_later(self, key, values):
        calls.append(key)
        if len(calls) >= failing_call:
            raise OSError(28, "No space left on device")
        real(self, key, values)

    monkeypatch.setattr(spill.ColumnSink, "write", fails_later)
    builder, *_ = decode_streaming(str(path), decide=spill.sink_for)
    assert len(calls) >= failing_call and builder.sink is None and builder.flushed_rows == 0  # all back in memory
    trace = load_trace(path)
    _same_tables(expected, trace)
    assert list(while_decoding.iterdir()) == []


def test_a_load_lets_the_heap_reuse_freed_arrays_only_where_allowed_and_the_memory_left_is_ample(tmp_path, monkeypatch):
    """The decision alone (the allocator's own change is measured in a child by
    ``test_analysis_memory.py``; this process keeps glibc's defaults): allowed by the analysis
    commands only, and only with :data:`spill.REUSE_ROOM` times the trace's JSON left — a gzip
    file's JSON taken as :data:`spill.GZIP_RATIO` times its size."""
    from stepscope import heap

    made: list[bool] = []
    monkeypatch.setattr(heap, "reuse_large_blocks", lambda: made.append(True) or True)
    monkeypatch.setattr(heap, "reusing", lambda: bool(made))
    monkeypatch.setattr(spill, "headroom", lambda: 100 << 20)
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(b"{}")
    packed.write_bytes(b"\x1f\x8b rest")
    monkeypatch.setattr(heap, "may_reuse", False)
    assert not spill.reuse_freed_memory(str(plain), 1 << 20) and not made  # a library caller's process
    monkeypatch.setattr(heap, "may_reuse", True)
    assert not spill.reuse_freed_memory(str(plain), 51 << 20)  # 100 MiB left, 2 x 51 needed
    assert not spill.reuse_freed_memory(str(packed), 2 << 20)  # 2 x 30 x 2 MiB
    assert not spill.reuse_freed_memory(str(tmp_path / "gone.json"), 1) and not made
    monkeypatch.setattr(spill, "headroom", lambda: None)
    assert not spill.reuse_freed_memory(str(plain), 1) and not made  # nothing to go by
    monkeypatch.setattr(spill, "headroom", lambda: 100 << 20)
    assert spill.reuse_freed_memory(str(packed), 1 << 20) and made == [True]
    assert spill.reuse_freed_memory(str(plain), 1 << 40) and made == [True]  # on already: stays on
