"""Every view of one rank's trace (:class:`RankAnalysis`) and its :class:`TraceEvidence`.

Contract: :func:`analyze_rank` runs each view on a loaded trace and keeps only the small results
(the event table is not referenced afterwards). Every view reads the trace's linked-events table
(:mod:`stepscope.traces.links`: roles, HTA rows, correlation links, steps), built once per trace.
:func:`rank_evidence` maps the views to the diagnosis contract; each evidence field's definition
is given next to its computation. Shares of idle time are fractions of HTA's ``kernel_time``
(first to last GPU activity), and the idle causes partition HTA's idle time
(:mod:`~stepscope.analysis.trace.idle_causes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from stepscope import heap
from stepscope.analysis.evidence import (CompiledGraphs, CriticalPathShares, DeviceMemoryUse, DeviceUse, GpuIdle, HostTime,
                                         KernelLaunches, StepShares, SyncsAndCopies, TraceEvidence)
from stepscope.analysis.trace.compiled_regions import CompiledRegions, compiled_regions
from stepscope.analysis.trace.critical_path import (COMM, CPU, DATA_LOADING, GAP, GPU_COMPUTE, GPU_MEMORY, LAUNCH_OVERHEAD,
                                                    DEFAULT_PATH_STEPS, SYNC_WAIT, PathSummary, path_summary)
from stepscope.analysis.trace.gpu_metrics import DeviceSummary, device_summaries
from stepscope.analysis.trace.idle_causes import IdleCauses, idle_causes
from stepscope.analysis.trace.idle_time import IdleTimeBreakdown, idle_time_breakdown
from stepscope.analysis.trace.kernel_types import kernel_type_sums
from stepscope.analysis.trace.kernels import KernelTable, kernel_table
from stepscope.analysis.trace.launch_stats import LaunchStats, launch_stats
from stepscope.analysis.trace.memory import MemoryView, memory_view
from stepscope.analysis.trace.op_tree import OpTree, build_op_tree
from stepscope.analysis.trace.operators import OperatorTable, operator_table
from stepscope.analysis.trace.python_overhead import PythonOverhead, python_overhead
from stepscope.analysis.trace.step_breakdown import StepBreakdown, TraceSteps, find_steps, step_breakdown
from stepscope.analysis.trace.stragglers import RankSummary
from stepscope.analysis.trace.temporal import CommOverlap, TemporalBreakdown, comm_overlap, temporal_breakdown
from stepscope.traces import intervals
from stepscope.traces.links import COMMUNICATION, KERNEL, MEMCPY, RUNTIME, EventLinks, links_of
from stepscope.traces.events import MemoryTable
from stepscope.traces.load import LoadedTrace
from stepscope.traces.timeline import SYNC_CALLS, timeline_of

# counted by ``sync_count_per_step``/``sync_share`` (kept as before; the idle causes use the wider
# list of :mod:`~stepscope.analysis.trace.idle_causes`)
COUNTED_SYNC_CALLS = SYNC_CALLS[:5]
# complete events from which the operator views run in a forked child beside the others (a 400 MB
# trace; below it the views take about a second and the fork would save little)
BESIDE_MIN_EVENTS = 1_000_000


@dataclass(frozen=True)
class RankAnalysis:
    """Every view of one rank's trace, computed once: steps, devices, idle time, operators, kernels, memory, the
    critical path."""

    rank: int
    path: str
    rank_source: str
    device_name: str | None
    device_memory_bytes: int | None
    steps: StepBreakdown
    devices: tuple[DeviceSummary, ...]
    temporal: TemporalBreakdown | None
    overlap: CommOverlap
    idle: IdleTimeBreakdown
    kernel_type_sums: dict[str, float]
    launches: LaunchStats
    operators: OperatorTable
    kernels: KernelTable
    memory: MemoryView
    python: PythonOverhead | None
    summary: RankSummary
    counters: dict[str, float | None] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    idle_causes: IdleCauses | None = None
    compiled: CompiledRegions | None = None  # torch.compile's regions, graphs and guard checks
    critical: PathSummary | None = None  # the critical path of each step

    def to_dict(self, full: bool = True) -> dict[str, Any]:
        limit = None if full else 25
        return {
            "rank": self.rank,
            "path": self.path,
            "rank_source": self.rank_source,
            "device": self.device_name,
            "device_memory_bytes": self.device_memory_bytes,
            "overview": self.steps.to_dict(),
            "gpu": [d.to_dict() for d in self.devices],
            "temporal": None if self.temporal is None else self.temporal.to_dict(),
            "comm_overlap": self.overlap.to_dict(),
            "idle_time": self.idle.to_dict(),
            "kernel_types_us": dict(self.kernel_type_sums),
            "launch_stats": self.launches.to_dict(rows=False),
            "operators": self.operators.to_dict(limit),
            "kernels": self.kernels.to_dict(limit),
            "memory": self.memory.to_dict(),
            "python_overhead": None if self.python is None else self.python.to_dict(),
            "counters": dict(self.counters),
            "warnings": list(self.warnings),
            "idle_causes": None if self.idle_causes is None else self.idle_causes.to_dict(),
            "compiled_regions": None if self.compiled is None else self.compiled.to_dict(),
            "critical_path": None if self.critical is None else self.critical.to_dict(),
        }


def _comm_offsets(links: EventLinks, steps: TraceSteps) -> tuple[float | None, ...]:
    rows = links.hta
    comm = rows.gpu & (rows.ktype == COMMUNICATION)
    starts = np.sort(links.events.ts[rows.index[comm]])
    out: list[float | None] = []
    for s, e in zip(steps.start.tolist(), steps.end.tolist()):
        i = int(np.searchsorted(starts, s))
        out.append(float(starts[i] - s) if i < len(starts) and starts[i] < e else None)
    return tuple(out)


def _counters(links: EventLinks, steps: TraceSteps) -> dict[str, float | None]:
    events = links.events
    n_steps = max(len(steps.names), 1)
    window = float(np.sum(steps.end - steps.start)) if len(steps.start) else 0.0
    lo = steps.start[0] if len(steps.start) else -np.inf
    hi = steps.end[-1] if len(steps.start) else np.inf
    kernels = links.rows(KERNEL)
    kernels = kernels[(events.ts[kernels] >= lo) & (events.ts[kernels] < hi)]
    runtime = links.rows(RUNTIME)
    sync_ids = [i for i in (events.symbols.get(n) for n in COUNTED_SYNC_CALLS) if i >= 0]
    sync = runtime[links.name_in(sync_ids, runtime) & (events.ts[runtime] >= lo) & (events.ts[runtime] < hi)]
    memcpy = links.rows(MEMCPY)
    pageable = links.name_is(lambda s: "Pageable" in s, memcpy)
    memcpy_us = float(events.dur[memcpy].sum())
    return {
        "kernel_count_per_step": len(kernels) / n_steps if len(steps.start) else None,
        "median_kernel_us": intervals.median(events.dur[kernels]) if len(kernels) else None,
        "sync_count_per_step": len(sync) / n_steps if len(steps.start) else None,
        "sync_share": float(events.dur[sync].sum()) / window if window > 0 else None,
        "pageable_memcpy_share": float(events.dur[memcpy][pageable].sum()) / memcpy_us if memcpy_us > 0 else None,
    }


def analyze_rank(trace: LoadedTrace, group_by_shape: bool = False, path_steps: int = DEFAULT_PATH_STEPS,
                 workers: int = 1) -> RankAnalysis:
    """Every view of ``trace``. The views run one after another, each keeping only its small
    result; the C heap's free pages go back to the system after the stages that allocate the most
    (:func:`stepscope.heap.trim`), and the operator tree is dropped before the critical path, which
    needs the most memory of all (the peak of a big trace's analysis).

    ``workers`` > 1 and a trace of at least :data:`BESIDE_MIN_EVENTS` complete events: the operator
    tree, the operator table and the memory view (about 40 % of the views' time) are computed in a
    child forked once the links are built (:mod:`~stepscope.analysis.trace.beside`), while this
    process computes the others, up to the critical path; the idle causes are computed before the
    fork, so their peak never meets the child's. The same values, and computed here whenever the
    child cannot or may not run."""
    events = trace.events
    links = links_of(events)  # the linked-events table: classified, joined and step-assigned once
    steps = find_steps(links)
    origin = float(events.ts.min()) if len(events) else 0.0
    child = causes = None
    if workers > 1 and len(events) >= BESIDE_MIN_EVENTS:
        from stepscope.analysis.trace.beside import beside

        causes = idle_causes(links)  # here: its peak beside the child's would come on top of it
        heap.trim()  # freed pages shared with the child would be copied once this process reused them
        child = beside(partial(_operator_views, links, trace.memory, origin, group_by_shape))
    breakdown = step_breakdown(links, steps)
    heap.trim()
    tree = build_op_tree(links) if child is None else None
    heap.trim()
    timeline = timeline_of(links)
    temporal = temporal_breakdown(timeline, trace.rank)
    devices = device_summaries(links, steps)
    props = trace.device_properties
    used = [d.device for d in devices]
    prop = next((p for p in props if p.get("id") in used), props[0] if props and used else None)
    summary = RankSummary(
        trace.rank,
        breakdown.mean_us.get("Total") or None,
        None if temporal is None else temporal.idle_share,
        None if temporal is None else temporal.compute_share,
        _comm_offsets(links, steps),
    )
    overlap = comm_overlap(timeline, trace.rank)
    idle = idle_time_breakdown(links, trace.rank)
    kinds = kernel_type_sums(timeline)
    launches = launch_stats(links, trace.rank)
    heap.trim()
    if tree is not None:
        operators, memory = _operator_views(links, trace.memory, origin, group_by_shape, tree)
        del tree
        heap.trim()
    kernels = kernel_table(links)
    python = python_overhead(links, steps)
    counters = _counters(links, steps)
    if causes is None:
        causes = idle_causes(links)
    compiled = compiled_regions(links, steps)
    if child is not None:  # collected before the critical path, whose peak is the largest: the two never add up
        done = child.result()
        operators, memory = done if done is not None else _operator_views(links, trace.memory, origin, group_by_shape)
    heap.trim()
    critical = path_summary(events, trace.rank, steps=path_steps)
    return RankAnalysis(
        rank=trace.rank,
        path=trace.path,
        rank_source=trace.rank_source,
        device_name=None if prop is None else str(prop.get("name")),
        device_memory_bytes=None if prop is None or not isinstance(prop.get("totalGlobalMem"), int) else prop["totalGlobalMem"],
        steps=breakdown,
        devices=devices,
        temporal=temporal,
        overlap=overlap,
        idle=idle,
        kernel_type_sums=kinds,
        launches=launches,
        operators=operators,
        kernels=kernels,
        memory=memory,
        python=python,
        summary=summary,
        counters=counters,
        warnings=trace.warnings,
        idle_causes=causes,
        compiled=compiled,
        critical=critical,
    )


def _operator_views(links: EventLinks, memory: MemoryTable, origin: float, group_by_shape: bool,
                    tree: OpTree | None = None) -> tuple[OperatorTable, MemoryView]:
    """The views built on the host operator tree: the operator table and the memory view."""
    if tree is None:
        tree = build_op_tree(links)
    return operator_table(links, tree, group_by_shape), memory_view(links.events, memory, tree, origin)


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def _exposed(share: float | None, overlap: float | None) -> float | None:
    """Communication's share of the step that computation does not hide."""
    if share is None:
        return None
    return share * (1.0 - overlap) if overlap is not None else share


def _path_shares(path: PathSummary | None) -> CriticalPathShares | None:
    if path is None or path.length_us <= 0:
        return None
    return CriticalPathShares(
        cpu=path.share(CPU), data_loading=path.share(DATA_LOADING), launch=path.share(LAUNCH_OVERHEAD),
        kernel_gaps=path.share(GAP), gpu_compute=path.share(GPU_COMPUTE), memory_copies=path.share(GPU_MEMORY),
        communication=path.share(COMM), sync_wait=path.share(SYNC_WAIT), after_sync=path.after_sync_share,
        syncs=path.syncs,
        length_us=path.per_step_us, span_us=path.span_per_step_us)


def rank_evidence(item: RankAnalysis) -> TraceEvidence:
    steps = item.steps
    total_kernel = sum(d.kernel_us for d in item.devices)
    tc = sum((d.tc_share or 0.0) * d.kernel_us for d in item.devices) / total_kernel if total_kernel > 0 else None
    ops = item.operators.rows
    op_device = sum(r.device_self_us for r in ops)
    eligible = sum(r.device_self_us for r in ops if r.tc_eligible)
    launches = item.launches.summary()
    cuda_peak = item.memory.peak_bytes("CUDA")
    python = item.python
    causes = item.idle_causes
    compiled = item.compiled
    return TraceEvidence(
        source=item.path, rank=item.rank, rank_source=item.rank_source,
        steps=len(steps.step_names),
        device=item.device_name if item.devices else None,
        step_time_s=(steps.mean_us["Total"] / 1e6) if steps.step_names else None,
        shares=StepShares(kernel=steps.share("Kernel"), memcpy=steps.share("Memcpy"), memset=steps.share("Memset"),
                          communication=steps.share("Communication"), runtime=steps.share("Runtime"),
                          dataloader=steps.share("DataLoader"), cpu_exec=steps.share("CPU Exec")),
        idle=GpuIdle() if causes is None else GpuIdle(
            share=item.temporal.idle_share if item.temporal is not None else None,
            dataloader=causes.share("dataloader"), sync=causes.share("sync"), launch=causes.share("launch"),
            other=causes.share("other")),
        device_use=DeviceUse(
            utilization=_mean([d.utilization for d in item.devices]),
            sm_efficiency=_mean([d.sm_efficiency for d in item.devices]),
            achieved_occupancy=_mean([d.achieved_occupancy for d in item.devices]),
            tensor_core_kernel_share=tc,
            tensor_core_eligible_op_share=eligible / op_device if op_device > 0 else None),
        launches=KernelLaunches(
            kernels_per_step=item.counters.get("kernel_count_per_step"),
            median_kernel_us=item.counters.get("median_kernel_us"),
            small_kernel_share=launches["short_gpu_kernels"] / launches["count"] if launches.get("count") else None,
            launch_delay_us_median=launches["launch_delay_us"]["p50"] if launches.get("count") else None),
        host=HostTime(python=None if python is None else python.share("python"),
                      aten=None if python is None else python.share("aten")),
        syncs=SyncsAndCopies(syncs_per_step=item.counters.get("sync_count_per_step"),
                             sync_share=item.counters.get("sync_share"),
                             pageable_memcpy_share=item.counters.get("pageable_memcpy_share")),
        memory=DeviceMemoryUse(peak_bytes=int(cuda_peak) if cuda_peak is not None else None,
                               capacity_bytes=item.device_memory_bytes if cuda_peak is not None else None),
        comm_overlap=item.overlap.overlap_share,
        exposed_communication=_exposed(steps.share("Communication"), item.overlap.overlap_share),
        compiled=None if compiled is None else CompiledGraphs(compiled.graphs_per_step, compiled.recompiled_frames,
                                                              compiled.variants, compiled.between_graphs_us_per_step,
                                                              compiled.step_us),
        critical_path=_path_shares(item.critical),
        notes=tuple(steps.notes) + tuple(item.warnings),
    )
