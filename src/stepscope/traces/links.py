"""The linked-events table: every row of an :class:`~stepscope.traces.events.EventTable`
classified, joined and assigned to a step once.

Contract: :func:`link_events` returns an :class:`EventLinks` for one trace; it is computed once per
loaded trace and kept with its event table (:func:`links_of`). Every trace view reads these
columns instead of classifying rows or joining host and device events itself. All arrays are
aligned with the event table's rows unless said otherwise; everything is vectorised numpy, with
one Python pass over the distinct *names* (never over events).

Columns and the rules that fill them:

- ``role`` — the TensorBoard plugin's event type (its ``EventTypeMap``, ``cat`` matched
  case-insensitively): operator (``cpu_op``/``Operator``), runtime (``cuda_runtime``/``Runtime``/
  ``mtia_runtime``/``glow_runtime``/``xpu_runtime``/``privateuse1_runtime``), kernel, memcpy,
  memset, python, user annotation (``user_annotation``/``gpu_user_annotation``), step (an operator
  or user annotation named ``ProfilerStep#N``), python_function, trace, or none.
  ``step_number`` holds N for step rows, -1 elsewhere.
- ``gpu`` — HTA's "GPU row": ``stream != -1`` (kernels, memcpy, memset, and ``cuda_sync`` rows
  that carry a stream). ``ktype`` — HTA ``main``'s kernel type of GPU rows (COMMUNICATION,
  MEMORY, COMPUTATION, OTHER; see :func:`kernel_type`), OTHER elsewhere.
- ``launcher`` — the correlation link as the plugin makes it: for each kernel/memcpy/memset row,
  the runtime row with the same ``correlation`` (the last such row in file order: the plugin keeps
  the last one it saw); -1 when none.
- ``step`` — step assignment (HTA ``add_iteration``): a host row belongs to the ``ProfilerStep``
  whose ``[ts, ts + dur)`` contains its start (an index into :attr:`EventLinks.step_rows`, the
  step rows in file order; with overlapping steps, the latest-starting one); a device row
  inherits its launcher's step; -1 outside every step. Computed on first use. The plugin's own
  step rule (a runtime call wholly inside a host step, device spans re-timed) is applied by
  :func:`stepscope.analysis.trace.step_breakdown.find_steps` on these links.
- ``hta`` — :class:`HtaRows`, the subset of rows HTA's analyses see, with HTA's rounded times and
  the HTA correlation link (``cpu_link``: for each kept GPU row, the first kept host row with its
  correlation, as HTA's ``index_correlation``). The filtering rules are in :class:`HtaRows`.

Names are classified once: :meth:`EventLinks.names_where` evaluates a predicate over the distinct
event names only (not the call stacks and shapes that share the symbol table).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from stepscope.traces.events import EventTable, narrowed, position_dtype, positions_where, row_chunks
from stepscope.traces.events import symbol_mask as symbol_mask
from stepscope.traces.spill import follow

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

# plugin event types
NONE, OPERATOR, RUNTIME, KERNEL, MEMCPY, MEMSET, PYTHON, ANNOTATION, STEP, PYFUNC, TRACE = range(11)
_ROLE_COUNT = 11
_CAT_TYPES = {
    "trace": TRACE,
    "cpu_op": OPERATOR,
    "operator": OPERATOR,
    "runtime": RUNTIME,
    "cuda_runtime": RUNTIME,
    "mtia_runtime": RUNTIME,
    "glow_runtime": RUNTIME,
    "xpu_runtime": RUNTIME,
    "privateuse1_runtime": RUNTIME,
    "kernel": KERNEL,
    "memcpy": MEMCPY,
    "gpu_memcpy": MEMCPY,
    "memset": MEMSET,
    "gpu_memset": MEMSET,
    "python": PYTHON,
    "python_function": PYFUNC,
    "user_annotation": ANNOTATION,
    "gpu_user_annotation": ANNOTATION,
}
NCCL_OPS = frozenset(f"nccl:{op}" for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter"))
GLOO_OPS = frozenset(f"gloo:{op}" for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter"))

# HTA kernel types (``main``, v0.6.x rules)
COMPUTATION, COMMUNICATION, MEMORY, OTHER = 1, 2, 4, 0
KERNEL_TYPE_NAMES = {COMPUTATION: "COMPUTATION", COMMUNICATION: "COMMUNICATION", MEMORY: "MEMORY", OTHER: "OTHER"}
_COMM = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
_MEMORY = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
_NOT_COMPUTE = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(cuda.*LaunchKernel)|(^runFunction)"
    r"|(^Stream Wait Event)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)"
    r"|(^collective_subgraph_execution)"
)


#: stepscope's own DataLoader annotations (``[stepscope]dataloader_next``).
STEPSCOPE_DATALOADER_PREFIX = "[stepscope]dataloader"


def is_plugin_dataloader(name: str) -> bool:
    """The TensorBoard plugin's DataLoader range names."""
    return (name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")) or name.startswith(
        "enumerate(DataPipe)#"
    )


def is_dataloader(name: str) -> bool:
    """A host range in which the step waits for data: the plugin's, or stepscope's annotation."""
    return is_plugin_dataloader(name) or name.startswith(STEPSCOPE_DATALOADER_PREFIX)


def kernel_type(name: str) -> int:
    """HTA's kernel type of a GPU row name: anchored rules, first match wins."""
    if _COMM.match(name):
        return COMMUNICATION
    if _MEMORY.match(name):
        return MEMORY
    if not _NOT_COMPUTE.match(name):
        return COMPUTATION
    return OTHER


def unique_ints(values: npt.NDArray[np.integer]) -> npt.NDArray[np.integer]:
    """Sorted distinct values (``np.unique`` without its lazy ``numpy.ma`` import)."""
    if len(values) == 0:
        empty: npt.NDArray[np.integer] = values[:0].copy()
        return empty
    ordered = np.sort(values)
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    distinct: npt.NDArray[np.integer] = ordered[keep]
    return distinct


def int_isin(values: IntArray, keys: IntArray, presorted: bool = False) -> BoolArray:
    """``np.isin`` for integer arrays: one sort of the keys (none when ``presorted``: they are
    sorted already) and a binary search per value."""
    if not len(keys) or not len(values):
        return np.zeros(len(values), dtype=bool)
    ordered = keys if presorted else np.sort(keys)
    found: BoolArray = np.empty(len(values), dtype=bool)
    for chunk in row_chunks(len(values)):  # in chunks: the positions of a whole column would be 8 bytes a row
        part = values[chunk]
        pos = np.minimum(np.searchsorted(ordered, part), len(ordered) - 1)
        np.equal(ordered[pos], part, out=found[chunk])
    return found


@dataclass(frozen=True)
class HtaRows:
    """The rows HTA's analyses see (HolisticTraceAnalysis ``trace_parser``/``trace.py``).

    Arrays are aligned with ``index`` (rows of the event table). Rules:

    - rows without ``cat`` and ``cat == "Trace"`` are dropped;
    - times are rounded inward: ``ts = ceil(ts)``, ``end = floor(ts + dur)``;
    - when the trace has >= 2 distinct names containing ``ProfilerStep``, only host rows starting
      before the last step's start are kept, plus GPU rows whose ``correlation`` matches a kept
      host row. Here a GPU row is ``stream >= 0 and correlation >= 0`` or named ``Event Sync``/
      ``Context Sync``; every other row is a host row (so the last profiled step is dropped);
    - analyses then use ``stream != -1`` (``gpu``) as "GPU row".
    """

    index: IntArray  # rows of the table
    ts: FloatArray  # rounded up
    end: FloatArray  # rounded down
    gpu: BoolArray  # stream != -1
    ktype: npt.NDArray[np.int8]  # kernel type (meaningful where gpu)
    filtered: bool  # True when the last-step filter applied
    cpu_link: IntArray  # per kept row: position of the first kept host row with its correlation, -1

    @property
    def dur(self) -> FloatArray:
        return self.end - self.ts


@dataclass(frozen=True)
class EventLinks:
    """One trace's events, classified, linked and assigned to steps (see the module docstring)."""

    events: EventTable
    role: npt.NDArray[np.int8]
    step_number: IntArray
    gpu: BoolArray
    ktype: npt.NDArray[np.int8]
    launcher: IntArray
    step_rows: IntArray  # STEP rows in file order (``step`` indexes these)
    hta: HtaRows
    name_ids: npt.NDArray[np.int32]  # the distinct event names (symbol ids)
    _role_rows: dict[int, IntArray] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def step(self) -> IntArray:
        """Step of every row (see the module docstring); computed on first use."""
        device = self.rows(KERNEL, MEMCPY, MEMSET)
        return follow(self.events.ts)(_assign_steps(self.events, self.step_rows, self.launcher, device))

    @property
    def kind(self) -> npt.NDArray[np.int8]:
        """Alias of ``role`` (the plugin's event type)."""
        return self.role

    def rows(self, *roles: int) -> IntArray:
        """Rows of the given roles, in file order (cached per single role)."""
        if len(roles) == 1:
            found = self._role_rows.get(roles[0])
            if found is None:  # kept for every view: int32 below 2**31 rows, on disk where the table is
                rows = positions_where(self.role == roles[0])
                found = self._role_rows[roles[0]] = follow(self.events.ts)(rows)
            return found
        table = np.zeros(_ROLE_COUNT, dtype=bool)
        table[list(roles)] = True
        return np.flatnonzero(table[self.role])

    def names_where(self, predicate: Callable[[str], bool]) -> npt.NDArray[np.int32]:
        """Symbol ids of the event names (only names) for which ``predicate`` holds."""
        return _names_where(self.events, self.name_ids, predicate)

    def name_in(self, ids: npt.NDArray[np.int32] | list[int], rows: IntArray | None = None) -> BoolArray:
        """Per row (or per given row): is its name one of the symbol ids ``ids``."""
        names = self.events.name if rows is None else self.events.name[rows]
        return symbol_mask(names, ids, len(self.events.symbols.strings))

    def name_is(self, predicate: Callable[[str], bool], rows: IntArray | None = None) -> BoolArray:
        """Per row (or per given row): does its name satisfy ``predicate``."""
        return self.name_in(self.names_where(predicate), rows)


def _roles(events: EventTable) -> tuple[npt.NDArray[np.int8], IntArray]:
    symbols = events.symbols
    cat_ids = unique_ints(events.cat[events.cat >= 0]) if len(events) else np.zeros(0, np.int32)
    cat_kind = np.zeros(len(symbols.strings) + 1, dtype=np.int8)  # cat == -1 reads the last slot
    for ident in cat_ids.tolist():
        cat_kind[ident] = _CAT_TYPES.get(symbols.strings[ident].lower(), NONE)
    role = cat_kind[events.cat]
    candidates = np.flatnonzero((role == OPERATOR) | (role == ANNOTATION))
    numbers = np.full(len(symbols.strings), -1, dtype=np.int64)
    names = events.name[candidates]
    for ident in unique_ints(names).tolist():
        text = symbols.strings[ident]
        if text.startswith("ProfilerStep#"):
            try:
                numbers[ident] = int(text.split("#", 1)[1])
            except ValueError:
                pass
    # int32 unless a step number does not fit (the same values in half the memory)
    step_number = np.full(len(events), -1, dtype=narrowed(numbers).dtype)
    found = numbers[names]
    is_step = found >= 0
    role[candidates[is_step]] = STEP
    step_number[candidates[is_step]] = found[is_step]
    return role, step_number


def _kernel_types(events: EventTable, gpu: BoolArray) -> npt.NDArray[np.int8]:
    names = events.name[gpu]
    types = np.zeros(len(events.symbols.strings), dtype=np.int8)
    for ident in unique_ints(names).tolist():
        types[ident] = kernel_type(events.symbols.strings[ident])
    out = np.zeros(len(events), dtype=np.int8)
    out[gpu] = types[names]
    return out


def last_match(keys: IntArray, rows: IntArray, wanted: IntArray) -> IntArray:
    """For each wanted key, the last of ``rows`` (file order) whose key equals it; -1 if none (in
    the type of ``rows``: int32 positions give int32)."""
    out = np.full(len(wanted), -1, dtype=rows.dtype if rows.dtype in (np.int32, np.int64) else np.int64)
    if not len(keys) or not len(wanted):
        return out
    order = np.argsort(keys, kind="stable")
    sorted_keys, sorted_rows = keys[order], rows[order]
    del order
    for chunk in row_chunks(len(wanted)):  # the positions of a chunk at a time: 8 bytes a row
        part = wanted[chunk]
        pos = np.searchsorted(sorted_keys, part, side="right") - 1
        ok = (pos >= 0) & (sorted_keys[np.clip(pos, 0, None)] == part)
        out[chunk][ok] = sorted_rows[pos[ok]]
    return out


def _first_match(keys: IntArray, wanted: IntArray) -> IntArray:
    """For each wanted key, the position of the first equal element of ``keys``; -1 if none."""
    out = np.full(len(wanted), -1, dtype=position_dtype(len(keys)))
    if not len(keys) or not len(wanted):
        return out
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    pos = np.clip(np.searchsorted(sorted_keys, wanted, side="left"), 0, len(keys) - 1)
    ok = sorted_keys[pos] == wanted
    out[ok] = order[pos[ok]]
    return out


def _names_where(
    events: EventTable, name_ids: npt.NDArray[np.int32], predicate: Callable[[str], bool]
) -> npt.NDArray[np.int32]:
    strings = events.symbols.strings
    return np.array([i for i in name_ids.tolist() if predicate(strings[i])], dtype=np.int32)


def _hta_rows(
    events: EventTable, gpu: BoolArray, ktype: npt.NDArray[np.int8], step_names: npt.NDArray[np.int32],
    spill: Callable[[np.ndarray], np.ndarray],
) -> HtaRows:
    symbols = events.symbols
    keep = events.cat >= 0
    trace_cat = symbols.get("Trace")
    if trace_cat >= 0:
        keep &= events.cat != trace_cat
    positions = position_dtype(len(events))
    index = np.flatnonzero(keep).astype(positions, copy=False)
    del keep
    names = events.name[index]
    n_symbols = len(symbols.strings)
    is_step_name = symbol_mask(names, step_names, n_symbols)
    present = unique_ints(names[is_step_name])
    filtered = len(present) >= 2
    if filtered:
        index = _last_step_filter(events, index, names, is_step_name)
    del names, is_step_name
    index = spill(narrowed(index))
    # HTA rounds inward: ts = ceil(ts), end = floor(ts + dur), each computed in its own array (the
    # end first and on disk before the start is read: two columns at a time, not three)
    end = events.dur[index]
    end += events.ts[index]
    np.floor(end, out=end)
    end = spill(end)
    ts = events.ts[index]
    np.ceil(ts, out=ts)
    ts = spill(ts)
    kept_gpu = spill(gpu[index])
    # HTA's correlation link: each GPU row -> the first kept host row sharing its correlation
    corr = events.correlation[index]
    host = np.flatnonzero(~kept_gpu & (corr >= 0)).astype(positions, copy=False)
    cpu_link = np.full(len(index), -1, dtype=positions)
    gpu_pos = np.flatnonzero(kept_gpu).astype(positions, copy=False)
    wanted = corr[gpu_pos]
    host = host[int_isin(corr[host], np.sort(wanted), presorted=True)]  # only hosts a GPU row can name: a smaller sort
    first = _first_match(corr[host], wanted)
    del wanted
    del corr
    found = first >= 0
    cpu_link[gpu_pos[found]] = host[first[found]]
    del host, gpu_pos, first, found
    return HtaRows(index=index, ts=ts, end=end, gpu=kept_gpu, ktype=spill(ktype[index]), filtered=filtered,
                   cpu_link=spill(narrowed(cpu_link)))


def _last_step_filter(events: EventTable, index: IntArray, names: npt.NDArray[np.int32], is_step_name: BoolArray) -> IntArray:
    """HTA's filter with two steps or more (:class:`HtaRows`): the host rows of ``index`` starting
    before the last step's start, and the GPU rows whose correlation one of those has. Per row in
    chunks (:func:`~stepscope.traces.events.row_chunks`: no whole column of starts, streams or
    correlations at once)."""
    symbols = events.symbols
    sync_names = [i for i in (symbols.get("Event Sync"), symbols.get("Context Sync")) if i >= 0]
    n_symbols = len(symbols.strings)
    chunks = row_chunks(len(index))
    gpu_like = np.empty(len(index), dtype=bool)
    for part in chunks:
        rows = index[part]
        found = events.stream[rows] >= 0
        found &= events.correlation[rows] >= 0
        found |= symbol_mask(names[part], sync_names, n_symbols)
        gpu_like[part] = found
    steps = np.flatnonzero(is_step_name & ~gpu_like)
    last_start = np.ceil(events.ts[index[steps]]).max() if len(steps) else np.inf
    cpu_keep = np.empty(len(index), dtype=bool)
    for part in chunks:
        np.less(np.ceil(events.ts[index[part]]), last_start, out=cpu_keep[part])
        cpu_keep[part] &= ~gpu_like[part]
    keys = np.concatenate([events.correlation[index[part][cpu_keep[part]]] for part in chunks] or [events.correlation[:0]])
    keys.sort()
    for part in chunks:  # kept: a host row kept, or a GPU row whose correlation one of them has
        gpu_like[part] &= int_isin(events.correlation[index[part]], keys, presorted=True)
    gpu_like |= cpu_keep
    return index[gpu_like]


def _assign_steps(events: EventTable, step_rows: IntArray, launcher: IntArray, device: IntArray) -> IntArray:
    step = np.full(len(events), -1, dtype=np.int64)
    if not len(step_rows):
        return step
    starts = events.ts[step_rows]
    ends = starts + events.dur[step_rows]
    order = np.argsort(starts, kind="stable")
    s_sorted, e_sorted = starts[order], ends[order]
    host = np.flatnonzero(events.stream == -1)
    pos = np.searchsorted(s_sorted, events.ts[host], side="right") - 1
    ok = pos >= 0
    inside = np.zeros(len(host), dtype=bool)
    inside[ok] = events.ts[host][ok] < e_sorted[pos[ok]]
    step[host[inside]] = order[pos[inside]]
    linked = launcher[device]
    has = linked >= 0
    step[device[has]] = step[linked[has]]
    return step


def links_of(events: EventTable) -> EventLinks:
    """The linked-events table of ``events``, computed on first use and kept with the table."""
    cached: EventLinks | None = events.__dict__.get("_links")
    if cached is None:
        cached = link_events(events)
        events.__dict__["_links"] = cached
    return cached


def link_events(events: EventTable) -> EventLinks:
    """Classify, link and step-assign every row of ``events`` (the table described above). Each
    column goes to disk as soon as it is complete where the table's did (``spill``:
    :mod:`stepscope.traces.spill`), so a large table's links never hold their columns all at once."""
    spill = follow(events.ts)
    role, step_number = _roles(events)
    role, step_number = spill(role), spill(narrowed(step_number))
    gpu = spill(events.stream != -1)
    ktype = spill(_kernel_types(events, gpu))
    runtime = spill(positions_where(role == RUNTIME))
    device = np.flatnonzero((role == KERNEL) | (role == MEMCPY) | (role == MEMSET))
    # row positions: int32 below 2**31 rows (the same values as int64, half the memory)
    launcher = np.full(len(events), -1, dtype=position_dtype(len(events)))
    launcher[device] = last_match(events.correlation[runtime], runtime, events.correlation[device])
    del device
    launcher = spill(narrowed(launcher))
    step_rows = np.flatnonzero(role == STEP)
    name_ids = unique_ints(events.name).astype(np.int32)
    step_names = _names_where(events, name_ids, lambda s: "ProfilerStep" in s)
    hta = _hta_rows(events, gpu, ktype, step_names, spill)
    return EventLinks(
        events=events, role=role, step_number=step_number, gpu=gpu, ktype=ktype, launcher=launcher,
        step_rows=step_rows, hta=hta, name_ids=name_ids, _role_rows={RUNTIME: runtime},
    )
