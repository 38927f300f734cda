"""A trace decoded by a forked child while the command imports (``stepscope.traces.ahead``) is the
streaming decode's table: the same rows, memory instants, warnings, metadata and byte count; and
every doubt — damage, a child that dies, a file replaced after the fork, other size guards — ends
with the parent decoding the file itself, with the streaming decode's error. A child nobody claims
is killed and reaped; none is started where it cannot help or is not safe."""

from __future__ import annotations

import gzip
import json
import os
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from stepscope.errors import InputError
from stepscope.traces import ahead
from stepscope.traces import load
from stepscope.traces.load import MAX_JSON_BYTES, decode_streaming, load_trace
from tests.unit.analysis.reference_traces import _root
from tests.unit.traces.test_split_load import HOSTILE, _same_tables

#: Vendored traces of every shape the decode meets: gzip and plain JSON, big integers, a whole
#: document, memory instants, a GPU-metrics trace.
TRACES = [
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/call_stack/backward_thread.json",
    "hta/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "kineto_tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "kineto_tb_plugin/test/gpu_metrics_input.json",
]


@pytest.fixture
def forking(monkeypatch):
    """Children are started whatever the machine's core count; ``claims`` records what each claim got."""
    monkeypatch.setattr(ahead, "_can_fork", lambda: True)
    claims: list[bool] = []
    claim = ahead.claim

    def recorded(*args, **kwargs):
        running = bool(ahead._children)
        taken = claim(*args, **kwargs)
        if running:
            claims.append(taken is not None)
        return taken

    monkeypatch.setattr(load, "claim", recorded)
    return claims


def _through_the_child(path, started: list[bool] | None = None):
    with ahead.decoding(str(path), decode_streaming, MAX_JSON_BYTES) as child:
        if started is None:
            assert child
        else:
            started.append(child)
        return load_trace(path, workers=2)


@pytest.mark.parametrize("rel", TRACES)
def test_the_child_s_table_is_the_streaming_decode_s(rel, forking):
    path = _root(rel) / rel
    child = _through_the_child(path)
    assert forking == [True]
    _same_tables(load_trace(path), child)
    assert child.events.symbols.strings == load_trace(path).events.symbols.strings  # the same ids, too


@pytest.mark.parametrize("path", HOSTILE, ids=lambda path: path.name)
def test_every_hostile_trace_ends_as_the_streaming_decode_ends(path, forking):
    outcomes: list[tuple] = []
    for through_child in (False, True):
        try:
            trace = _through_the_child(path, []) if through_child else load_trace(path)
        except InputError as exc:
            outcomes.append(("error", str(exc)))
        else:
            outcomes.append(("table", len(trace.events), trace.warnings, trace.meta))
    assert outcomes[0] == outcomes[1]
    if outcomes[0][0] == "table":
        assert forking == [True]  # the parent took the child's table


def _events(n: int) -> list[dict]:
    return [{"ph": "X", "name": f"op{i}", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 10.0 * i, "dur": 5.0}
            for i in range(n)]


def test_damage_is_the_streaming_error_with_its_offset(tmp_path, forking):
    text = json.dumps({"traceEvents": _events(4000)})
    path = tmp_path / "damaged.json"
    path.write_text(text[: len(text) // 2] + "#" + text[len(text) // 2 + 1:])
    with pytest.raises(InputError) as streamed:
        load_trace(path)
    with pytest.raises(InputError) as child:
        _through_the_child(path)
    assert str(child.value) == str(streamed.value) and "(at " in str(child.value)
    assert forking == [False]


def _trace_file(tmp_path, events: int = 3000):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": _events(events)}))
    return path


@contextmanager
def _child_decoding(path, decode=decode_streaming):
    """The child started for ``path`` (it must start), while the block runs."""
    with ahead.decoding(str(path), decode, MAX_JSON_BYTES) as started:
        assert started
        (child,) = ahead._children.values()
        yield child


def test_a_child_killed_from_outside_leaves_the_decode_to_the_parent(tmp_path, forking):
    path = _trace_file(tmp_path)
    with _child_decoding(path) as child:
        os.kill(child.pid, signal.SIGKILL)
        trace = load_trace(path, workers=2)
    assert forking == [False]
    _same_tables(load_trace(path), trace)


def test_a_file_replaced_after_the_fork_is_read_again(tmp_path, forking):
    path = _trace_file(tmp_path)
    with _child_decoding(path):
        replacement = tmp_path / "new.json"
        replacement.write_text(json.dumps({"traceEvents": _events(10)}))
        os.replace(replacement, path)
        trace = load_trace(path, workers=2)
    assert len(trace.events) == 10 and forking == [False]


def test_other_size_guards_are_not_the_child_s(tmp_path, forking):
    path = _trace_file(tmp_path)
    with _child_decoding(path):
        with pytest.raises(InputError, match="larger than"):
            load_trace(path, workers=2, max_json_bytes=1000)
    assert forking == [False]


def test_a_child_nobody_claims_is_killed_and_reaped(tmp_path, forking):
    with _child_decoding(_trace_file(tmp_path)) as child:
        pid = child.pid
    assert not ahead._children
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left behind


def test_no_child_where_it_cannot_help_or_is_not_safe(tmp_path, monkeypatch):
    path = _trace_file(tmp_path, 10)
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for where in (None, str(tmp_path), str(empty), str(fifo), str(tmp_path / "missing.json")):
        with ahead.decoding(where, decode_streaming, MAX_JSON_BYTES) as started:
            assert not started, where
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    with ahead.decoding(str(path), decode_streaming, MAX_JSON_BYTES) as started:
        assert not started  # one core: nothing runs beside the imports
    monkeypatch.undo()
    monkeypatch.setattr(ahead, "_can_fork", lambda: True)
    with ahead.decoding(str(path), decode_streaming, MAX_JSON_BYTES) as started:
        assert started
        with ahead.decoding(str(path), decode_streaming, MAX_JSON_BYTES) as again:
            assert not again  # one child per file
    monkeypatch.undo()
    release = threading.Event()
    beside = threading.Thread(target=release.wait)
    beside.start()
    try:
        with ahead.decoding(str(path), decode_streaming, MAX_JSON_BYTES) as started:
            assert not started  # a fork beside a running thread could deadlock the child
    finally:
        release.set()
        beside.join()


def _analyze(argv: list[str], capsys) -> tuple[int, str, str]:
    from stepscope.cli.main import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_analyze_prints_the_same_with_and_without_the_child(fmt, forking, capsys):
    rel = TRACES[-2]
    path = str(_root(rel) / rel)
    with_child = _analyze(["analyze", path, "--format", fmt, "--no-progress"], capsys)
    assert forking == [True]
    assert with_child == _analyze(["analyze", path, "--format", fmt, "--no-progress", "--jobs", "1"], capsys)
    assert forking == [True]  # --jobs 1: no child, nothing to claim


def test_a_damaged_trace_through_the_child_is_one_line_and_exit_2(tmp_path, forking, capsys):
    text = json.dumps({"traceEvents": _events(4000)})
    path = tmp_path / "damaged.json"
    path.write_text(text[: len(text) // 2] + "#" + text[len(text) // 2 + 1:])
    code, _, err = _analyze(["analyze", str(path), "--no-progress"], capsys)
    assert code == 2 and err.startswith("stepscope: error: ") and err.count("\n") == 1 and str(path) in err
    assert forking == [False] and not ahead._children


def test_the_child_s_guards_are_the_command_s(tmp_path, forking, capsys):
    """``--max-bytes`` reaches the child (it inherits the command's limit): a gzip file inflating past
    it at more than 200:1 is refused as without a child."""
    path = tmp_path / "bomb.json.gz"
    events = [{**_events(1)[0], "name": "x" * 100_000} for _ in range(20)]
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    argv = ["analyze", str(path), "--no-progress", "--max-bytes", "64K"]
    refused = _analyze(argv, capsys)
    assert refused[0] == 2 and "200:1" in refused[2], refused
    assert forking == [False]
    assert refused == _analyze([*argv, "--jobs", "1"], capsys)


def test_a_path_that_is_not_a_file_starts_no_child(forking, capsys):
    code, _, err = _analyze(["analyze", str(Path("/nonexistent/trace.json")), "--no-progress"], capsys)
    assert code == 2 and forking == []


def _slow_decode(path, max_json_bytes, max_bytes):
    import time

    time.sleep(30)  # stopped from outside long before
    return decode_streaming(path, max_json_bytes, max_bytes)


def test_ctrl_c_ends_the_child_quietly_and_the_parent_decodes(tmp_path, forking, capfd):
    """A Ctrl-C reaches the whole process group: the child ends by it without a word (the command
    says it once), and a parent that went on anyway decodes the file itself."""
    path = _trace_file(tmp_path, 300)
    with _child_decoding(path, _slow_decode) as child:
        os.kill(child.pid, signal.SIGINT)
        trace = load_trace(path, workers=2)
    assert len(trace.events) == 300 and forking == [False]
    assert capfd.readouterr().err == ""


def test_an_interrupted_command_kills_and_reaps_its_child(tmp_path):
    path = _trace_file(tmp_path, 300)
    pid = None
    with pytest.raises(KeyboardInterrupt):
        with ahead.decoding(str(path), _slow_decode, MAX_JSON_BYTES) as started:
            if started:
                (child,) = ahead._children.values()
                pid = child.pid
            raise KeyboardInterrupt
    assert not ahead._children
    if pid is not None:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_a_child_whose_table_would_go_to_disk_leaves_the_decode_to_the_parent(tmp_path, forking, monkeypatch):
    """The child hands its columns over in memory: where they would have to go to disk it gives up,
    and the parent decodes the file itself, to disk."""
    from stepscope.traces import events, spill

    path = _trace_file(tmp_path)
    expected = load_trace(path)
    monkeypatch.setattr(events, "FLUSH_ROWS", 16)
    monkeypatch.setattr(spill, "MIN_ARRAY_BYTES", 0)
    monkeypatch.setenv(spill.ENV_VAR, "0")
    with _child_decoding(path, load.decode_ahead):
        trace = load_trace(path, workers=2)
    assert forking == [False] and spill.is_spilled(trace.events.ts)
    _same_tables(expected, trace)
    monkeypatch.setenv(spill.ENV_VAR, "off")  # memory to spare: the child's table is taken
    with _child_decoding(path, load.decode_ahead):
        trace = load_trace(path, workers=2)
    assert forking == [False, True] and not spill.is_spilled(trace.events.ts)
    _same_tables(expected, trace)
