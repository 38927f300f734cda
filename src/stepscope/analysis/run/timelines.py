"""System timelines: what the sampler saw, interval by interval, on the steps' clock.

:func:`system_timelines` turns the sampler's cumulative counters into one value per *interval*
between two consecutive samples (the HTML report draws them under the step chart, the Perfetto
export writes them as counter tracks, the TensorBoard export maps them onto steps). Everything is
a plain function of :class:`~stepscope.record.samples.Samples`; nothing is averaged away, so a
display that needs fewer points down-samples the arrays itself.

Step by step:

1. An interval ``i`` runs from sample ``i`` to sample ``i + 1``; its time ``t_ns[i]`` is its end
   (the sample that closes it), on the same CLOCK_MONOTONIC as the steps' ``start_ns``.
2. Counters become rates with :func:`~stepscope.analysis.run.signals.counter_deltas` (NaN where a
   side is unknown or the counter went back); per-core busy shares are
   :func:`~stepscope.analysis.run.signals.core_busy_shares`.
3. Process CPU: each process sampled at both ends of an interval contributes its tick difference
   over the interval's seconds (cores: 1.0 = one core busy); the main process and the DataLoader
   workers (summed) are kept apart.
4. Gauges (memory used, main RSS, GPU utilisation and memory) take the value of the closing
   sample; -1 (not measured) becomes NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepscope.analysis.run.signals import core_busy_shares, counter_deltas
from stepscope.record.samples import Samples


@dataclass(frozen=True)
class SystemTimelines:
    """Per-interval machine series (NaN: not measured). Lengths are all ``len(t_ns)``."""

    t_ns: np.ndarray  # interval end, monotonic clock (ns)
    core_busy: np.ndarray  # (intervals, cores) busy share 0..1 (user + system)
    cpu_ids: tuple[int, ...]
    main_cpu: np.ndarray  # main process, cores (1.0 = one core)
    workers_cpu: np.ndarray  # DataLoader workers summed, cores
    workers_alive: np.ndarray  # DataLoader workers sampled at the interval's end
    disk_read: np.ndarray  # bytes/s, all disks
    disk_write: np.ndarray  # bytes/s, all disks
    mem_used: np.ndarray  # bytes (machine)
    mem_total_bytes: int
    main_rss: np.ndarray  # bytes
    gpu_util: np.ndarray  # (intervals, gpus) 0..1
    gpu_mem_used: np.ndarray  # (intervals, gpus) bytes
    gpu_names: tuple[str, ...]
    gpu_mem_total_bytes: tuple[int, ...]

    def __len__(self) -> int:
        return int(self.t_ns.shape[0])

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_util.shape[1]) and not np.isnan(self.gpu_util).all()

    @property
    def has_workers(self) -> bool:
        return bool(np.nan_to_num(self.workers_alive).any())

    @property
    def cpu_busy_mean(self) -> np.ndarray:
        """Per interval, the busy share of all cores (0..1; NaN where no core was measured)."""
        busy = self.core_busy
        if not busy.shape[1]:
            return np.full(len(self), np.nan)
        measured = ~np.isnan(busy).all(axis=1)
        mean = np.full(len(self), np.nan)
        mean[measured] = np.nanmean(busy[measured], axis=1)
        return mean


def system_timelines(samples: Samples | None) -> SystemTimelines | None:
    """The :class:`SystemTimelines` of a run's samples, or None with fewer than two samples."""
    if samples is None or len(samples) < 2:
        return None
    ts = samples.ts_ns
    seconds = np.diff(ts) / 1e9
    seconds[seconds <= 0] = np.nan
    main, workers, alive = process_cpu_by_role(samples)
    return SystemTimelines(
        t_ns=ts[1:].astype(np.int64),
        core_busy=core_busy_shares(samples),
        cpu_ids=tuple(samples.meta.cpus) or tuple(range(samples["cpu_user"].shape[1])),
        main_cpu=main, workers_cpu=workers, workers_alive=alive,
        disk_read=summed_rate(samples["disk_read_bytes"], seconds),
        disk_write=summed_rate(samples["disk_write_bytes"], seconds),
        mem_used=gauge(samples["mem_used_bytes"][1:]),
        mem_total_bytes=int(samples.meta.mem_total_bytes),
        main_rss=main_rss(samples),
        gpu_util=gauge(samples["gpu_util"][1:]) / 100.0,
        gpu_mem_used=gauge(samples["gpu_mem_used_bytes"][1:]),
        gpu_names=tuple(gpu.name for gpu in samples.meta.gpus),
        gpu_mem_total_bytes=tuple(gpu.memory_total_bytes for gpu in samples.meta.gpus),
    )


def gauge(values: np.ndarray) -> np.ndarray:
    """A gauge as float64 with -1 (not measured) as NaN."""
    out = values.astype(np.float64)
    out[values < 0] = np.nan
    return out


def summed_rate(counter: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Per-interval rate of a cumulative counter, summed over its items (NaN when none is known)."""
    deltas = counter_deltas(counter)
    if deltas.ndim == 2:
        if deltas.shape[1] == 0:
            return np.full(len(seconds), np.nan)
        known = ~np.isnan(deltas).all(axis=1)
        deltas = np.where(known, np.nansum(deltas, axis=1), np.nan)
    rates: np.ndarray = deltas / seconds
    return rates


def process_cpu_by_role(samples: Samples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per interval: main process CPU, DataLoader workers' CPU (summed), workers alive at its end."""
    intervals = len(samples) - 1
    main = np.full(intervals, np.nan)
    workers = np.full(intervals, np.nan)
    alive = np.zeros(intervals)
    proc = samples.proc
    if not len(proc["id"]):
        return main, workers, alive
    # 0 other, 1 main, 2 worker; looked up by id, not indexed by it (an id is a number from the
    # samples file: a damaged one can be in the billions)
    known = {info.id: 1 if info.role == "main" else 2 if info.role == "dataloader_worker" else 0
             for info in samples.processes}
    known_ids = np.array(sorted(known), dtype=np.int64)
    known_roles = np.array([known[item] for item in known_ids.tolist()], dtype=np.int8)

    def roles_of(ids: np.ndarray) -> np.ndarray:
        if not len(known_ids):
            return np.zeros(len(ids), dtype=np.int8)
        at = np.minimum(np.searchsorted(known_ids, ids), len(known_ids) - 1)
        return np.where(known_ids[at] == ids, known_roles[at], 0).astype(np.int8)
    order = np.lexsort((proc["sample"], proc["id"]))
    ids, rows, ticks = proc["id"][order], proc["sample"][order], proc["cpu_ticks"][order]
    pair = (ids[1:] == ids[:-1]) & (rows[1:] == rows[:-1] + 1) & (ticks[:-1] >= 0) & (ticks[1:] >= ticks[:-1])
    interval = rows[:-1][pair]
    span_s = (samples.ts_ns[rows[1:]] - samples.ts_ns[rows[:-1]])[pair] / 1e9
    cores = np.where(span_s > 0, (ticks[1:] - ticks[:-1])[pair] / samples.meta.clock_ticks_per_s
                     / np.where(span_s > 0, span_s, 1.0), 0.0)
    role = roles_of(ids[1:][pair])
    for code, target in ((1, main), (2, workers)):
        chosen = role == code
        if chosen.any():
            sums = np.bincount(interval[chosen], weights=cores[chosen], minlength=intervals)
            seen = np.bincount(interval[chosen], minlength=intervals) > 0
            target[seen] = sums[seen]
    worker_rows = proc["sample"][roles_of(proc["id"]) == 2]
    worker_rows = worker_rows[worker_rows >= 1] - 1
    alive[:] = np.bincount(worker_rows, minlength=intervals)[:intervals]
    if np.isnan(workers).all() and alive.any():
        workers[:] = 0.0
    return main, workers, alive


def main_rss(samples: Samples) -> np.ndarray:
    """RSS of the main process at each interval's closing sample (NaN where it was not sampled)."""
    out = np.full(len(samples) - 1, np.nan)
    main_ids = [info.id for info in samples.processes_with_role("main")]
    proc = samples.proc
    keep = np.isin(proc["id"], main_ids) & (proc["sample"] >= 1) & (proc["rss_bytes"] >= 0)
    out[proc["sample"][keep] - 1] = proc["rss_bytes"][keep]
    return out
