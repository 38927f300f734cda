"""Synthetic runs with samples for the HTML, Perfetto and TensorBoard exports (tests and benchmark).

``synthetic_run(steps)`` makes a record whose every view has something to show: a slow warm-up,
a FLOP-counted (excluded) step, a checkpoint-like stall every 50 steps, a DataLoader with two
workers, 8 cores, disk reads that fade (page cache warming), growing memory and one GPU whose
utilisation swings between busy and idle (the "ECG" of an input-bound GPU).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from stepscope.record.run import ComputeFacts, CaptureFacts, DeviceInfo, LoaderInfo, RunMeta, RunRecord, StepTable
from stepscope.record.samples import PROCESS_COLUMNS, SERIES_COLUMNS, GpuInfo, ProcessInfo, Samples, SamplesMeta

PAYLOAD = '</script><img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'
HOSTILE = (PAYLOAD + "[bold red]rich[/] \x1b[31mansi\x1b[0m <b id=\"injected\">x</b> "
           + "very_long_name_" * 40)
T0 = 5_000_000_000_000
TICKS = 100


def synthetic_steps(count: int, seed: int = 0, slow: float = 1.0) -> StepTable:
    rng = np.random.default_rng(seed)
    wait = (rng.gamma(4.0, 2.0e6, count) * slow).astype(np.int64)
    forward = rng.normal(6e6, 3e5, count).clip(1e6).astype(np.int64)
    backward = (forward * 1.8).astype(np.int64)
    optimizer = np.full(count, 1_000_000, dtype=np.int64)
    other = rng.normal(5e5, 5e4, count).clip(1e5).astype(np.int64)
    other[49::50] += 300_000_000  # a checkpoint every 50 steps
    if count > 3:
        wait[:2] += 400_000_000  # warm-up: worker start-up
    duration = wait + forward + backward + optimizer + other
    start = T0 + np.r_[0, np.cumsum(duration)[:-1]]
    return StepTable.from_columns({
        "start_ns": start, "duration_ns": duration, "data_wait_ns": wait, "forward_ns": forward,
        "backward_ns": backward, "optimizer_ns": optimizer, "other_ns": other,
        "batches": np.ones(count), "samples": np.full(count, 32), "optimizer_steps": np.ones(count)})


def synthetic_samples(start_ns: int, end_ns: int, *, cores: int = 8, gpus: int = 1, seed: int = 0,
                      interval_s: float = 0.1) -> Samples:
    rng = np.random.default_rng(seed + 1)
    ts = np.arange(start_ns - int(0.5e9), end_ns + int(0.3e9), int(interval_s * 1e9), dtype=np.int64)
    n = len(ts)
    tick = int(TICKS * interval_s)
    meta = SamplesMeta(interval_s=interval_s, cpus=tuple(range(cores)), cpu_count=cores, disks=("nvme0n1",),
                       nics=("eth0",), gpus=tuple(GpuInfo(i, "NVIDIA H100 80GB HBM3", f"GPU-{i}", 80 << 30)
                                                  for i in range(gpus)),
                       mem_total_bytes=64 << 30, clock_ticks_per_s=TICKS, start_ns=int(ts[0]))
    widths = {"sample": None, "cpu": cores, "disk": 1, "nic": 1, "gpu": gpus}
    series = {}
    for name, (axis, _) in SERIES_COLUMNS.items():
        shape = (n,) if widths[axis] is None else (n, widths[axis])
        series[name] = np.zeros(shape, dtype=np.float64 if name == "load1" else np.int64)
    series["ts_ns"] = ts
    busy = np.clip(rng.normal(0.35, 0.15, (n, cores)), 0, 1)
    busy[:, 0] = np.clip(rng.normal(0.95, 0.04, n), 0, 1)  # the main thread's core
    busy[:, 1:3] = np.clip(rng.normal(0.8, 0.1, (n, 2)), 0, 1)  # the workers
    busy_ticks = np.rint(busy * tick).astype(np.int64)
    series["cpu_user"] = np.cumsum(busy_ticks, axis=0)
    series["cpu_idle"] = np.cumsum(tick - busy_ticks, axis=0)
    series["procs_running"] = np.full(n, 4)
    series["load1"] = np.full(n, 3.0)
    fade = np.exp(-np.arange(n) / max(n / 6, 1))
    series["disk_read_bytes"] = np.cumsum((rng.random(n) * 200e6 * interval_s * fade).astype(np.int64))[:, None]
    series["disk_write_bytes"] = np.cumsum(np.where(np.arange(n) % 150 == 149, 400_000_000, 1000))[:, None]
    series["mem_used_bytes"] = (8 << 30) + np.arange(n, dtype=np.int64) * (1 << 20)
    series["mem_available_bytes"] = (64 << 30) - series["mem_used_bytes"]
    phase = 2 * np.pi * (ts - ts[0]) / 0.4e9
    util = np.clip(50 + 48 * np.sin(phase) + rng.normal(0, 4, n), 0, 100).astype(np.int64)
    series["gpu_util"] = np.repeat(util[:, None], gpus, axis=1)
    series["gpu_mem_used_bytes"] = np.full((n, gpus), 30 << 30, dtype=np.int64)
    for name in ("gpu_mem_util", "gpu_sm_clock_mhz", "gpu_power_mw", "gpu_temp_c", "gpu_pcie_tx_bytes_per_s",
                 "gpu_pcie_rx_bytes_per_s"):
        series[name] = np.full((n, gpus), -1, dtype=np.int64)
    processes = (ProcessInfo(0, 1000, 1, "python", ("python", "train.py"), role="main", first_seen_ns=int(ts[0])),
                 ProcessInfo(1, 1001, 1000, "pt_worker", role="dataloader_worker", loader_id=0),
                 ProcessInfo(2, 1002, 1000, "pt_worker", role="dataloader_worker", loader_id=0))
    rows = []
    for proc_id, util_cores in ((0, 1.0), (1, 0.8), (2, 0.75)):
        ticks = np.cumsum(np.rint(rng.normal(util_cores, 0.05, n).clip(0) * tick)).astype(np.int64)
        rss = (2 << 30) + np.arange(n, dtype=np.int64) * (1 << 19) if proc_id == 0 else np.full(n, 1 << 29)
        rows.append(np.stack([np.arange(n), np.full(n, proc_id), ticks, rss, np.zeros(n), np.zeros(n),
                              np.zeros(n), np.full(n, 4), np.zeros(n)], axis=1))
    table = np.concatenate(rows)
    proc = {name: table[:, i].astype(np.int64) if i < table.shape[1] else np.full(len(table), -1, dtype=np.int64)
            for i, name in enumerate(PROCESS_COLUMNS) if name != "state"}
    proc["state"] = np.full(len(table), "R", dtype="<U1")
    gpu_procs = {name: np.zeros(0, dtype=np.int64) for name in ("sample", "gpu", "pid", "mem_bytes")}
    return Samples(meta, series, proc, gpu_procs, processes)


def synthetic_run(steps: int = 400, *, rank: int = 0, world_size: int = 1, samples: bool = True,
                  hostile: bool = False, seed: int = 0, slow: float = 1.0) -> RunRecord:
    """A record (samples attached) of ``steps`` steps; ``hostile`` puts attack strings everywhere."""
    table = synthetic_steps(steps, seed=seed, slow=slow)
    end = int(table.end_ns[-1]) if steps else T0
    name = HOSTILE if hostile else "train.py"
    loader = LoaderInfo(loader_id=0, cls=name if hostile else "torch.utils.data.dataloader.DataLoader",
                        dataset_type=name if hostile else "ImageFolder", iterable_dataset=False, batch_size=32,
                        num_workers=2, pin_memory=False, prefetch_factor=2, persistent_workers=False,
                        drop_last=False, batches=steps, worker_pids=(1001, 1002),
                        wait_ns=int(table.data_wait_ns.sum()))
    meta = RunMeta(target=name, argv=(name, "--epochs", "1"), rank=rank, world_size=world_size, start_ns=T0 - 10**9,
                   end_ns=end + 10**8, start_wall_ns=1_790_000_000_000_000_000, exit_code=0, cpu_count_logical=8,
                   devices=(DeviceInfo(0, "cuda", "NVIDIA H100 80GB HBM3", 80 << 30),), step_source="optimizer",
                   timing="cuda", intra_op_threads=4)
    facts = CaptureFacts(compute=ComputeFacts(step_index=2, flops=int(2e12), ops=400,
                                              matmul_flops_by_dtype={"bf16": int(2e12)}))
    record = RunRecord(meta=meta, steps=table, loaders=(loader,), facts=facts,
                       warnings=(HOSTILE,) if hostile else ())
    if samples and steps:
        record = replace(record, samples=synthetic_samples(int(table.start_ns[0]), end, seed=seed))
    return record
