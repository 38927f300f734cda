"""Macro signals: what the sampler saw during the steps, as :class:`MacroSignals`.

:func:`compute_signals` joins samples with steps on their shared monotonic clock and fills every
field it can; each signal is a plain function of arrays, tested on its own.

How the join works, step by step:

1. The *window* is the run's :class:`~stepscope.analysis.run.window.SteadyWindow`: the steady
   steps, as every other view of the run (the evidence bundle passes it); start-up, warm-up,
   excluded steps and tear-down stay out of the averages.
2. Counters are cumulative, so each *interval* between two consecutive samples gives a difference;
   an interval belongs to the window when its midpoint does. A -1 (not measured) on either side
   drops that interval for that counter. Levels (memory, threads, processes, run queue, GPU
   utilisation) are read at one moment: a sample belongs when it was read inside the window.
3. Shares are ratios of summed differences (ticks of iowait / all ticks), rates are summed bytes
   over summed seconds: long and short intervals weigh by their length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.analysis.evidence import MacroSignals, WorkerLoad
from stepscope.analysis.run.window import SteadyWindow, all_steps_window, samples_window
from stepscope.record.samples import Samples

#: A core (or a worker process) above this share of one core is saturated. 90% is the common
#: "pegged" line of top-like tools; a loaded core rarely reads 100% over 100 ms windows.
SATURATED = 0.9
#: Page-cache warming: disk reads in the first third of the run at least this many times those of
#: the last third (the data set is read from disk once, then served from memory)...
WARMING_RATIO = 4.0
#: ...and the early reads at least this fast (bytes/s), so background noise is not called warming.
WARMING_MIN_EARLY_BYTES_PER_S = 1 << 20
#: Fewer intervals than this in the window: early/late splits and trends are not computed.
MIN_TREND_INTERVALS = 6
#: At most this many per-process loads are kept in ``MacroSignals.workers`` (the busiest).
MAX_PROCESS_LOADS = 64


def compute_signals(samples: Samples | None, steps: Any = None, window: SteadyWindow | None = None) -> MacroSignals:
    """Derive the macro signals of a run from its samples over one window.

    Args:
        samples: the sampler's :class:`~stepscope.record.samples.Samples`, or ``None``.
        steps: the run's :class:`~stepscope.record.run.StepTable` (columns ``start_ns``/``duration_ns``),
            or ``None``; with it, the steps that mostly wait for data are found.
        window: the :class:`~stepscope.analysis.run.window.SteadyWindow` to average over (the
            evidence bundle passes the steady one); by default every step, or the whole sampled
            time without steps.

    Returns:
        :class:`MacroSignals`; fields that cannot be measured stay ``None``.
    """
    if samples is None or len(samples) < 2:
        few = () if samples is None else (*samples.notes, "fewer than 2 samples: no macro signals")
        return MacroSignals(sample_count=0 if samples is None else len(samples), notes=few)
    ts = samples.ts_ns
    if window is None:
        window = (all_steps_window(steps) if steps is not None and len(steps) else None) or samples_window(ts)
    mask = window.interval_mask(ts)
    instants = window.instant_mask(ts)
    start, end = window.start_ns, window.end_ns
    notes = list(samples.notes)
    if not mask.any():
        notes.append("no sample interval falls inside the steps; signals cover the whole sampled time")
        mask = np.ones(len(ts) - 1, dtype=bool)
        instants = np.ones(len(ts), dtype=bool)
        start, end = int(ts[0]), int(ts[-1])
    elif window.basis == "all steps" and not window.mask.all():
        notes.append("the steady steps span too few sampler intervals: the signals cover every step, "
                     "warm-up included")
    seconds = np.diff(ts) / 1e9
    cores = cpu_count(samples)
    shares = core_busy_shares(samples)[mask]
    busiest, idlest, saturated = core_extremes(shares)
    ticks = ProcessTicks.of(samples, mask) if len(samples.proc["id"]) else None
    loads = process_loads(samples, mask, ticks)
    workers = [load for load in loads if load.role == "dataloader_worker"]
    reads = counter_rate(samples["disk_read_bytes"], seconds, mask)
    early, late = early_late_rates(samples["disk_read_bytes"], seconds, mask)
    gpu_util = samples["gpu_util"]
    net = counter_rate(samples["net_recv_bytes"], seconds, mask)
    net_sent = counter_rate(samples["net_sent_bytes"], seconds, mask)
    return MacroSignals(
        sample_count=int(mask.sum()) + 1,
        interval_s=samples.meta.interval_s,
        cpu_count=cores,
        cpu_util_mean=_mean(shares),
        busiest_core_util=busiest,
        idlest_core_util=idlest,
        saturated_cores=saturated,
        iowait_share=iowait_share(samples, mask),
        steal_share=cpu_time_share(samples, mask, "cpu_steal"),
        load_per_core=_per_core(_mean(samples["load1"][instants], floor=0.0), cores),
        runnable_threads_per_core=runnable_threads_per_core(samples, instants),
        main_cpu_util=next((load.cpu_util for load in loads if load.role == "main"), None),
        worker_count=max_concurrent(samples, "dataloader_worker", instants) if workers else 0,
        workers=tuple(loads[:MAX_PROCESS_LOADS]),
        worker_cpu_util_mean=_mean(np.array([load.cpu_util for load in workers])) if workers else None,
        worker_saturation=(sum(load.cpu_util > SATURATED for load in workers) / len(workers)) if workers else None,
        thread_count_max=thread_count_max(samples, instants),
        worker_running_threads=pooled_running_threads(samples, mask, "dataloader_worker", ticks),
        disk_read_bytes_per_s=reads,
        disk_read_bytes_per_s_early=early,
        disk_read_bytes_per_s_late=late,
        page_cache_warming=page_cache_warming(early, late),
        memory_used_share_max=memory_used_share_max(samples, instants),
        **memory_trend(samples, instants).fields(),
        swap_in_bytes_per_s=counter_rate(samples["swap_in_bytes"], seconds, mask),
        swap_out_bytes_per_s=counter_rate(samples["swap_out_bytes"], seconds, mask),
        net_bytes_per_s=None if net is None and net_sent is None else (net or 0.0) + (net_sent or 0.0),
        gpu_count=gpu_util.shape[1] if gpu_util.shape[1] else None,
        gpu_util_mean=gpu_util_mean(gpu_util[instants]),
        gpu_util_oscillation=gpu_util_oscillation(ts[instants], gpu_util[instants], step_period_s(steps, window),
                                                  samples.meta.interval_s),
        gpu_memory_used_share_max=gpu_memory_used_share_max(samples, instants),
        data_wait_cpu_util=data_wait_cpu_util(samples, steps, mask),
        loader_runnable_share=loader_runnable_share(samples, instants),
        memory_total_bytes=samples.meta.mem_total_bytes or None,
        foreign_processes=foreign_processes(samples.foreign, start, end),
        unseen_tree_cores=None if (unseen := counter_rate(samples["tree_unseen_cpu_ticks"], seconds, mask)) is None
        else unseen / samples.meta.clock_ticks_per_s,
        job_cores=job_cores(samples.foreign_totals, start, end),
        notes=tuple(notes),
    )


#: Processes outside the training tree named in the signals.
MAX_FOREIGN = 5


def foreign_processes(scans: tuple[tuple[int, float, tuple[tuple[int, str, float], ...]], ...],
                      start: int, end: int) -> tuple[tuple[int, str, float], ...]:
    """The busiest processes outside the training tree over the window: (pid, name, mean cores).

    Each scan covers ``interval_s`` before its timestamp; a process's share is its CPU time over
    the scans that overlap the window divided by their total time (absent from a scan = idle).
    """
    inside = [scan for scan in scans if scan[0] > start and scan[0] - scan[1] * 1e9 < end] or list(scans)
    total_s = sum(scan[1] for scan in inside)
    if total_s <= 0:
        return ()
    busy: dict[tuple[int, str], float] = {}
    for _, interval_s, procs in inside:
        for pid, name, cores in procs:
            busy[(pid, name)] = busy.get((pid, name), 0.0) + cores * interval_s
    ranked = sorted(busy.items(), key=lambda item: -item[1])[:MAX_FOREIGN]
    return tuple((pid, name, round(seconds / total_s, 3)) for (pid, name), seconds in ranked)


def job_cores(totals: tuple[tuple[int, float, float, float], ...], start: int, end: int) -> float | None:
    """Mean cores of the job's other processes on this machine over the scans that overlap the
    window (every scan without one); None when no scan measured them (not under a launcher)."""
    measured = [scan for scan in totals if scan[3] >= 0 and scan[1] > 0]
    inside = [scan for scan in measured if scan[0] > start and scan[0] - scan[1] * 1e9 < end] or measured
    total_s = sum(scan[1] for scan in inside)
    if total_s <= 0:
        return None
    return round(sum(scan[3] * scan[1] for scan in inside) / total_s, 3)


# -- the window ------------------------------------------------------------------------------------
def step_period_s(steps: Any, window: SteadyWindow | None = None) -> float | None:
    """Median duration of the window's steps (every step without a window) in seconds; None without steps."""
    if steps is None or not len(steps):
        return None
    durations = np.asarray(steps.duration_ns)
    if window is not None and len(window.mask) == len(durations) and window.mask.any():
        durations = durations[window.mask]
    return float(np.median(durations)) / 1e9


# -- counters --------------------------------------------------------------------------------------
def counter_deltas(counter: np.ndarray) -> np.ndarray:
    """Differences of a cumulative counter, NaN where either side is unknown (-1) or it went back."""
    values = counter.astype(np.float64)
    values[counter < 0] = np.nan
    deltas = np.diff(values, axis=0)
    deltas[deltas < 0] = np.nan  # a counter reset (device re-attached): no data for that interval
    return deltas


def counter_rate(counter: np.ndarray, seconds: np.ndarray, mask: np.ndarray) -> float | None:
    """Units per second of a cumulative counter (summed over items of a 2-D one) over the window."""
    if counter.ndim == 2 and counter.shape[1] == 0:
        return None
    deltas = counter_deltas(counter)
    if deltas.ndim == 2:
        deltas = np.where(np.isnan(deltas).all(axis=1), np.nan, np.nansum(deltas, axis=1))
    valid = mask & ~np.isnan(deltas)
    if not valid.any() or seconds[valid].sum() <= 0:
        return None
    return float(deltas[valid].sum() / seconds[valid].sum())


def early_late_rates(counter: np.ndarray, seconds: np.ndarray, mask: np.ndarray) -> tuple[float | None, float | None]:
    """Rates over the first and the last third of the window's intervals."""
    rows = np.flatnonzero(mask)
    if len(rows) < MIN_TREND_INTERVALS:
        return None, None
    third = len(rows) // 3
    early, late = np.zeros_like(mask), np.zeros_like(mask)
    early[rows[:third]] = True
    late[rows[-third:]] = True
    return counter_rate(counter, seconds, early), counter_rate(counter, seconds, late)


def page_cache_warming(early: float | None, late: float | None) -> bool | None:
    """Reads high at the start, then low: the data set went from disk into the page cache."""
    if early is None or late is None:
        return None
    return early >= WARMING_MIN_EARLY_BYTES_PER_S and early >= WARMING_RATIO * max(late, 0.0)


# -- CPU -------------------------------------------------------------------------------------------
def cpu_count(samples: Samples) -> int:
    return int(samples["cpu_user"].shape[1])


def core_busy_shares(samples: Samples) -> np.ndarray:
    """Busy share (user + system) of each core in each interval, ``(samples - 1, cores)``, NaN unknown."""
    busy = counter_deltas(samples["cpu_user"]) + counter_deltas(samples["cpu_system"])
    total = busy + counter_deltas(samples["cpu_idle"]) + counter_deltas(samples["cpu_iowait"]) \
        + counter_deltas(samples["cpu_steal"])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, busy / total, np.nan)


def core_extremes(shares: np.ndarray) -> tuple[float | None, float | None, int | None]:
    """``(busiest, idlest, saturated)`` from per-interval core shares.

    The busiest (idlest) core is taken per interval, then averaged: the scheduler moves a busy
    thread between cores, so per-core averages would hide one saturated thread hopping around.
    ``saturated`` is the average number of cores above :data:`SATURATED`, rounded.
    """
    rows = shares[~np.isnan(shares).all(axis=1)] if shares.size else shares
    if not rows.size:
        return None, None, None
    busiest = float(np.nanmean(np.nanmax(rows, axis=1)))
    idlest = float(np.nanmean(np.nanmin(rows, axis=1)))
    saturated = int(round(float(np.mean(np.sum(rows > SATURATED, axis=1)))))
    return busiest, idlest, saturated


_CPU_TIME = ("cpu_user", "cpu_system", "cpu_idle", "cpu_iowait", "cpu_steal")


def cpu_time_share(samples: Samples, mask: np.ndarray, column: str) -> float | None:
    """Share of all CPU time (user, system, idle, iowait and steal) counted in one column."""
    parts = {name: counter_deltas(samples[name])[mask] for name in _CPU_TIME}
    valid = ~np.isnan(sum(parts.values()))
    total = float(sum(part[valid].sum() for part in parts.values()))
    return float(parts[column][valid].sum()) / total if total > 0 else None


def iowait_share(samples: Samples, mask: np.ndarray) -> float | None:
    """Share of all CPU time spent idle waiting for I/O."""
    return cpu_time_share(samples, mask, "cpu_iowait")


def runnable_threads_per_core(samples: Samples, instants: np.ndarray) -> float | None:
    """Mean runnable threads per core at the window's samples, the sampler's own thread (counted
    while it reads) taken out."""
    running = samples["procs_running"][instants].astype(np.float64)
    running = running[running >= 0]
    if not running.size:
        return None
    return float(np.mean(np.maximum(running - 1, 0))) / cpu_count(samples)


# -- processes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessTicks:
    """The tree's processes over a window's intervals (those a process was sampled at both ends of),
    summed by process id (the arrays' index): CPU seconds and sampled seconds; and, over the
    intervals whose main-thread CPU was read at both ends, the CPU ticks of the whole process and of
    its main thread. One ordering of the process table serves every per-process signal.
    ``window_s``: the window's sampled seconds, against which a process's own span is its presence."""

    busy_s: np.ndarray
    span_s: np.ndarray
    total_ticks: np.ndarray
    main_ticks: np.ndarray
    window_s: float

    @classmethod
    def of(cls, samples: Samples, mask: np.ndarray) -> ProcessTicks:
        proc = samples.proc
        order = np.lexsort((proc["sample"], proc["id"]))
        ids, rows, ticks = proc["id"][order], proc["sample"][order], proc["cpu_ticks"][order]
        pair = (ids[1:] == ids[:-1]) & (rows[1:] == rows[:-1] + 1)
        pair &= mask[np.minimum(rows[:-1], len(mask) - 1)] & (ticks[1:] >= ticks[:-1]) & (ticks[:-1] >= 0)
        ids, first, last = ids[1:][pair], order[:-1][pair], order[1:][pair]
        cpu = proc["cpu_ticks"][last] - proc["cpu_ticks"][first]
        span = samples.ts_ns[proc["sample"][last]] - samples.ts_ns[proc["sample"][first]]
        leader = proc["leader_ticks"] if "leader_ticks" in proc else np.full(len(proc["id"]), -1, dtype=np.int64)
        known = (leader[first] >= 0) & (leader[last] >= leader[first])
        return cls(np.bincount(ids, weights=cpu / samples.meta.clock_ticks_per_s), np.bincount(ids, weights=span / 1e9),
                   np.bincount(ids[known], weights=cpu[known], minlength=len(ids) and int(ids.max()) + 1),
                   np.bincount(ids[known], weights=(leader[last] - leader[first])[known],
                               minlength=len(ids) and int(ids.max()) + 1),
                   float(np.diff(samples.ts_ns)[mask[:len(samples.ts_ns) - 1]].sum()) / 1e9)

    def presence(self, proc_id: int) -> float:
        """The share of the window process ``proc_id`` was sampled in (1.0 for a window of no length)."""
        return min(1.0, float(self.span_s[proc_id]) / self.window_s) if self.window_s > 0 else 1.0

    def utils(self) -> dict[int, float]:
        """Each process's mean CPU (share of one core) over its own intervals."""
        return {int(proc_id): float(self.busy_s[proc_id] / self.span_s[proc_id])
                for proc_id in np.flatnonzero(self.span_s > 0)}


def process_cpu_utils(samples: Samples, mask: np.ndarray) -> dict[int, float]:
    """Mean CPU of each process (share of one core) over its intervals inside the window.

    An interval counts for a process when the process was sampled at both of its ends.
    """
    if not len(samples.proc["id"]):
        return {}
    return ProcessTicks.of(samples, mask).utils()


#: CPU ticks a process must use in the window before its threads' shares are read (at 100 ticks a
#: second, a tick is 10 ms: fewer make the ratio a matter of rounding).
RUNNING_THREADS_MIN_TICKS = 10


def _ran_on(total: float, main: float, cap: float) -> float | None:
    """Threads a process (or processes, pooled) ran on from its CPU ticks and its main thread's: at
    least one (the two are read a moment apart, and the kernel scales each count on its own: a
    process computing on its main thread alone reads 0.98-1.0), at most ``cap``, its threads; None
    under :data:`RUNNING_THREADS_MIN_TICKS`."""
    if total < RUNNING_THREADS_MIN_TICKS:
        return None
    return min(cap, max(1.0, total / main)) if main > 0 else cap


def process_running_threads(samples: Samples, mask: np.ndarray,
                            ticks: ProcessTicks | None = None) -> dict[int, float]:
    """Threads each process ran on, on average, over its intervals inside the window: its CPU over
    its main thread's. 1.0 is a process computing on its main thread alone (its other threads exist
    but sleep: a DataLoader worker's queue feeder, an idle intra-op pool); 4.0 four threads sharing
    the work evenly. At least 1 and at most the process's thread count; left out where the main
    thread's CPU was not read (older files, another platform) or the process used fewer than
    :data:`RUNNING_THREADS_MIN_TICKS`."""
    if not len(samples.proc["id"]):
        return {}
    ticks = ticks or ProcessTicks.of(samples, mask)
    threads = _max_by_id(samples.proc["id"], samples.proc["threads"])
    out = {}
    for proc_id in np.flatnonzero(ticks.total_ticks):
        ran = _ran_on(float(ticks.total_ticks[proc_id]), float(ticks.main_ticks[proc_id]),
                      float(max(1, threads.get(int(proc_id), 1))))
        if ran is not None:
            out[int(proc_id)] = ran
    return out


def pooled_running_threads(samples: Samples, mask: np.ndarray, role: str,
                           ticks: ProcessTicks | None = None) -> float | None:
    """The threads the processes of ``role`` ran on, pooled: their CPU over their main threads', over
    every one of them inside the window (DataLoader workers restarted every short epoch live a few
    samples each, too few ticks to read one by one). Capped at the most threads one of them had;
    None where the main threads' CPU was not read or they used fewer than
    :data:`RUNNING_THREADS_MIN_TICKS` together."""
    ids = np.array([info.id for info in samples.processes if info.role == role], dtype=np.int64)
    if not len(samples.proc["id"]) or not ids.size:
        return None
    ticks = ticks or ProcessTicks.of(samples, mask)
    threads = _max_by_id(samples.proc["id"], samples.proc["threads"])
    cap = float(max([1, *(threads.get(int(proc_id), 1) for proc_id in ids)]))
    paired = ids[ids < len(ticks.total_ticks)]  # the others had no interval in the window
    return _ran_on(float(ticks.total_ticks[paired].sum()), float(ticks.main_ticks[paired].sum()), cap)


def process_loads(samples: Samples, mask: np.ndarray, ticks: ProcessTicks | None = None) -> list[WorkerLoad]:
    """A :class:`WorkerLoad` per process of the tree: main first, then the busiest."""
    if not len(samples.proc["id"]):
        return []
    ticks = ticks or ProcessTicks.of(samples, mask)
    utils = ticks.utils()
    running = process_running_threads(samples, mask, ticks)
    rss = _max_by_id(samples.proc["id"], samples.proc["rss_bytes"])
    threads = _max_by_id(samples.proc["id"], samples.proc["threads"])
    loads = [WorkerLoad(pid=info.pid, role=info.role, cpu_util=utils[info.id], rss_bytes=rss.get(info.id),
                        threads=threads.get(info.id) if threads.get(info.id, -1) >= 0 else None,
                        running_threads=running.get(info.id),
                        presence=ticks.presence(info.id))
             for info in samples.processes if info.id in utils]
    return sorted(loads, key=lambda load: (load.role != "main", -load.cpu_util, load.pid))


#: A step counts as waiting for data when data wait is at least this share of it.
WAIT_DOMINATED = 0.5


def wait_dominated_intervals(samples: Samples, steps: Any, mask: np.ndarray) -> np.ndarray:
    """Sample intervals (inside ``mask``) whose midpoint falls in a step that mostly waits for data."""
    if steps is None or not len(steps):
        return np.zeros_like(mask)
    ts = samples.ts_ns
    middle = (ts[1:] + ts[:-1]) // 2
    starts = np.asarray(steps.start_ns)
    index = np.searchsorted(starts, middle, side="right") - 1
    valid = index >= 0
    index = np.clip(index, 0, len(starts) - 1)
    duration = np.asarray(steps.duration_ns)[index]
    inside = valid & (middle < starts[index] + duration)
    share = np.asarray(steps.data_wait_ns)[index] / np.maximum(duration, 1)
    dominated: np.ndarray = mask & inside & (share >= WAIT_DOMINATED)
    return dominated


def data_wait_cpu_util(samples: Samples, steps: Any, mask: np.ndarray) -> float | None:
    """CPU (share of one core) of the processes that load data while the step waits for it.

    The loaders are the DataLoader workers (their mean), measured over the sample intervals that
    fall in steps spent mostly waiting for data. High means loading is CPU-bound; low means it
    waits on storage or latency. None without workers (the main process's CPU also counts its
    other threads, e.g. spinning OpenMP workers; capture measures the loading thread itself) or
    with fewer than two such intervals.
    """
    waiting = wait_dominated_intervals(samples, steps, mask)
    if int(waiting.sum()) < 2:
        return None
    utils = process_cpu_utils(samples, waiting)
    workers = [utils[info.id] for info in samples.processes_with_role("dataloader_worker") if info.id in utils]
    return float(np.mean(workers)) if workers else None


#: Worker samples below which the loaders' scheduler states say nothing.
LOADER_STATE_MIN = 8


def loader_runnable_share(samples: Samples, instants: np.ndarray) -> float | None:
    """Share of the DataLoader workers' samples (at instants inside the window) that found the worker
    running or runnable (state ``R``) rather than blocked (``S``, ``D``): a starved loader is
    runnable and waits for a core; a loader that waits on reads or a slow source is not."""
    ids = [info.id for info in samples.processes_with_role("dataloader_worker")]
    proc = samples.proc
    if not ids or not len(proc["id"]):
        return None
    rows = proc["sample"]
    keep = np.isin(proc["id"], ids) & instants[np.clip(rows, 0, len(instants) - 1)]
    states = proc["state"][keep]
    states = states[states != "Z"]
    if len(states) < LOADER_STATE_MIN:
        return None
    return float(np.mean(states == "R"))


def max_concurrent(samples: Samples, role: str, instants: np.ndarray) -> int:
    """Most processes of ``role`` alive at one sample inside the window."""
    ids = {info.id for info in samples.processes_with_role(role)}
    inside = instants
    rows = samples.proc["sample"][np.isin(samples.proc["id"], list(ids)) & inside[samples.proc["sample"]]]
    return int(np.bincount(rows).max()) if rows.size else 0


def thread_count_max(samples: Samples, instants: np.ndarray) -> int | None:
    """Most threads of the whole tree at one sample inside the window."""
    keep = instants[samples.proc["sample"]] & (samples.proc["threads"] >= 0)
    if not keep.any():
        return None
    return int(np.bincount(samples.proc["sample"][keep], weights=samples.proc["threads"][keep]).max())


# -- memory ----------------------------------------------------------------------------------------
def memory_used_share_max(samples: Samples, instants: np.ndarray) -> float | None:
    total = samples.meta.mem_total_bytes
    used = samples["mem_used_bytes"][instants]
    used = used[used >= 0]
    return float(used.max()) / total if used.size and total > 0 else None


def rss_growth_bytes_per_s(samples: Samples, instants: np.ndarray) -> float | None:
    """Least-squares slope of the training process's memory over the window (:func:`memory_trend`)."""
    return memory_trend(samples, instants).slope


@dataclass(frozen=True)
class MemoryTrend:
    slope: float | None = None
    first_half: float | None = None
    second_half: float | None = None
    points: int | None = None
    basis: str | None = None

    def fields(self) -> dict[str, Any]:
        """As :class:`MacroSignals` fields."""
        return {"rss_growth_bytes_per_s": self.slope, "rss_growth_first_half_bytes_per_s": self.first_half,
                "rss_growth_second_half_bytes_per_s": self.second_half, "rss_growth_points": self.points,
                "rss_growth_basis": self.basis}

    def __getitem__(self, name: str) -> Any:
        return self.fields()[name]


def memory_trend(samples: Samples, instants: np.ndarray) -> MemoryTrend:
    """The main process's memory trend over the window's samples (``instants``: read inside the
    window; a sample read after the last step, once the script freed its memory, is not a point of
    the trend), as :class:`MacroSignals` fields.

    The series is the anonymous resident memory (RSS less file-backed and shared pages: the heap,
    where a leak grows) when the sampler read it for every point, else the RSS. The RSS of a short
    run also grows when library code pages are first touched (+12 MiB in the first steps of a
    3-epoch run whose heap stayed flat within 2 MiB), and forked DataLoader workers count their
    parent's shared pages again in theirs, so neither workers nor file pages are summed here.
    Slopes are least-squares fits over the whole window and over each half.
    """
    main = [info.id for info in samples.processes_with_role("main")]
    proc = samples.proc
    rows = np.isin(proc["id"], main) & instants[proc["sample"]]
    anon = proc["rss_anon_bytes"][rows] if "rss_anon_bytes" in proc else np.zeros(0, dtype=np.int64)
    if len(anon) and (anon >= 0).all():
        values, basis = anon, "anonymous"
    else:
        keep = proc["rss_bytes"][rows] >= 0
        rows[np.flatnonzero(rows)[~keep]] = False
        values, basis = proc["rss_bytes"][rows], "rss"
    if len(values) < MIN_TREND_INTERVALS:
        return MemoryTrend()
    seconds = samples.ts_ns[proc["sample"][rows]] / 1e9
    values = values.astype(np.float64)
    half = len(values) // 2
    return MemoryTrend(trend_per_s(seconds, values), trend_per_s(seconds[:half + 1], values[:half + 1]),
                       trend_per_s(seconds[half:], values[half:]), int(len(values)), basis)


def trend_per_s(seconds: np.ndarray, values: np.ndarray) -> float | None:
    """Slope of the least-squares line through ``(seconds, values)``."""
    if len(seconds) < 2 or np.ptp(seconds) <= 0:
        return None
    centred = seconds - seconds.mean()
    return float(np.dot(centred, values - values.mean()) / np.dot(centred, centred))


# -- GPU -------------------------------------------------------------------------------------------
def gpu_util_mean(util: np.ndarray) -> float | None:
    """Mean NVML utilization (0..1) over GPUs and samples."""
    known = util[util >= 0]
    return float(known.mean()) / 100 if known.size else None


def gpu_util_oscillation(ts_ns: np.ndarray, util: np.ndarray, step_s: float | None,
                         interval_s: float) -> float | None:
    """How far GPU utilization swings within a step period (the "ECG" of an input-starved GPU), 0..1.

    Step by step: cut the samples into consecutive blocks as long as the step period, but at least
    three sampling intervals (so a block holds several samples); in each block take max − min of
    utilization; the result is the median over blocks and GPUs. A busy GPU (always ~100%) and an
    idle one (always ~0%) both score ~0; one that alternates between computing and waiting for
    data scores high. A slow drift over the run does not count, since it barely moves inside a block.
    """
    if util.ndim != 2 or util.shape[1] == 0 or len(ts_ns) < 2:
        return None
    block_ns = max(step_s or 0.0, 3 * interval_s) * 1e9
    blocks = ((ts_ns - ts_ns[0]) // block_ns).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])  # ts is sorted: blocks are runs
    values = np.where(util >= 0, util, np.nan).astype(np.float64)
    with np.errstate(invalid="ignore"):
        spread = np.fmax.reduceat(values, starts, axis=0) - np.fmin.reduceat(values, starts, axis=0)
    counts = np.add.reduceat(~np.isnan(values), starts, axis=0)
    spreads = spread[(counts >= 2) & ~np.isnan(spread)] / 100
    return float(np.median(spreads)) if spreads.size else None


def gpu_memory_used_share_max(samples: Samples, instants: np.ndarray) -> float | None:
    totals = np.array([gpu.memory_total_bytes for gpu in samples.meta.gpus], dtype=np.float64)
    used = samples["gpu_mem_used_bytes"][instants].astype(np.float64)
    if not used.size or not totals.size or (totals <= 0).any():
        return None
    used[used < 0] = np.nan
    shares = used / totals
    return float(np.nanmax(shares)) if not np.isnan(shares).all() else None


# -- helpers ---------------------------------------------------------------------------------------
def _mean(values: np.ndarray, floor: float | None = None) -> float | None:
    values = values[~np.isnan(values)] if values.dtype.kind == "f" else values
    if floor is not None:
        values = values[values >= floor]
    return float(np.mean(values)) if values.size else None


def _per_core(value: float | None, cores: int) -> float | None:
    return value / cores if value is not None and cores else None


def _max_by_id(ids: np.ndarray, values: np.ndarray) -> dict[int, int]:
    """Largest value per id (ids without a known value are left out). Sorted, not indexed by id: an
    id is a number from the samples file (a damaged one held 3.4e9: a table that long is 25 GiB)."""
    if not ids.size:
        return {}
    order = np.lexsort((values, ids))
    ids, values = ids[order], values[order]
    last = np.append(ids[1:] != ids[:-1], True)  # each id's largest value is its last
    return {int(proc_id): int(value) for proc_id, value in zip(ids[last], values[last]) if value >= 0}
