"""Each macro signal on small synthetic samples whose answer is known."""

from __future__ import annotations

import dataclasses

import json

import numpy as np
import pytest

from stepscope.analysis.run import signals as sig
from stepscope.analysis.evidence import MacroSignals
from stepscope.record.run import StepTable
from stepscope.record.samples import PROCESS_COLUMNS, SERIES_COLUMNS, GpuInfo, ProcessInfo, Samples, SamplesMeta

TICKS = 100  # clock ticks per second
DT = 0.1  # seconds between samples
T0 = 10**12


def make(n: int, *, cores: int = 2, gpus: int = 0, processes=(), proc_rows=(), **columns) -> Samples:
    """``n`` samples ``DT`` apart: idle CPUs, flat counters, unless ``columns`` say otherwise."""
    meta = SamplesMeta(interval_s=DT, cpus=tuple(range(cores)), cpu_count=cores, disks=("sda",), nics=("eth0",),
                       gpus=tuple(GpuInfo(i, "g", f"GPU-{i}", 1000) for i in range(gpus)),
                       mem_total_bytes=1000, clock_ticks_per_s=TICKS)
    widths = {"sample": None, "cpu": cores, "disk": 1, "nic": 1, "gpu": gpus}
    series = {}
    for name, (axis, _) in SERIES_COLUMNS.items():
        shape = (n,) if widths[axis] is None else (n, widths[axis])
        series[name] = np.zeros(shape, dtype=np.float64 if name == "load1" else np.int64)
    series["ts_ns"] = T0 + np.arange(n, dtype=np.int64) * int(DT * 1e9)
    series["cpu_idle"] = np.cumsum(np.full((n, cores), int(TICKS * DT)), axis=0)
    series["procs_running"] = np.ones(n, dtype=np.int64)
    for name, values in columns.items():
        series[name] = np.asarray(values, dtype=series[name].dtype).reshape(series[name].shape)
    proc = {name: np.asarray([row[i] if i < len(row) else -1 for row in proc_rows],
                             dtype="<U1" if name == "state" else np.int64)
            for i, name in enumerate(PROCESS_COLUMNS)}
    empty_gpu = {name: np.zeros(0, dtype=np.int64) for name in ("sample", "gpu", "pid", "mem_bytes")}
    return Samples(meta, series, proc, empty_gpu, tuple(processes))


def cpu_columns(shares: np.ndarray) -> dict[str, np.ndarray]:
    """Cumulative user/idle ticks whose per-interval busy shares are ``shares`` (intervals × cores)."""
    busy = np.rint(shares * TICKS * DT).astype(np.int64)
    zero = np.zeros((1, shares.shape[1]), dtype=np.int64)
    return {"cpu_user": np.cumsum(np.vstack([zero, busy]), axis=0),
            "cpu_idle": np.cumsum(np.vstack([zero, int(TICKS * DT) - busy]), axis=0)}


def rows_for(proc_id: int, samples: range, ticks_per_sample: int, rss=100, threads=2, state="R"):
    """Process rows: ``(sample, id, cpu_ticks, rss, read, write, read_chars, threads, state)``."""
    return [(s, proc_id, ticks_per_sample * k, rss(k) if callable(rss) else rss, 0, 0, 0, threads, state)
            for k, s in enumerate(samples)]


ALL = np.ones(1000, dtype=bool)


def mask(n: int) -> np.ndarray:
    """Every interval between ``n`` samples (counters are differenced over intervals)."""
    return np.ones(n - 1, dtype=bool)


def instants(n: int) -> np.ndarray:
    """Every one of ``n`` samples (levels are read at the moment of a sample)."""
    return np.ones(n, dtype=bool)


# -- CPU -------------------------------------------------------------------------------------------
def test_busiest_and_idlest_core():
    shares = np.tile([1.0, 0.0], (10, 1))
    samples = make(11, **cpu_columns(shares))
    busiest, idlest, saturated = sig.core_extremes(sig.core_busy_shares(samples))
    assert (busiest, idlest, saturated) == (pytest.approx(1.0), pytest.approx(0.0), 1)


def test_a_saturated_thread_hopping_cores_is_still_one_saturated_core():
    shares = np.array([[1.0, 0.0], [0.0, 1.0]] * 5)  # per-core means would both read 50%
    busiest, idlest, saturated = sig.core_extremes(sig.core_busy_shares(make(11, **cpu_columns(shares))))
    assert busiest == pytest.approx(1.0) and idlest == pytest.approx(0.0) and saturated == 1


def test_core_extremes_without_data():
    assert sig.core_extremes(np.full((3, 2), np.nan)) == (None, None, None)


def test_iowait_share():
    samples = make(11, cpu_iowait=np.cumsum(np.full((11, 2), 5), axis=0) - 5,
                   cpu_idle=np.cumsum(np.full((11, 2), 5), axis=0) - 5)
    assert sig.iowait_share(samples, mask(11)) == pytest.approx(0.5)


def test_runnable_threads_per_core_leaves_the_sampler_out():
    samples = make(5, procs_running=[5, 5, 5, 5, 5], cores=2)
    assert sig.runnable_threads_per_core(samples, instants(5)) == pytest.approx(2.0)
    assert sig.runnable_threads_per_core(make(5, procs_running=[-1] * 5), instants(5)) is None


# -- counters and storage --------------------------------------------------------------------------
def test_counter_rate_skips_unknown_values_and_resets():
    counter = np.array([0, 100, -1, 300, 50, 150])
    seconds = np.full(5, 0.1)
    # valid intervals: 0->100 and 50->150 (the -1 and the reset 300->50 drop three)
    assert sig.counter_rate(counter, seconds, np.ones(5, dtype=bool)) == pytest.approx(1000.0)
    assert sig.counter_rate(np.full(4, -1), np.full(3, 0.1), np.ones(3, dtype=bool)) is None


def test_counter_rate_sums_devices():
    counter = np.array([[0, 0], [10, 20], [20, 40]])
    assert sig.counter_rate(counter, np.full(2, 0.1), np.ones(2, dtype=bool)) == pytest.approx(300.0)


@pytest.mark.parametrize("per_interval, warming", [
    ([50 << 20] * 10 + [0] * 20, True),  # the first pass reads from disk, later epochs from memory
    ([50 << 20] * 30, False),  # streaming from disk all along
    ([1000] * 10 + [0] * 20, False),  # too little to be a data set
])
def test_page_cache_warming(per_interval, warming):
    counter = np.concatenate([[0], np.cumsum(per_interval)])
    early, late = sig.early_late_rates(counter, np.full(30, DT), np.ones(30, dtype=bool))
    assert sig.page_cache_warming(early, late) is warming


def test_early_late_needs_enough_intervals():
    assert sig.early_late_rates(np.arange(4), np.full(3, DT), np.ones(3, dtype=bool)) == (None, None)
    assert sig.page_cache_warming(None, 0.0) is None


# -- processes -------------------------------------------------------------------------------------
def test_process_cpu_utils_counts_only_consecutive_samples_of_the_same_process():
    rows = rows_for(0, range(0, 11), 10) + rows_for(1, range(3, 6), 5)  # 100% and 50% of a core
    samples = make(11, proc_rows=rows)
    utils = sig.process_cpu_utils(samples, mask(11))
    assert utils == {0: pytest.approx(1.0), 1: pytest.approx(0.5)}


def test_workers_coming_and_going_each_epoch():
    """Non-persistent workers: two per epoch, new pids each epoch; two at a time."""
    processes = [ProcessInfo(0, 10, role="main"),
                 ProcessInfo(1, 11, role="dataloader_worker"), ProcessInfo(2, 12, role="dataloader_worker"),
                 ProcessInfo(3, 13, role="dataloader_worker"), ProcessInfo(4, 14, role="dataloader_worker")]
    rows = (rows_for(0, range(0, 21), 2) + rows_for(1, range(0, 10), 10) + rows_for(2, range(0, 10), 9)
            + rows_for(3, range(11, 21), 10) + rows_for(4, range(11, 21), 2))
    samples = make(21, processes=processes, proc_rows=rows)
    signals = sig.compute_signals(samples)
    assert signals.worker_count == 2
    assert [load.pid for load in signals.workers] == [10, 11, 13, 12, 14]  # main first, then busiest
    assert signals.main_cpu_util == pytest.approx(0.2)
    assert signals.worker_saturation == pytest.approx(0.5)  # 100% and 100% are above 90%; 90% and 20% not
    assert signals.worker_cpu_util_mean == pytest.approx((1 + 0.9 + 1 + 0.2) / 4)


def leader_rows(proc_id, samples, ticks, leader, threads=4):
    """Process rows with ``leader_ticks`` (the main thread's CPU, after ``rss_anon_bytes``)."""
    return [(s, proc_id, ticks * k, 100, 0, 0, 0, threads, "R", -1, leader(k)) for k, s in enumerate(samples)]


def test_running_threads_are_the_process_cpu_over_its_main_thread_s():
    rows = (leader_rows(0, range(11), 4, lambda k: 4 * k)  # all on the main thread: 1
            + leader_rows(1, range(11), 6, lambda k: 2 * k)  # the others ran twice the main thread's: 3
            + leader_rows(2, range(11), 6, lambda k: 0, threads=3)  # the main thread sleeps: capped at 3
            + leader_rows(3, range(11), 6, lambda k: k // 4)  # main thread barely ran: capped at 4
            + leader_rows(4, range(11), 0, lambda k: 0)  # idle: not read
            + leader_rows(5, range(11), 6, lambda k: -1)  # the main thread's CPU unknown (older files)
            + leader_rows(6, range(11), 5, lambda k: 5 * k + (1 if k == 10 else 0)))  # read a tick apart: 1
    running = sig.process_running_threads(make(11, proc_rows=rows), mask(11))
    assert running == {0: 1.0, 1: 3.0, 2: 3.0, 3: 4.0, 6: 1.0}
    assert sig.process_running_threads(make(11, proc_rows=rows_for(0, range(11), 4)), mask(11)) == {}
    # only intervals inside the window count: the second half ran on one thread
    halves = leader_rows(0, range(11), 4, lambda k: k if k <= 5 else 5 + 4 * (k - 5))
    second = np.arange(10) >= 5
    assert sig.process_running_threads(make(11, proc_rows=halves), second) == {0: 1.0}
    assert sig.process_running_threads(make(11, proc_rows=halves), ~second) == {0: 4.0}


def test_short_lived_workers_are_read_pooled():
    # workers restarted every short epoch: each lives 3 samples (4 ticks), too few to read alone;
    # together they ran on 2 threads (their main threads did half their work)
    processes = [ProcessInfo(k, 100 + k, role="dataloader_worker") for k in range(4)]
    rows = [row for k in range(4) for row in leader_rows(k, range(3 * k, 3 * k + 3), 2, lambda i: i, threads=3)]
    samples = make(12, processes=processes, proc_rows=rows)
    assert sig.process_running_threads(samples, mask(12)) == {}
    assert sig.pooled_running_threads(samples, mask(12), "dataloader_worker") == 2.0
    assert sig.pooled_running_threads(samples, mask(12), "main") is None
    assert sig.compute_signals(samples).worker_running_threads == 2.0


def test_thread_count_max_sums_the_tree():
    rows = rows_for(0, range(5), 0, threads=10) + rows_for(1, range(2, 4), 0, threads=5)
    assert sig.thread_count_max(make(5, proc_rows=rows), instants(5)) == 15


def test_rss_growth_of_the_main_process():
    rows = rows_for(0, range(20), 1, rss=lambda k: 1_000_000 + k * 100_000)  # +100 kB per 0.1 s
    samples = make(20, processes=[ProcessInfo(0, 10, role="main")], proc_rows=rows)
    assert sig.rss_growth_bytes_per_s(samples, instants(20)) == pytest.approx(1_000_000)


def anon_rows(proc_id, samples, rss, anon):
    """Process rows with ``rss_anon_bytes`` (the column after ``state``)."""
    return [(s, proc_id, k, rss(k), 0, 0, 0, 2, "R", anon(k)) for k, s in enumerate(samples)]


def test_memory_trend_follows_the_heap_not_library_pages():
    # the RSS climbs 40 MB as code pages are first touched; the heap (anonymous memory) is flat
    rows = anon_rows(0, range(20), rss=lambda k: 300_000_000 + min(k, 10) * 4_000_000, anon=lambda k: 200_000_000)
    trend = sig.memory_trend(make(20, processes=[ProcessInfo(0, 10, role="main")], proc_rows=rows), instants(20))
    assert trend["rss_growth_basis"] == "anonymous" and trend["rss_growth_bytes_per_s"] == pytest.approx(0)


def test_memory_trend_halves_tell_a_ramp_from_a_leak():
    ramp = anon_rows(0, range(20), rss=lambda k: 0, anon=lambda k: 100_000_000 + min(k, 8) * 10_000_000)
    leak = anon_rows(0, range(20), rss=lambda k: 0, anon=lambda k: 100_000_000 + k * 10_000_000)
    main = [ProcessInfo(0, 10, role="main")]
    levelled = sig.memory_trend(make(20, processes=main, proc_rows=ramp), instants(20))
    steady = sig.memory_trend(make(20, processes=main, proc_rows=leak), instants(20))
    assert levelled["rss_growth_first_half_bytes_per_s"] > 50e6 and levelled["rss_growth_second_half_bytes_per_s"] < 1e6
    assert steady["rss_growth_first_half_bytes_per_s"] == pytest.approx(100e6)
    assert steady["rss_growth_second_half_bytes_per_s"] == pytest.approx(100e6)


def test_memory_trend_falls_back_to_the_rss_of_older_samples():
    rows = rows_for(0, range(20), 1, rss=lambda k: 1_000_000 + k * 100_000)  # no rss_anon_bytes: -1
    trend = sig.memory_trend(make(20, processes=[ProcessInfo(0, 10, role="main")], proc_rows=rows), instants(20))
    assert trend["rss_growth_basis"] == "rss" and trend["rss_growth_bytes_per_s"] == pytest.approx(1_000_000)


# -- memory ----------------------------------------------------------------------------------------
def test_memory_and_swap():
    samples = make(11, mem_used_bytes=np.linspace(100, 900, 11).astype(int),
                   swap_out_bytes=np.arange(11) * 4096)
    assert sig.memory_used_share_max(samples, instants(11)) == pytest.approx(0.9)
    signals = sig.compute_signals(samples)
    assert signals.swap_out_bytes_per_s == pytest.approx(40960)
    assert signals.swap_in_bytes_per_s == 0


# -- GPU -------------------------------------------------------------------------------------------
def test_gpu_util_mean_ignores_unknown():
    assert sig.gpu_util_mean(np.array([[100], [-1], [50]])) == pytest.approx(0.75)
    assert sig.gpu_util_mean(np.full((3, 1), -1)) is None


@pytest.mark.parametrize("pattern, expected", [
    ([0, 100] * 20, 1.0),  # the ECG of an input-starved GPU
    ([95] * 40, 0.0),  # compute bound
    ([3] * 40, 0.0),  # idle
    (list(np.linspace(20, 90, 40).astype(int)), 0.04),  # a slow drift barely moves inside a step
])
def test_gpu_util_oscillation(pattern, expected):
    ts = T0 + np.arange(len(pattern)) * int(DT * 1e9)
    util = np.array(pattern).reshape(-1, 1)
    assert sig.gpu_util_oscillation(ts, util, step_s=0.2, interval_s=DT) == pytest.approx(expected, abs=0.06)


def test_gpu_oscillation_blocks_follow_long_steps():
    """Steps of 1 s: a swing inside each step counts, whatever the sample rate."""
    pattern = ([100] * 5 + [0] * 5) * 4
    ts = T0 + np.arange(40) * int(DT * 1e9)
    assert sig.gpu_util_oscillation(ts, np.array(pattern).reshape(-1, 1), 1.0, DT) == pytest.approx(1.0)
    assert sig.gpu_util_oscillation(ts[:1], np.zeros((1, 0)), 1.0, DT) is None


def test_gpu_memory_used_share_max():
    samples = make(3, gpus=2, gpu_mem_used_bytes=[[100, -1], [200, 500], [300, 900]])
    assert sig.gpu_memory_used_share_max(samples, instants(3)) == pytest.approx(0.9)


# -- the join with steps ---------------------------------------------------------------------------
def test_samples_outside_the_steps_are_left_out():
    shares = np.vstack([np.tile([1.0, 1.0], (10, 1)), np.tile([0.2, 0.0], (10, 1))])  # busy start-up, then steps
    samples = make(21, **cpu_columns(shares))
    steps = StepTable.from_columns({"start_ns": [T0 + int(1.0e9)], "duration_ns": [int(1.0e9)],
                                "other_ns": [int(1.0e9)]})
    signals = sig.compute_signals(samples, steps)
    assert signals.cpu_util_mean == pytest.approx(0.1)
    assert signals.sample_count == 11
    assert sig.compute_signals(samples).cpu_util_mean == pytest.approx(0.55)


def test_steps_outside_the_samples_fall_back_to_everything():
    steps = StepTable.from_columns({"start_ns": [1], "duration_ns": [5], "other_ns": [5]})
    signals = sig.compute_signals(make(5), steps)
    assert signals.sample_count == 5 and any("whole sampled time" in note for note in signals.notes)


def test_no_samples():
    assert sig.compute_signals(None) == MacroSignals()
    one = sig.compute_signals(make(1))
    assert one.sample_count == 1 and one.cpu_util_mean is None and one.notes


def test_every_field_is_filled_on_a_full_run_and_serialises():  # noqa: D103
    processes = [ProcessInfo(0, 10, role="main"), ProcessInfo(1, 11, role="dataloader_worker")]
    rows = rows_for(0, range(30), 3, rss=lambda k: 1000 + k) + leader_rows(1, range(30), 10, lambda k: 10 * k)
    samples = make(30, gpus=1, processes=processes, proc_rows=rows,
                   **cpu_columns(np.tile([0.95, 0.3], (29, 1))),
                   disk_read_bytes=np.arange(30) * 1000, net_recv_bytes=np.arange(30) * 10,
                   net_sent_bytes=np.arange(30), load1=np.full(30, 1.5), gpu_util=[[90, 10] * 15],
                   gpu_mem_used_bytes=np.full((30, 1), 500), mem_used_bytes=np.full(30, 400),
                   tree_unseen_cpu_ticks=np.arange(30) * 2)
    # one scan of other processes, under a launcher: the job's other ranks used half a core
    samples = dataclasses.replace(samples, foreign_totals=((T0 + int(2e9), 2.0, 0.2, 0.5),))
    steps = StepTable.from_columns({"start_ns": [T0], "duration_ns": [int(2.9e9)], "data_wait_ns": [int(2.9e9)]})
    signals = sig.compute_signals(samples, steps)
    empty = [name for name, value in signals.to_dict().items() if value is None]
    assert empty == []
    assert signals.job_cores == pytest.approx(0.5)
    assert signals.unseen_tree_cores == pytest.approx(2 / DT / TICKS)
    assert signals.memory_total_bytes == samples.meta.mem_total_bytes
    assert {load.pid: load.threads for load in signals.workers}.keys() == {10, 11}
    assert signals.net_bytes_per_s == pytest.approx(110.0)
    assert signals.load_per_core == pytest.approx(0.75)
    json.dumps(signals.to_dict())


def _two_step_run(wait_share_first: float):
    """Two 1.45 s steps; the first waits for data ``wait_share_first`` of its time, the second never."""
    half = int(1.45e9)
    return StepTable.from_columns({"start_ns": [T0, T0 + half], "duration_ns": [half, half],
                               "data_wait_ns": [int(half * wait_share_first), 0],
                               "other_ns": [half - int(half * wait_share_first), half]})


@pytest.mark.parametrize("with_worker, expected", [(True, 1.0), (False, None)])
def test_data_wait_cpu_util_reads_the_loading_processes_while_the_step_waits(with_worker, expected):
    processes = [ProcessInfo(0, 10, role="main")]
    rows = rows_for(0, range(30), 3)  # main: 0.3 of a core
    if with_worker:
        processes.append(ProcessInfo(1, 11, role="dataloader_worker"))
        rows += rows_for(1, range(30), 10)  # worker: a full core
    samples = make(30, processes=processes, proc_rows=rows, **cpu_columns(np.tile([0.5, 0.5], (29, 1))))
    util = sig.data_wait_cpu_util(samples, _two_step_run(0.9), np.ones(29, dtype=bool))
    assert util == (None if expected is None else pytest.approx(expected, rel=0.05))


def test_data_wait_cpu_util_needs_steps_that_wait():
    samples = make(30, processes=[ProcessInfo(0, 10, role="main")], proc_rows=rows_for(0, range(30), 3),
                   **cpu_columns(np.tile([0.5, 0.5], (29, 1))))
    assert sig.data_wait_cpu_util(samples, _two_step_run(0.1), np.ones(29, dtype=bool)) is None
    assert sig.data_wait_cpu_util(samples, None, np.ones(29, dtype=bool)) is None


def test_loader_runnable_share_counts_the_workers_running_or_runnable_samples_only():
    """Workers found in state R (running or waiting for a core) 3 times in 10 and sleeping otherwise;
    the main process (always R) and exited (Z) rows are not the loaders'; too few samples say nothing."""
    processes = [ProcessInfo(0, 10, role="main"), ProcessInfo(1, 11, role="dataloader_worker"),
                 ProcessInfo(2, 12, role="dataloader_worker")]
    worker = [(s, 1, 0, 100, 0, 0, 0, 1, "R" if s % 10 < 3 else "S") for s in range(20)]
    other = [(s, 2, 0, 100, 0, 0, 0, 1, "D" if s < 19 else "Z") for s in range(20)]
    samples = make(20, processes=processes, proc_rows=rows_for(0, range(20), 5) + worker + other)
    assert sig.loader_runnable_share(samples, instants(20)) == pytest.approx(6 / 39)
    assert sig.compute_signals(samples).loader_runnable_share == pytest.approx(6 / 39)
    few = np.zeros(20, dtype=bool)
    few[:3] = True
    assert sig.loader_runnable_share(samples, few) is None
    assert sig.loader_runnable_share(make(20, processes=processes[:1], proc_rows=rows_for(0, range(20), 5)),
                                     instants(20)) is None


def test_a_process_s_presence_is_the_share_of_the_window_it_was_sampled_in():
    processes = [ProcessInfo(0, 10, role="main")] + [ProcessInfo(k, 10 + k, role="dataloader_worker") for k in (1, 2)]
    rows = rows_for(0, range(11), 3) + rows_for(1, range(0, 6), 5) + rows_for(2, range(5, 11), 5)
    loads = {load.pid: load for load in sig.compute_signals(make(11, processes=processes, proc_rows=rows)).workers}
    assert loads[10].presence == pytest.approx(1.0)
    assert loads[11].presence == pytest.approx(0.5) and loads[12].presence == pytest.approx(0.5)
    assert loads[11].cpu_util == pytest.approx(5 / TICKS / DT)  # over its own time
