"""The rows HTA's analyses see, reproduced on an :class:`~stepscope.traces.events.EventTable`.

Contract: :func:`hta_rows` returns an :class:`HtaRows` for one rank: indices of the rows HTA
keeps, with HTA's integer-rounded times, the GPU-row mask and each row's kernel type. Every HTA
view (temporal, idle time, kernel types, overlap, launch statistics) starts from it, so the
filtering rules live in one place. The rules (HolisticTraceAnalysis ``trace_parser`` /
``trace.py``, as studied in the project's trace-semantics notes, section a.0):

- rows without ``cat`` and ``cat == "Trace"`` are dropped;
- times are rounded inward: ``ts = ceil(ts)``, ``end = floor(ts + dur)``, ``dur = end - ts``;
- when the trace has >= 2 distinct names containing ``ProfilerStep``, only CPU rows starting
  before the last step's start are kept, plus GPU rows whose ``correlation`` matches a kept CPU
  row. A GPU row is ``stream >= 0 and correlation >= 0`` or named ``Event Sync``/``Context
  Sync``; every other row is a CPU row. (So the last profiled step is dropped, as HTA does.)
- analyses then use ``stream != -1`` as "GPU row".

Kernel types follow HTA ``main`` (v0.6.x) name rules, anchored at the start of the name, first
match wins: COMMUNICATION, MEMORY, COMPUTATION (= not matching the non-compute list), OTHER.
HTA 0.5.0 (the PyPI release) also counted ``Stream Wait Event`` rows as COMPUTATION; we follow
``main`` on purpose (a sync is not computation) — see BENCHMARKS.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from stepscope.traces.events import EventTable

COMPUTATION, COMMUNICATION, MEMORY, OTHER = 1, 2, 4, 0
KERNEL_TYPE_NAMES = {COMPUTATION: "COMPUTATION", COMMUNICATION: "COMMUNICATION", MEMORY: "MEMORY", OTHER: "OTHER"}
_COMM = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
_MEMORY = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
_NOT_COMPUTE = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(cuda.*LaunchKernel)|(^runFunction)"
    r"|(^Stream Wait Event)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)"
    r"|(^collective_subgraph_execution)"
)


def kernel_type(name: str) -> int:
    if _COMM.match(name):
        return COMMUNICATION
    if _MEMORY.match(name):
        return MEMORY
    if not _NOT_COMPUTE.match(name):
        return COMPUTATION
    return OTHER


@dataclass(frozen=True)
class HtaRows:
    """HTA's view of one rank. Arrays are aligned with ``index`` (rows of the EventTable)."""

    index: np.ndarray  # int64 rows of the table
    ts: np.ndarray  # float64, rounded up
    end: np.ndarray  # float64, rounded down
    gpu: np.ndarray  # bool: stream != -1
    ktype: np.ndarray  # int8 kernel type (only meaningful where gpu)
    filtered: bool  # True when the last-step filter applied

    @property
    def dur(self) -> np.ndarray:
        return self.end - self.ts


def hta_rows(events: EventTable) -> HtaRows:
    symbols = events.symbols
    keep = events.cat >= 0
    trace_cat = symbols.get("Trace")
    if trace_cat >= 0:
        keep &= events.cat != trace_cat
    index = np.flatnonzero(keep)
    step_names = symbols.ids_where(lambda s: "ProfilerStep" in s)
    present = np.unique(events.name[index][np.isin(events.name[index], step_names)])
    filtered = len(present) >= 2
    if filtered:
        sync_names = [i for i in (symbols.get("Event Sync"), symbols.get("Context Sync")) if i >= 0]
        stream, corr, name = events.stream[index], events.correlation[index], events.name[index]
        gpu_like = ((stream >= 0) & (corr >= 0)) | np.isin(name, sync_names)
        cpu_ts = events.ts[index]
        steps = ~gpu_like & np.isin(name, step_names)
        last_start = np.ceil(cpu_ts[steps]).max() if steps.any() else np.inf
        cpu_keep = ~gpu_like & (np.ceil(cpu_ts) < last_start)
        kept_corr = np.unique(corr[cpu_keep])
        gpu_keep = gpu_like & np.isin(corr, kept_corr)
        index = index[cpu_keep | gpu_keep]
    raw_ts = events.ts[index]
    ts = np.ceil(raw_ts)
    end = np.floor(raw_ts + events.dur[index])
    gpu = events.stream[index] != -1
    names = events.name[index]
    types = np.zeros(len(symbols.strings), dtype=np.int8)
    for ident in np.unique(names[gpu]):
        types[ident] = kernel_type(symbols.strings[ident])
    return HtaRows(index=index, ts=ts, end=end, gpu=gpu, ktype=types[names], filtered=filtered)
