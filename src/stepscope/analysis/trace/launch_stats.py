"""HTA CUDA kernel launch statistics: CPU launch cost, GPU duration and launch delay per launch.

Definition (HTA ``CudaKernelAnalysis.cuda_kernel_launch_stats``): CPU rows (``stream == -1``)
named ``cudaLaunchKernel``, ``cudaLaunchKernelExC``, ``runFunction -
job_prep_and_submit_for_execution``, ``cudaMemcpyAsync`` or ``cudaMemsetAsync`` are joined with
GPU rows (``stream != -1``) on ``correlation``; ``launch_delay = gpu.ts - cpu.ts - cpu.dur``
clipped at 0 (HTA-rounded times). Outlier counts use HTA's plot cut-offs: runtime > 50 µs,
launch delay > 100 µs, and "short" kernels (``cpu <= 50 µs`` and ``gpu < cpu``), the launch-bound
signature. ``cuLaunchKernel`` (Triton) is not counted, as in HTA. The join is HTA's link of the
linked-events table (``HtaRows.cpu_link``) when every host correlation id is unique (the norm);
otherwise every (host, GPU) pair sharing a correlation is a row, like pandas ``merge``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.traces import intervals
from stepscope.traces.links import EventLinks, IntArray
from stepscope.traces.spill import follow

LAUNCH_NAMES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "runFunction - job_prep_and_submit_for_execution",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
)
RUNTIME_CUTOFF_US = 50.0
LAUNCH_DELAY_CUTOFF_US = 100.0


@dataclass(frozen=True)
class LaunchStats:
    """Every kernel launch of one rank: its runtime call's duration, its kernel's and the delay between them."""

    rank: int
    correlation: np.ndarray
    cpu_duration: np.ndarray
    gpu_duration: np.ndarray
    launch_delay: np.ndarray

    @property
    def count(self) -> int:
        return int(len(self.correlation))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.count}
        if not self.count:
            return out
        cpu, gpu, delay = self.cpu_duration, self.gpu_duration, self.launch_delay
        out["short_gpu_kernels"] = int(((cpu <= RUNTIME_CUTOFF_US) & (gpu < cpu)).sum())
        out["runtime_outliers"] = int((cpu > RUNTIME_CUTOFF_US).sum())
        out["launch_delay_outliers"] = int((delay > LAUNCH_DELAY_CUTOFF_US).sum())
        for label, values in (("cpu_duration_us", cpu), ("gpu_duration_us", gpu), ("launch_delay_us", delay)):
            q = intervals.quantiles(values, [0.5, 0.9, 0.99])
            out[label] = {
                "sum": float(values.sum()),
                "mean": float(values.mean()),
                "p50": float(q[0]),
                "p90": float(q[1]),
                "p99": float(q[2]),
                "max": float(values.max()),
            }
        return out

    def to_dict(self, rows: bool = False) -> dict[str, Any]:
        out = {"rank": self.rank, "summary": self.summary()}
        if rows:
            out["rows"] = {
                "correlation": self.correlation.tolist(),
                "cpu_duration_us": self.cpu_duration.tolist(),
                "gpu_duration_us": self.gpu_duration.tolist(),
                "launch_delay_us": self.launch_delay.tolist(),
            }
        return out


def _pairs_many(corr: IntArray, cpu: IntArray, gpu: IntArray) -> tuple[IntArray, IntArray]:
    """Inner join of host and GPU positions on correlation, every pair a row (like pandas merge)."""
    gpu_order = gpu[np.argsort(corr[gpu], kind="stable")]
    gpu_corr = corr[gpu_order]
    lo = np.searchsorted(gpu_corr, corr[cpu], side="left")
    hi = np.searchsorted(gpu_corr, corr[cpu], side="right")
    counts = hi - lo
    cpu_rep = np.repeat(cpu, counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    gpu_rep = gpu_order[np.repeat(lo, counts) + offsets]
    order = np.argsort(corr[cpu_rep], kind="stable")
    return cpu_rep[order], gpu_rep[order]


def launch_stats(links: EventLinks, rank: int) -> LaunchStats:
    events, rows = links.events, links.hta
    launch_ids = [i for i in (events.symbols.get(n) for n in LAUNCH_NAMES) if i >= 0]
    corr = events.correlation[rows.index]
    is_launch = ~rows.gpu & links.name_in(launch_ids, rows.index)
    host_corr = corr[~rows.gpu & (corr >= 0)]
    host_corr.sort()  # a copy of its own: sorted in place, each correlation once when no neighbours are equal
    distinct = not len(host_corr) or not bool(np.any(host_corr[1:] == host_corr[:-1]))
    del host_corr
    if distinct and not (is_launch & (corr < 0)).any():
        # one host row per correlation (the norm): the linked table's link is the join
        gpu = np.flatnonzero(rows.gpu & (rows.cpu_link >= 0))
        cpu = rows.cpu_link[gpu]
        keep = is_launch[cpu]
        gpu, cpu = gpu[keep], cpu[keep]
        order = np.lexsort((gpu, corr[gpu]))
        cpu_rep, gpu_rep = cpu[order], gpu[order]
    else:
        cpu_rep, gpu_rep = _pairs_many(corr, np.flatnonzero(is_launch), np.flatnonzero(rows.gpu))
    cpu_dur = rows.end[cpu_rep] - rows.ts[cpu_rep]
    gpu_dur = rows.end[gpu_rep] - rows.ts[gpu_rep]
    delay = np.maximum(rows.ts[gpu_rep] - rows.ts[cpu_rep] - cpu_dur, 0.0)
    spill = follow(events.ts)  # a row per launch, kept with the analysis: on disk where the table is
    return LaunchStats(rank, spill(corr[cpu_rep]), spill(cpu_dur), spill(gpu_dur), spill(delay))
