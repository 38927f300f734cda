"""One frame of ``stepscope monitor``: rates and shares between the last two samples.

:func:`live_frame` turns :class:`~stepscope.record.samples.Samples` (at least two) into a
:class:`MonitorFrame` with the same arithmetic as the run's signals (:mod:`stepscope.analysis.run.signals`),
so the live view and the run summary never disagree on what "busy" or "read rate" means.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.analysis.run.signals import core_busy_shares, counter_deltas, iowait_share, process_cpu_utils
from stepscope.record.samples import Samples


@dataclass(frozen=True)
class DeviceRates:
    name: str
    read_bytes_per_s: float | None  # or received, for a NIC
    write_bytes_per_s: float | None  # or sent


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str
    util: float | None  # 0..1
    memory_util: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    sm_clock_mhz: int | None
    power_w: float | None
    temperature_c: int | None
    pcie_tx_bytes_per_s: int | None
    pcie_rx_bytes_per_s: int | None


@dataclass(frozen=True)
class ProcessRow:
    pid: int
    ppid: int
    uid: int
    name: str
    command: str
    role: str
    state: str
    cpu_util: float | None  # share of one core
    rss_bytes: int | None
    threads: int | None
    gpu_memory_bytes: int | None = None


@dataclass(frozen=True)
class MonitorFrame:
    """The machine between two samples."""

    ts_ns: int
    seconds: float
    hostname: str
    core_utils: tuple[float | None, ...]
    cpu_util: float | None
    iowait_share: float | None
    load1: float | None
    runnable_threads: int | None
    mem_used_bytes: int
    mem_available_bytes: int
    mem_cached_bytes: int
    mem_total_bytes: int
    swap_used_bytes: int
    swap_total_bytes: int
    swap_in_bytes_per_s: float | None
    swap_out_bytes_per_s: float | None
    disks: tuple[DeviceRates, ...]
    nics: tuple[DeviceRates, ...]
    gpus: tuple[GpuRow, ...]
    processes: tuple[ProcessRow, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def live_frame(samples: Samples, top: int | None = 10) -> MonitorFrame:
    """The frame between the last two samples; processes sorted by CPU, the ``top`` busiest kept.

    Raises:
        ValueError: fewer than two samples.
    """
    if len(samples) < 2:
        raise ValueError("a frame needs two samples")
    last = slice(len(samples) - 2, len(samples))
    ts = samples.ts_ns[last]
    seconds = float(ts[1] - ts[0]) / 1e9
    shares = core_busy_shares(_tail(samples))[-1]
    meta = samples.meta
    return MonitorFrame(
        ts_ns=int(ts[1]), seconds=seconds, hostname=meta.hostname,
        core_utils=tuple(None if np.isnan(share) else float(share) for share in shares),
        cpu_util=float(np.nanmean(shares)) if not np.isnan(shares).all() else None,
        iowait_share=iowait_share(_tail(samples), np.ones(1, dtype=bool)),
        load1=_known(samples["load1"][-1]),
        runnable_threads=_known_int(samples["procs_running"][-1] - 1),
        mem_used_bytes=int(samples["mem_used_bytes"][-1]),
        mem_available_bytes=int(samples["mem_available_bytes"][-1]),
        mem_cached_bytes=int(samples["mem_cached_bytes"][-1]),
        mem_total_bytes=meta.mem_total_bytes,
        swap_used_bytes=int(samples["swap_used_bytes"][-1]), swap_total_bytes=meta.swap_total_bytes,
        swap_in_bytes_per_s=_rate(samples["swap_in_bytes"], seconds),
        swap_out_bytes_per_s=_rate(samples["swap_out_bytes"], seconds),
        disks=_devices(samples, meta.disks, "disk_read_bytes", "disk_write_bytes", seconds),
        nics=_devices(samples, meta.nics, "net_recv_bytes", "net_sent_bytes", seconds),
        gpus=_gpus(samples),
        processes=_processes(samples, top),
        notes=samples.notes,
    )


def _tail(samples: Samples) -> Samples:
    """The last two samples only (the processes table is shared)."""
    keep = slice(len(samples) - 2, len(samples))
    rows = samples.proc["sample"] >= len(samples) - 2
    proc = {name: values[rows] for name, values in samples.proc.items()}
    proc["sample"] = proc["sample"] - (len(samples) - 2)
    return Samples(samples.meta, {name: values[keep] for name, values in samples.series.items()}, proc,
                   samples.gpu_procs, samples.processes, samples.notes)


def _devices(samples: Samples, names: tuple[str, ...], read: str, write: str,
             seconds: float) -> tuple[DeviceRates, ...]:
    return tuple(DeviceRates(name, _rate(samples[read][:, i], seconds), _rate(samples[write][:, i], seconds))
                 for i, name in enumerate(names))


def _gpus(samples: Samples) -> tuple[GpuRow, ...]:
    rows = []
    for column, gpu in enumerate(samples.meta.gpus):
        def value(name: str, column: int = column) -> int | None:
            return _known_int(samples[name][-1, column])

        util, memory_util, power = value("gpu_util"), value("gpu_mem_util"), value("gpu_power_mw")
        rows.append(GpuRow(
            index=gpu.index, name=gpu.name, util=None if util is None else util / 100,
            memory_util=None if memory_util is None else memory_util / 100,
            memory_used_bytes=value("gpu_mem_used_bytes"),
            memory_total_bytes=gpu.memory_total_bytes if gpu.memory_total_bytes >= 0 else None,
            sm_clock_mhz=value("gpu_sm_clock_mhz"), power_w=None if power is None else power / 1000,
            temperature_c=value("gpu_temp_c"), pcie_tx_bytes_per_s=value("gpu_pcie_tx_bytes_per_s"),
            pcie_rx_bytes_per_s=value("gpu_pcie_rx_bytes_per_s"),
        ))
    return tuple(rows)


def _processes(samples: Samples, top: int | None) -> tuple[ProcessRow, ...]:
    tail = _tail(samples)
    utils = process_cpu_utils(tail, np.ones(1, dtype=bool))
    latest = tail.proc["sample"] == 1
    by_id = {int(proc_id): row for row, proc_id in enumerate(tail.proc["id"]) if latest[row]}
    gpu_memory = _gpu_memory_by_pid(samples)
    rows = []
    for info in samples.processes:
        row = by_id.get(info.id)
        if row is None:
            continue
        rows.append(ProcessRow(
            pid=info.pid, ppid=info.ppid, uid=info.uid, name=info.name,
            command=" ".join(info.cmdline) or f"[{info.name}]", role=info.role,
            state=str(tail.proc["state"][row]), cpu_util=utils.get(info.id),
            rss_bytes=_known_int(tail.proc["rss_bytes"][row]), threads=_known_int(tail.proc["threads"][row]),
            gpu_memory_bytes=gpu_memory.get(info.pid),
        ))
    rows.sort(key=lambda item: (item.role != "main", -(item.cpu_util or 0.0), -(item.rss_bytes or 0), item.pid))
    return tuple(rows[:top] if top is not None else rows)


def _gpu_memory_by_pid(samples: Samples) -> dict[int, int]:
    """GPU memory per pid at the last sample that read the GPU process list."""
    read = np.flatnonzero(samples["gpu_procs_read"] == 1)
    if not read.size:
        return {}
    rows = samples.gpu_procs["sample"] == read[-1]
    out: dict[int, int] = {}
    for pid, used in zip(samples.gpu_procs["pid"][rows].tolist(), samples.gpu_procs["mem_bytes"][rows].tolist()):
        out[pid] = out.get(pid, 0) + max(used, 0)
    return out


def _rate(counter: np.ndarray, seconds: float) -> float | None:
    delta = counter_deltas(counter[-2:])
    return None if seconds <= 0 or np.isnan(delta).any() else float(delta.sum()) / seconds


def _known(value: float) -> float | None:
    return None if value < 0 or np.isnan(value) else float(value)


def _known_int(value: Any) -> int | None:
    return None if value < 0 else int(value)
