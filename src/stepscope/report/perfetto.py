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
and the window does not show. The residual applied is reported in ``otherData.kineto_alignment``.

Kineto's own pids are kept (CPU: the OS pid; GPU: the device index). Where a device index equals
a rank, the rank's tracks share that process in the viewer; stepscope's tracks are named
``[stepscope] …`` and use thread ids no Kineto stream uses.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from stepscope.analysis.run.timelines import SystemTimelines, system_timelines
from stepscope.record.run import PHASES, RunRecord

#: Thread ids of stepscope's tracks: high enough to never meet a CUDA stream or an OS tid.
TID_BASE = 900_000_000
TRACKS = ("step", *PHASES)
TRACK_NAMES = {"step": "step", "data_wait": "data wait", "forward": "forward", "backward": "backward",
               "optimizer": "optimizer", "communication": "communication", "other": "other", "compile": "compile"}
#: A ProfilerStep residual larger than this is not trusted (the wrong window): wall mapping only.
MAX_RESIDUAL_NS = 60_000_000_000


def perfetto_trace(records: Sequence[RunRecord], run_dir: str | Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """The merged trace of a job's rank records (with samples attached), and notes on what was left out."""
    notes: list[str] = []
    origin = _origin(records)
    events: list[dict[str, Any]] = []
    alignment: dict[str, Any] = {}
    kineto_pids: set[Any] = set()
    kineto: list[dict[str, Any]] = []
    top: dict[str, Any] = {}
    for record in records:
        rank = record.meta.rank
        part, info, extra = _kineto_events(record, run_dir, origin, notes)
        if part:
            kineto.extend(part)
            kineto_pids.update(event.get("pid") for event in part)
            alignment[str(rank)] = info
            top.update(extra)
    for record in records:
        rank = record.meta.rank
        if rank not in kineto_pids:
            events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        events.extend(_step_events(record, origin))
        events.extend(_counter_events(record, origin))
    trace = {**top, "traceEvents": events + kineto, "displayTimeUnit": "ms",
             "otherData": {"producer": "stepscope", "clock": "CLOCK_MONOTONIC",
                           "origin_monotonic_ns": origin, "ts_unit": "us since origin",
                           "kineto_alignment": alignment}}
    return trace, notes


def write_perfetto(records: Sequence[RunRecord], path: str | Path, run_dir: str | Path | None = None) -> list[str]:
    """Write :func:`perfetto_trace` as JSON (gzip'd when the name ends in ``.gz``); returns notes."""
    trace, notes = perfetto_trace(records, run_dir)
    payload = orjson.dumps(trace)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_bytes(gzip.compress(payload, compresslevel=6) if target.name.endswith(".gz") else payload)
    tmp.replace(target)
    return notes


def job_records(path: str | Path) -> tuple[tuple[RunRecord, ...], Path]:
    """Every rank's record of a run (samples attached) and the run directory they live in."""
    from stepscope.record import layout
    from stepscope.record.store import load_record, resolve_record_path

    target = Path(path)
    ranks = layout.record_ranks(target) if target.is_dir() else []
    if len(ranks) > 1:
        return tuple(load_record(target, rank) for rank in ranks), target
    return (load_record(target),), resolve_record_path(target, None).parent


def _origin(records: Sequence[RunRecord]) -> int:
    starts = [int(record.steps.start_ns[0]) for record in records if len(record.steps)]
    if starts:
        return min(starts)
    samples = [int(record.samples.ts_ns[0]) for record in records
               if record.samples is not None and len(record.samples)]
    return min(samples) if samples else min((record.meta.start_ns for record in records), default=0)


def _us(ns: np.ndarray | int, origin: int) -> np.ndarray:
    return np.round((np.asarray(ns, dtype=np.int64) - origin) / 1000.0, 3)


def _step_events(record: RunRecord, origin: int) -> list[dict[str, Any]]:
    rank = record.meta.rank
    steps = record.steps
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
    phases = {name: steps.phase(name) for name in PHASES}
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


def _counter_events(record: RunRecord, origin: int) -> list[dict[str, Any]]:
    timelines = system_timelines(record.samples)
    if timelines is None:
        return []
    rank = record.meta.rank
    ts = _us(timelines.t_ns, origin).tolist()
    out: list[dict[str, Any]] = []
    for name, series in _counter_series(timelines).items():
        columns = list(series.items())
        for row, stamp in enumerate(ts):
            args = {key: round(float(values[row]), 4) for key, values in columns if np.isfinite(values[row])}
            if args:
                out.append({"ph": "C", "name": f"[stepscope] {name}", "pid": rank, "ts": stamp, "args": args})
    return out


def _counter_series(timelines: SystemTimelines) -> dict[str, dict[str, np.ndarray]]:
    """Counter track name → {series name: per-interval values}, in display units."""
    busy = timelines.core_busy
    with np.errstate(invalid="ignore"):
        cpu_mean = np.where(np.isnan(busy).all(axis=1), np.nan, np.nanmean(np.where(np.isnan(busy), np.nan, busy),
                                                                           axis=1)) if busy.shape[1] else \
            np.full(len(timelines), np.nan)
    series: dict[str, dict[str, np.ndarray]] = {
        "CPU busy %": {"all cores": cpu_mean * 100},
        "process CPU (cores)": {"main": timelines.main_cpu, "DataLoader workers": timelines.workers_cpu},
        "disk MiB/s": {"read": timelines.disk_read / 2**20, "write": timelines.disk_write / 2**20},
        "memory GiB": {"machine used": timelines.mem_used / 2**30, "main RSS": timelines.main_rss / 2**30},
    }
    if timelines.has_gpu:
        series["GPU utilisation %"] = {f"GPU {i}": timelines.gpu_util[:, i] * 100
                                       for i in range(timelines.gpu_util.shape[1])}
        series["GPU memory GiB"] = {f"GPU {i}": timelines.gpu_mem_used[:, i] / 2**30
                                    for i in range(timelines.gpu_mem_used.shape[1])}
    return series


# -- the profiler window ---------------------------------------------------------------------------
def _kineto_events(record: RunRecord, run_dir: str | Path | None, origin: int,
                   notes: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    windows = [window for window in record.profiler_windows if window.trace_path]
    if not windows or run_dir is None:
        return [], {}, {}
    window = windows[-1]
    path = Path(run_dir) / str(window.trace_path)
    try:
        raw = path.read_bytes()
        document = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, orjson.JSONDecodeError, EOFError, gzip.BadGzipFile) as exc:
        notes.append(f"rank {record.meta.rank}: profiler window trace {path} left out ({exc})")
        return [], {}, {}
    events = [event for event in document.get("traceEvents", ()) if isinstance(event, dict)]
    base = int(document.get("baseTimeNanoseconds") or 0)
    # wall (ns) -> monotonic (ns): the pair capture read at start; then relative to the origin.
    shift_ns = base - (record.meta.start_wall_ns - record.meta.start_ns) - origin
    residual = _step_residual(events, record, (window.first_step, window.last_step), shift_ns, origin)
    shift_ns -= residual if residual is not None else 0
    for event in events:
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] = round((event["ts"] * 1000.0 + shift_ns) / 1000.0, 3)
    extra = {key: document[key] for key in ("deviceProperties", "distributedInfo", "schemaVersion")
             if key in document}
    info = {"trace": str(window.trace_path), "wall_to_monotonic_ns": record.meta.start_wall_ns - record.meta.start_ns,
            "profiler_step_residual_ns": residual}
    return events, info, extra


def _step_residual(events: list[dict[str, Any]], record: RunRecord, window_steps: tuple[int, int],
                   shift_ns: int, origin: int) -> int | None:
    """Median gap between the ``ProfilerStep#N`` starts (mapped) and the starts of the steps they record.

    The ranges are matched in order from the end: the last N ranges are the last N steps of the
    window (the window's first step is the profiler's warm-up, which may have no range), so a clock
    error of any size is found. None when nothing can be matched or the gaps disagree by more than
    a step (then the wall-clock mapping alone is used).
    """
    first, last = window_steps
    marks = sorted(float(event["ts"]) for event in events
                   if str(event.get("name", "")).startswith("ProfilerStep#") and isinstance(event.get("ts"), (int, float)))
    steps = record.steps
    window = np.arange(max(first, 0), min(last, len(steps) - 1) + 1)
    count = min(len(marks), len(window))
    if not count:
        return None
    starts = (steps.start_ns[window[-count:]] - origin).astype(np.float64)
    mapped = np.array(marks[-count:]) * 1000.0 + shift_ns  # ns relative to the origin
    residuals = mapped - starts
    median = float(np.median(residuals))
    if np.ptp(residuals) > float(np.median(steps.duration_ns[window[-count:]])) or abs(median) > MAX_RESIDUAL_NS:
        return None
    return int(round(median))
