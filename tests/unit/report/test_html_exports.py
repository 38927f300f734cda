"""System timelines, the Perfetto trace (Trace Event Format, one clock) and the TensorBoard scalars."""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.run.timelines import system_timelines
from stepscope.analysis.trace.trace_evidence import analyze_traces
from stepscope.errors import UsageError
from stepscope.record.run import ProfilerWindow
from stepscope.record.samples import PROCESS_COLUMNS, SERIES_COLUMNS, ProcessInfo, Samples, SamplesMeta
from html_records import synthetic_run
from records import report_of as build_report
from stepscope.report.render import Output, render
from stepscope.report.render.perfetto import TID_BASE
from stepscope.report.render.perfetto import perfetto_trace as trace_of_view


def perfetto_trace(records, run_dir=None):
    """The merged timeline of ``records`` through the pipeline: (document, notes)."""
    report = build_report(ranks=tuple(records), run_dir=run_dir, perfetto=True)
    return trace_of_view(report.perfetto), list(report.perfetto.notes)


def write_perfetto(records, path, run_dir=None):
    return render(build_report(ranks=tuple(records), run_dir=run_dir, perfetto=True), "perfetto", Output(path=path))

TRACES = Path(__file__).parents[2] / "data" / "traces"


# -- timelines ---------------------------------------------------------------------------------------
def exact_samples() -> Samples:
    """5 samples 0.5 s apart: core 0 busy 100 %, core 1 50 %; main 1 core, a worker 0.5 core;
    10 MB/s read, 2 MB/s written; GPU util 0, 100, 0, 100."""
    n, dt, ticks = 5, 0.5, 100
    meta = SamplesMeta(interval_s=dt, cpus=(0, 1), cpu_count=2, disks=("sda",), gpus=(), mem_total_bytes=1000,
                       clock_ticks_per_s=ticks)
    widths = {"sample": None, "cpu": 2, "disk": 1, "nic": 0, "gpu": 1}
    series = {}
    for name, (axis, _) in SERIES_COLUMNS.items():
        shape = (n,) if widths[axis] is None else (n, widths[axis])
        series[name] = np.zeros(shape, dtype=np.float64 if name == "load1" else np.int64)
    k = np.arange(n)[:, None]
    series["ts_ns"] = 10**12 + np.arange(n, dtype=np.int64) * int(dt * 1e9)
    series["cpu_user"] = k * np.array([50, 25])
    series["cpu_idle"] = k * np.array([0, 25])
    series["disk_read_bytes"] = k * 5_000_000
    series["disk_write_bytes"] = k * 1_000_000
    series["mem_used_bytes"] = np.array([100, 200, 300, -1, 500])
    series["gpu_util"] = np.array([[0], [0], [100], [0], [100]])
    series["gpu_mem_used_bytes"] = np.full((n, 1), 7)
    rows = [(s, 0, 50 * s, 1000 + s, 0, 0, 0, 3, "R") for s in range(n)] + \
           [(s, 1, 25 * s, 10, 0, 0, 0, 1, "R") for s in range(1, n)]
    proc = {name: np.array([row[i] if i < len(row) else -1 for row in rows], dtype="<U1" if name == "state" else np.int64)
            for i, name in enumerate(PROCESS_COLUMNS)}
    gpu_procs = {name: np.zeros(0, dtype=np.int64) for name in ("sample", "gpu", "pid", "mem_bytes")}
    processes = (ProcessInfo(0, 10, role="main"), ProcessInfo(1, 11, role="dataloader_worker"))
    return Samples(meta, series, proc, gpu_procs, processes)


def test_timelines_per_interval():
    line = system_timelines(exact_samples())
    assert len(line) == 4 and line.t_ns[0] == 10**12 + 500_000_000
    np.testing.assert_allclose(line.core_busy, [[1.0, 0.5]] * 4)
    np.testing.assert_allclose(line.main_cpu, [1.0] * 4)
    assert math.isnan(line.workers_cpu[0])  # the worker appears at sample 1
    np.testing.assert_allclose(line.workers_cpu[1:], [0.5] * 3)
    np.testing.assert_allclose(line.workers_alive, [1, 1, 1, 1])
    np.testing.assert_allclose(line.disk_read, [10e6] * 4)
    np.testing.assert_allclose(line.disk_write, [2e6] * 4)
    np.testing.assert_allclose(line.mem_used, [200, 300, np.nan, 500])
    np.testing.assert_allclose(line.main_rss, [1001, 1002, 1003, 1004])
    np.testing.assert_allclose(line.gpu_util[:, 0], [0, 1, 0, 1])
    assert line.has_gpu and line.has_workers


def test_timelines_need_two_samples():
    assert system_timelines(None) is None
    record = synthetic_run(20, samples=False)
    assert build_report(record).timelines is None


def test_report_timelines_are_computed_once():
    report = build_report(synthetic_run(50))
    assert report.timelines is report.timelines
    assert report.to_dict() == build_report(synthetic_run(50)).to_dict()  # report.json unchanged by them


# -- Perfetto ----------------------------------------------------------------------------------------
def strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def validate_trace_event_format(document: dict) -> dict[str, int]:
    """Required keys per phase, numbers where numbers belong, and per-track order."""
    counts: dict[str, int] = defaultdict(int)
    spans: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    counters: dict[tuple, list[float]] = defaultdict(list)
    assert isinstance(document["traceEvents"], list)
    for event in document["traceEvents"]:
        phase = event["ph"]
        counts[phase] += 1
        assert isinstance(event["name"], str) and "pid" in event
        if phase == "X":
            assert isinstance(event["ts"], (int, float)) and isinstance(event["dur"], (int, float))
            assert event["dur"] >= 0 and "tid" in event
            if event.get("cat") == "stepscope":
                spans[(event["pid"], event["tid"])].append((event["ts"], event["dur"]))
        elif phase == "C":
            assert isinstance(event["ts"], (int, float)) and event["args"]
            assert all(isinstance(value, (int, float)) for value in event["args"].values())
            counters[(event["pid"], event["name"])].append(event["ts"])
        elif phase == "M":
            assert event["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index",
                                     "process_labels") and "args" in event
    for track, items in spans.items():
        for (ts, dur), (next_ts, _) in zip(items, items[1:]):
            assert ts + dur <= next_ts + 0.002, (track, ts, dur, next_ts)  # in order, no overlap
    for track, stamps in counters.items():
        assert all(a < b for a, b in zip(stamps, stamps[1:])), track
    return counts


def test_perfetto_trace_of_two_ranks(tmp_path):
    records = (synthetic_run(200, rank=0, world_size=2), synthetic_run(200, rank=1, world_size=2, seed=1, slow=1.3))
    path = tmp_path / "run.perfetto.json"
    assert write_perfetto(records, path) == []
    document = strict_json(path.read_text())
    counts = validate_trace_event_format(document)
    assert counts["X"] > 2 * 200 * 5 and counts["C"] > 100
    steps = [e for e in document["traceEvents"] if e["ph"] == "X" and e["tid"] == TID_BASE]
    assert {e["pid"] for e in steps} == {0, 1}
    assert min(e["ts"] for e in steps) == 0.0  # microseconds since the job's first step
    first = next(e for e in steps if e["pid"] == 0 and e["args"]["step"] == 10)
    assert first["ts"] == pytest.approx((records[0].steps.start_ns[10] - records[0].steps.start_ns[0]) / 1000)
    names = {e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert {"[stepscope] step", "[stepscope] data wait", "[stepscope] forward"} <= names
    tracks = {e["name"] for e in document["traceEvents"] if e["ph"] == "C"}
    assert {"[stepscope] CPU busy %", "[stepscope] GPU utilisation %", "[stepscope] disk MiB/s"} <= tracks


def test_phase_spans_add_up_to_their_step():
    record = synthetic_run(30)
    document, _ = perfetto_trace((record,))
    spans = [e for e in document["traceEvents"] if e["ph"] == "X" and e["args"].get("step") == 7]
    step = next(e for e in spans if e["tid"] == TID_BASE)
    phases = [e for e in spans if e["tid"] != TID_BASE]
    assert sum(e["dur"] for e in phases) == pytest.approx(step["dur"], abs=0.01)
    assert phases[0]["ts"] == step["ts"] and phases[0]["name"] == "data wait"


def kineto_window(tmp_path: Path, drift_ns: int) -> tuple:
    """A record whose profiler window trace puts ProfilerStep#1..3 on steps 6..8, its wall clock off by ``drift_ns``."""
    record = synthetic_run(40)
    meta = record.meta
    base = 1_790_000_000_000_000_000
    events = []
    for number, step in enumerate(range(6, 9), start=1):
        wall = meta.start_wall_ns + (int(record.steps.start_ns[step]) - meta.start_ns) + drift_ns
        ts = (wall - base) / 1000
        dur = int(record.steps.duration_ns[step]) / 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": 1, "tid": 1,
                       "ts": ts, "dur": dur, "args": {}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": ts + 10,
                       "dur": 50, "args": {"External id": number}})
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank0.pt.trace.json").write_text(json.dumps(
        {"schemaVersion": 1, "baseTimeNanoseconds": base, "traceEvents": events}))
    record = replace(record, profiler_windows=(ProfilerWindow(5, 8, "traces/rank0.pt.trace.json"),))
    return record


@pytest.mark.parametrize("drift_ns", [0, 3_000_000, -250_000_000])
def test_kineto_events_land_on_their_steps(tmp_path, drift_ns):
    record = kineto_window(tmp_path, drift_ns)
    document, notes = perfetto_trace((record,), tmp_path)
    assert notes == []
    validate_trace_event_format(document)
    marks = {e["name"]: e["ts"] for e in document["traceEvents"] if e["name"].startswith("ProfilerStep#")}
    steps = {e["args"]["step"]: e["ts"] for e in document["traceEvents"]
             if e["ph"] == "X" and e.get("tid") == TID_BASE}
    for number, step in enumerate(range(6, 9), start=1):
        assert marks[f"ProfilerStep#{number}"] == pytest.approx(steps[step], abs=0.01)
    alignment = document["otherData"]["kineto_alignment"]["0"]
    assert alignment["profiler_step_residual_ns"] == pytest.approx(drift_ns, abs=1000)


def test_the_merged_trace_round_trips_through_analyze(tmp_path):
    record = synthetic_run(40)
    (tmp_path / "traces").mkdir()
    shutil.copy(TRACES / "cpu_train.pt.trace.json.gz", tmp_path / "traces" / "rank0.pt.trace.json.gz")
    record = replace(record, profiler_windows=(ProfilerWindow(5, 8, "traces/rank0.pt.trace.json.gz"),))
    path = tmp_path / "merged.json"
    write_perfetto((record,), path, tmp_path)
    validate_trace_event_format(strict_json(path.read_text()))
    original = analyze_traces(TRACES / "cpu_train.pt.trace.json.gz").ranks[0]
    merged = analyze_traces(path).ranks[0]
    assert [(row.name, row.calls) for row in merged.operators.rows] == \
        [(row.name, row.calls) for row in original.operators.rows]
    assert merged.steps.step_names == original.steps.step_names
    for category, value in original.steps.mean_us.items():
        assert merged.steps.mean_us[category] == pytest.approx(value, abs=0.01)


def test_a_missing_window_trace_is_a_note(tmp_path):
    record = replace(synthetic_run(20), profiler_windows=(ProfilerWindow(5, 8, "traces/gone.json"),))
    document, notes = perfetto_trace((record,), tmp_path)
    assert len(notes) == 1 and "gone.json" in notes[0]
    validate_trace_event_format(document)


# -- TensorBoard -------------------------------------------------------------------------------------
def test_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from stepscope.report.render.tensorboard import write_tensorboard

    record = synthetic_run(120)
    report = build_report(record)
    assert write_tensorboard(report, tmp_path / "tb") > 120 * 6
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"step/time_ms", "step/phase_share/data_wait", "system/gpu0_util_pct", "system/memory_used_gib",
            "steady/step_time_ms", "steady/phase_share/forward"} <= tags
    times = events.Scalars("step/time_ms")
    assert [item.step for item in times] == list(range(120))
    assert times[10].value == pytest.approx(record.steps.duration_ns[10] / 1e6, rel=1e-5)
    shares = events.Scalars("steady/phase_share/data_wait")
    assert shares[-1].value == pytest.approx(report.summary.steady.phase_shares["data_wait"], rel=1e-5)


def test_tensorboard_missing_is_a_usage_error(monkeypatch):
    from stepscope.report.render import tensorboard

    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.event_file_writer", None)
    with pytest.raises(UsageError, match="pip install tensorboard"):
        tensorboard.require_tensorboard()


@pytest.mark.parametrize("length", [0, 1, 8, 77, 400])
def test_vectorised_crc_matches_tensorboards(length):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed")
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from stepscope.report.render.tensorboard import masked_crc32c_many

    records = [bytes((seed * 31 + i) % 256 for i in range(length)) for seed in range(5)] + [b"x" * (length + 3)]
    assert masked_crc32c_many(records) == [masked_crc32c(record) for record in records]
