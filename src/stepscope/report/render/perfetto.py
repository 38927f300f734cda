"""One Chrome/Perfetto trace (Trace Event Format JSON) of a run: steps, samples and the profiler window.

:func:`perfetto_trace` merges, for every rank of a run:

- the steps as complete (``"X"``) events, pid = rank: one track for whole steps and one per phase
  kind (``[stepscope] data wait``, ``forward``, …). The record keeps each phase's *total* per step,
  not where in the step it happened, so the phase spans are laid out in the order data wait →
  forward → backward → optimizer → other from the step's start: durations are exact, positions
  are canonical;
- the sampler's series as counter (``"C"``) events on the same pid: CPU busy, process CPU (main,
  DataLoader workers), disk read/write, memory, GPU utilisation and memory
  (:func:`~stepscope.analysis.run.timelines.system_timelines`);
- the events of the run's torch.profiler window (``stepscope run --trace``), unchanged except for
  their timestamps.

**One clock.** Steps and samples are on CLOCK_MONOTONIC (ns). Output ``ts`` is microseconds since
the earliest first step of the job (``otherData.origin_monotonic_ns``). Kineto writes wall-clock
time: an event's absolute time is ``baseTimeNanoseconds + ts × 1000`` ns (older traces: absolute
epoch µs, base 0). Capture reads the wall and the monotonic clock together at start
(``meta.start_wall_ns``, ``meta.start_ns``), which maps one onto the other; then the trace's
``ProfilerStep#N`` ranges are matched to the window's steps (in order, the last range to the
window's last step) and the median residual is removed, so a clock step (NTP) between the start
and the window does not show. The residual applied is reported in ``otherData.kineto_alignment``. The mapping is computed by the
pipeline (:func:`stepscope.pipeline.views.perfetto_view`); this module only writes the events.

Kineto's own pids are kept (CPU: the OS pid; GPU: the device index). Where a device index equals
a rank, the rank's tracks share that process in the viewer; stepscope's tracks are named
``[stepscope] …`` and use thread ids no Kineto stream uses.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from stepscope.report.model import PHASES, CriticalPathView, Report
from stepscope.report.run_view import PerfettoRank, PerfettoView, StepSeries
from stepscope.report.render.output import Output
from stepscope.safe_write import atomic_write

#: Thread ids of stepscope's tracks: high enough to never meet a CUDA stream or an OS tid.
TID_BASE = 900_000_000
TRACKS = ("step", *PHASES)
TRACK_NAMES = {"step": "step", "data_wait": "data wait", "forward": "forward", "backward": "backward",
               "optimizer": "optimizer", "communication": "communication", "other": "other", "compile": "compile"}


def perfetto_trace(view: PerfettoView) -> dict[str, Any]:
    """The merged trace of a job's ranks (the report's :class:`~stepscope.report.model.PerfettoView`)."""
    events: list[dict[str, Any]] = []
    kineto: list[dict[str, Any]] = []
    kineto_pids: set[Any] = set()
    for rank in view.ranks:
        kineto.extend(rank.kineto)
        kineto_pids.update(rank.kineto_pids)
    for rank in view.ranks:
        if rank.rank not in kineto_pids:
            events.append({"ph": "M", "name": "process_name", "pid": rank.rank, "args": {"name": f"rank {rank.rank}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": rank.rank, "args": {"sort_index": rank.rank}})
        events.extend(_step_events(rank.steps, view.origin_ns))
        events.extend(_counter_events(rank, view.origin_ns))
    alignment = {str(rank.rank): rank.alignment for rank in view.ranks if rank.alignment is not None}
    return {**view.top, "traceEvents": events + kineto, "displayTimeUnit": "ms",
            "otherData": {"producer": "stepscope", "clock": "CLOCK_MONOTONIC", "origin_monotonic_ns": view.origin_ns,
                          "ts_unit": "us since origin", "kineto_alignment": alignment}}


def render(report: Report, out: Output) -> list[str]:
    """Write the timeline as JSON to ``out.path`` (gzip'd when the name ends in ``.gz``)."""
    assert out.path is not None and report.perfetto is not None, "the pipeline builds the timeline for this output"
    write_trace_json(perfetto_trace(report.perfetto), Path(out.path))
    return list(report.perfetto.notes)


def write_trace_json(doc: dict[str, Any], target: Path) -> None:
    """A Trace Event Format document to ``target``, gzip'd when its name ends in ``.gz``."""
    payload = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    atomic_write(target, gzip.compress(payload, compresslevel=6) if target.name.endswith(".gz") else payload)


def _us(ns: np.ndarray | int, origin: int) -> np.ndarray:
    return np.round((np.asarray(ns, dtype=np.int64) - origin) / 1000.0, 3)


def _step_events(steps: StepSeries, origin: int) -> list[dict[str, Any]]:
    rank = steps.rank
    out: list[dict[str, Any]] = []
    for index, track in enumerate(TRACKS):
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": TID_BASE + index,
                    "args": {"name": f"[stepscope] {TRACK_NAMES[track]}"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": TID_BASE + index,
                    "args": {"sort_index": index}})
    if not len(steps):
        return out
    starts = _us(steps.start_ns, origin).tolist()
    durations = np.round(steps.duration_ns / 1000.0, 3).tolist()
    phases = steps.phases
    for index, (start, duration) in enumerate(zip(starts, durations)):
        out.append({"ph": "X", "cat": "stepscope", "name": f"step {index}", "pid": rank, "tid": TID_BASE,
                    "ts": start, "dur": duration,
                    "args": {"step": index, **{f"{name}_ms": round(int(phases[name][index]) / 1e6, 3)
                                               for name in PHASES}}})
    offset = np.zeros(len(steps), dtype=np.int64)
    for number, name in enumerate(PHASES, start=1):
        values = phases[name]
        begin = _us(steps.start_ns + offset, origin).tolist()
        lengths = np.round(values / 1000.0, 3).tolist()
        label = TRACK_NAMES[name]
        out.extend({"ph": "X", "cat": "stepscope", "name": label, "pid": rank, "tid": TID_BASE + number,
                    "ts": ts, "dur": dur, "args": {"step": index}}
                   for index, (ts, dur) in enumerate(zip(begin, lengths)) if dur > 0)
        offset = offset + values
    return out


def _counter_events(rank: PerfettoRank, origin: int) -> list[dict[str, Any]]:
    if not len(rank.counter_ts_ns):
        return []
    ts = _us(rank.counter_ts_ns, origin).tolist()
    out: list[dict[str, Any]] = []
    for name, series in rank.counters.items():
        columns = list(series.items())
        for row, stamp in enumerate(ts):
            args = {key: round(float(values[row]), 4) for key, values in columns if np.isfinite(values[row])}
            if args:
                out.append({"ph": "C", "name": f"[stepscope] {name}", "pid": rank.rank, "ts": stamp, "args": args})
    return out


# -- a trace with its critical path marked (``stepscope analyze TRACE --perfetto FILE``) -----------
#: Thread ids of the critical-path tracks (one per thread or stream the path crosses).
PATH_TID_BASE = TID_BASE + 1000


def path_overlay(events: list[Any], path: CriticalPathView) -> list[dict[str, Any]]:
    """The events of a trace with one step's critical path added: for each thread or stream the
    path crosses, a ``[stepscope] critical path`` track beside it (same process) holding the
    path's stretches (name, what bounds it), and flow arrows from each stretch to the next.
    ``path`` is a trace view's :class:`~stepscope.report.model.CriticalPathView`; the trace's own
    events are returned unchanged, first."""

    original: dict[str, Any] = {}
    for event in events:
        if type(event) is dict:
            for key in ("pid", "tid"):
                value = event.get(key)
                if value is not None and type(value) in (int, str):
                    original.setdefault(str(value), value)
    out: list[dict[str, Any]] = [e for e in events if type(e) is dict]
    lanes: dict[tuple[str, str], int] = {}
    stretches = []
    for span in path.stretches:
        lane = (span.pid, span.tid)
        if lane not in lanes:
            lanes[lane] = PATH_TID_BASE + len(lanes)
            pid = original.get(span.pid, span.pid)
            where = f"stream {span.stream}" if span.stream >= 0 else f"thread {span.tid}"
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": lanes[lane],
                        "args": {"name": f"[stepscope] critical path ({where})"}})
        pid = original.get(span.pid, span.pid)
        stretch = {"ph": "X", "cat": "stepscope.critical_path", "name": span.name, "pid": pid, "tid": lanes[lane],
                   "ts": span.ts_us, "dur": max(span.end_us - span.ts_us, 0.0),
                   "args": {"bound by": span.label, "step": path.shown_step}}
        out.append(stretch)
        stretches.append(stretch)
    stretches.sort(key=lambda item: item["ts"])
    for number, (a, b) in enumerate(zip(stretches, stretches[1:])):
        flow = {"cat": "stepscope.critical_path", "name": "critical path", "id": number}
        out.append({**flow, "ph": "s", "pid": a["pid"], "tid": a["tid"], "ts": a["ts"] + a["dur"] / 2})
        out.append({**flow, "ph": "f", "bp": "e", "pid": b["pid"], "tid": b["tid"], "ts": b["ts"] + b["dur"] / 2})
    return out
