"""TensorBoard scalars of a run (``--tensorboard DIR``), written with the ``tensorboard`` package.

What is written (one event file in ``DIR``; TensorBoard's "Scalars" tab):

- per step (x = step index, wall time = the step's start): ``step/time_ms`` and
  ``step/phase_share/<phase>`` for data_wait, forward, backward, optimizer and other (a phase's
  time is its share × the step time);
- per sampler interval (x = index of the step running at that moment, wall time = the sample's):
  ``system/cpu_busy_pct``, ``system/memory_used_gib``, ``system/main_rss_gib``, and per GPU
  ``system/gpu<N>_util_pct`` and ``system/gpu<N>_memory_gib``;
- the steady state, once at the last step: ``steady/step_time_ms``, ``steady/steps_per_s``,
  ``steady/phase_share/<phase>``, ``steady/mfu``.

Events are the ``tensorboard`` package's own protobufs (what ``torch.utils.tensorboard.SummaryWriter``
writes), so no torch import is needed. The file is framed here (TFRecord: length, masked CRC-32C of
the length, the event, masked CRC-32C of the event) because the package's writer checksums in pure
Python, 0.2 ms per event — 25 s for a 100,000-step run; :func:`masked_crc32c_many` computes the
same checksums for all records at once with numpy. Without the package,
:func:`require_tensorboard` raises a :class:`~stepscope.errors.UsageError` (one line, exit 2): an
export that was asked for and cannot be made is an error, reported before any work is done.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from pathlib import Path

import numpy as np

from stepscope.errors import UsageError
from stepscope.report.model import PHASES, Report
from stepscope.report.run_view import StepSeries
from stepscope.report.render.output import Output
from stepscope.safe_write import atomic_write

INSTALL_HINT = "--tensorboard needs the 'tensorboard' package: pip install tensorboard"


def require_tensorboard() -> None:
    """Raise :class:`UsageError` when the tensorboard package cannot be imported."""
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: F401
    except ImportError:
        raise UsageError(INSTALL_HINT) from None


def render(report: Report, out: Output) -> list[str]:
    """The scalars into the directory ``out.path``; the notice says how many and where."""
    assert out.path is not None, "TensorBoard scalars are written into a directory"
    count = write_tensorboard(report, out.path)
    return [f"{count:,} TensorBoard scalars to {out.path} (tensorboard --logdir {out.path})"]


def write_tensorboard(report: Report, log_dir: str | Path) -> int:
    """Write the run's scalars into ``log_dir``; returns how many scalar values were written."""
    require_tensorboard()
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    steps = report.steps
    if steps is None:
        raise UsageError("--tensorboard needs a run record (stepscope run / stepscope report)")
    wall_offset_s = steps.wall_offset_s
    events = [Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()]
    written = 0

    def emit(columns: Columns) -> None:
        nonlocal written
        steps, walls, values = columns
        tags = list(values.items())
        for row, (step, wall_s) in enumerate(zip(steps, walls)):
            items = [Summary.Value(tag=tag, simple_value=column[row]) for tag, column in tags
                     if math.isfinite(column[row])]
            if items:
                events.append(Event(wall_time=wall_s, step=step, summary=Summary(value=items)).SerializeToString())
                written += len(items)

    emit(_step_scalars(steps))
    emit(_system_scalars(report, steps))
    last = max(len(steps) - 1, 0)
    end_s = (int(steps.start_ns[-1] + steps.duration_ns[-1]) / 1e9 + wall_offset_s) if len(steps) else wall_offset_s
    emit(([last], [end_s], {tag: [value] for tag, value in _steady_scalars(report).items()}))
    directory = Path(log_dir)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.0.stepscope"
    atomic_write(directory / name, frame_records(events))  # a full disk leaves no empty or half file
    return written


def frame_records(records: list[bytes]) -> bytes:
    """TFRecord framing of ``records``: ``<Q len><I masked crc(len)><data><I masked crc(data)>`` each."""
    headers = [struct.pack("<Q", len(data)) for data in records]
    header_crcs = masked_crc32c_many(headers)
    data_crcs = masked_crc32c_many(records)
    return b"".join(header + struct.pack("<I", header_crc) + data + struct.pack("<I", data_crc)
                    for header, header_crc, data, data_crc in zip(headers, header_crcs, records, data_crcs))


def _crc_table() -> np.ndarray:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) lookup table."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1).astype(np.uint32)
    return table


_TABLE = _crc_table()


def masked_crc32c_many(records: list[bytes]) -> list[int]:
    """The TFRecord masked CRC-32C of each record, computed for all records of one length at once."""
    out = [0] * len(records)
    by_length: dict[int, list[int]] = {}
    for index, data in enumerate(records):
        by_length.setdefault(len(data), []).append(index)
    for length, indexes in by_length.items():
        crc = np.full(len(indexes), 0xFFFFFFFF, dtype=np.uint32)
        if length:
            block = np.frombuffer(b"".join(records[i] for i in indexes), dtype=np.uint8).reshape(len(indexes), length)
            for column in range(length):
                crc = _TABLE[(crc ^ block[:, column]) & 0xFF] ^ (crc >> np.uint32(8))
        crc ^= np.uint32(0xFFFFFFFF)
        masked = (((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(0xA282EAD8)).astype(np.uint32)
        for index, value in zip(indexes, masked.tolist()):
            out[index] = int(value)
    return out


Columns = tuple[list[int], list[float], dict[str, list[float]]]  # steps, wall times, tag -> values


def _step_scalars(steps: StepSeries) -> Columns:
    columns = {"step/time_ms": steps.duration_ns.astype(np.float64) / 1e6}
    for name in PHASES:
        columns[f"step/phase_share/{name}"] = steps.phase_shares[name]
    walls = steps.start_ns / 1e9 + steps.wall_offset_s
    return list(range(len(steps))), walls.tolist(), {tag: values.tolist() for tag, values in columns.items()}


def _system_scalars(report: Report, steps: StepSeries) -> Columns:
    timelines = report.timelines
    if timelines is None or len(steps.sample_steps) != len(timelines):
        return [], [], {}
    columns = {"system/cpu_busy_pct": timelines.cpu_busy_mean * 100, "system/memory_used_gib": timelines.mem_used / 2**30,
               "system/main_rss_gib": timelines.main_rss / 2**30}
    for gpu in range(timelines.gpu_util.shape[1]):
        columns[f"system/gpu{gpu}_util_pct"] = timelines.gpu_util[:, gpu] * 100
        columns[f"system/gpu{gpu}_memory_gib"] = timelines.gpu_mem_used[:, gpu] / 2**30
    walls = timelines.t_ns / 1e9 + steps.wall_offset_s
    return steps.sample_steps.tolist(), walls.tolist(), {tag: values.tolist() for tag, values in columns.items()}


def _steady_scalars(report: Report) -> dict[str, float]:
    summary = report.summary
    if summary is None:
        return {}
    steady = summary.steady
    values = {"steady/step_time_ms": (steady.mean_s or float("nan")) * 1e3,
              "steady/steps_per_s": steady.steps_per_s or float("nan")}
    values.update({f"steady/phase_share/{name}": share for name, share in steady.phase_shares.items()})
    if summary.mfu is not None:
        values["steady/mfu"] = summary.mfu.value
    return values
