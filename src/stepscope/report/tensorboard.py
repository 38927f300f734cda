"""TensorBoard scalars of a run (``--tensorboard DIR``), written with the ``tensorboard`` package.

What is written (one event file in ``DIR``; TensorBoard's "Scalars" tab):

- per step (x = step index, wall time = the step's start): ``step/time_ms``,
  ``step/phase_ms/<phase>`` and ``step/phase_share/<phase>`` for data_wait, forward, backward,
  optimizer and other;
- per sampler interval (x = index of the step running at that moment, wall time = the sample's):
  ``system/cpu_busy_pct``, ``system/memory_used_gib``, ``system/main_rss_gib``, and per GPU
  ``system/gpu<N>_util_pct`` and ``system/gpu<N>_memory_gib``;
- the steady state, once at the last step: ``steady/step_time_ms``, ``steady/steps_per_s``,
  ``steady/phase_share/<phase>``, ``steady/mfu``.

The writer is the ``tensorboard`` package's own event-file writer (the one
``torch.utils.tensorboard.SummaryWriter`` uses), so no torch import is needed. Without the package,
:func:`require_tensorboard` raises a :class:`~stepscope.errors.UsageError` (one line, exit 2): an
export that was asked for and cannot be made is an error, reported before any work is done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.record.run import PHASES
from stepscope.report.model import Report

INSTALL_HINT = "--tensorboard needs the 'tensorboard' package: pip install tensorboard"


def require_tensorboard() -> None:
    """Raise :class:`UsageError` when the tensorboard package cannot be imported."""
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: F401
    except ImportError:
        raise UsageError(INSTALL_HINT) from None


def write_tensorboard(report: Report, log_dir: str | Path) -> int:
    """Write the run's scalars into ``log_dir``; returns how many scalar values were written."""
    require_tensorboard()
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    record = report.evidence.record
    if record is None:
        raise UsageError("--tensorboard needs a run record (stepscope run / stepscope report)")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(log_dir))
    wall_offset_s = (record.meta.start_wall_ns - record.meta.start_ns) / 1e9
    written = 0

    def emit(step: int, wall_s: float, values: dict[str, float]) -> None:
        nonlocal written
        items = [Summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()
                 if np.isfinite(value)]
        if items:
            writer.add_event(Event(wall_time=wall_s, step=int(step), summary=Summary(value=items)))
            written += len(items)

    try:
        for step, wall_s, values in _step_scalars(report, wall_offset_s):
            emit(step, wall_s, values)
        for step, wall_s, values in _system_scalars(report, wall_offset_s):
            emit(step, wall_s, values)
        last = max(len(record.steps) - 1, 0)
        end_s = (int(record.steps.end_ns[-1]) / 1e9 + wall_offset_s) if len(record.steps) else wall_offset_s
        emit(last, end_s, _steady_scalars(report))
    finally:
        writer.close()
    return written


def _step_scalars(report: Report, wall_offset_s: float) -> Any:
    steps = report.evidence.record.steps  # type: ignore[union-attr]
    duration = steps.duration_ns.astype(np.float64)
    phases = {name: steps.phase(name).astype(np.float64) for name in PHASES}
    walls = steps.start_ns / 1e9 + wall_offset_s
    for index in range(len(steps)):
        total = duration[index]
        values = {"step/time_ms": total / 1e6}
        for name, column in phases.items():
            values[f"step/phase_ms/{name}"] = column[index] / 1e6
            values[f"step/phase_share/{name}"] = column[index] / total if total > 0 else float("nan")
        yield index, float(walls[index]), values


def _system_scalars(report: Report, wall_offset_s: float) -> Any:
    timelines = report.timelines
    record = report.evidence.record
    if timelines is None or record is None:
        return
    steps = np.searchsorted(record.steps.start_ns, timelines.t_ns, side="right") - 1
    busy = timelines.core_busy
    for row in range(len(timelines)):
        cores = busy[row][~np.isnan(busy[row])] if busy.shape[1] else np.array([])
        values = {"system/cpu_busy_pct": float(cores.mean() * 100) if cores.size else float("nan"),
                  "system/memory_used_gib": timelines.mem_used[row] / 2**30,
                  "system/main_rss_gib": timelines.main_rss[row] / 2**30}
        for gpu in range(timelines.gpu_util.shape[1]):
            values[f"system/gpu{gpu}_util_pct"] = timelines.gpu_util[row, gpu] * 100
            values[f"system/gpu{gpu}_memory_gib"] = timelines.gpu_mem_used[row, gpu] / 2**30
        yield max(int(steps[row]), 0), float(timelines.t_ns[row] / 1e9 + wall_offset_s), values


def _steady_scalars(report: Report) -> dict[str, float]:
    steady = report.steady
    values = {"steady/step_time_ms": (steady.mean_s or float("nan")) * 1e3,
              "steady/steps_per_s": steady.steps_per_s or float("nan")}
    values.update({f"steady/phase_share/{name}": share for name, share in steady.phase_shares.items()})
    if report.evidence.mfu is not None:
        values["steady/mfu"] = report.evidence.mfu.value
    return values
