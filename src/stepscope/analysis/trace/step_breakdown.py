"""The plugin's Overview: steps and the per-step time breakdown by category.

Steps (plugin ``StepParser``): every ``ProfilerStep#N`` is a host step ``[ts, ts+dur]``; with
none, one step spans the CPU events (Python/Operator/step types). When some runtime call inside
a step launched device work, steps are re-timed to the device: the runtime calls lying wholly
inside a host step give that step's device span (first start, last end of their kernels,
memcpys and memsets); ``prev_end`` starts at the first step's start (raised to the last end of
earlier, unattributed device work ending before step 0's device work), then
``start_i = max(prev_end, host_start_i)``, ``end_i = max(host_end_i, device_end_i)`` (or
``max(host_end_i, start_i)`` without device work). Trailing steps without device work are
dropped, and the last one too when it has < 80% of the previous step's device ops.

The runtime -> device links come from the linked-events table (:mod:`stepscope.traces.links`).
The plugin walks runtime calls (by start) and steps (in file order) together; when the steps are
in order and disjoint (the norm) that walk is the vectorised rule "the first step ending at or
after the call's end, if it started at or before the call's start", else the walk itself runs.

Categories, in priority order: Kernel (kernels not launched by a ``nccl:*``/``gloo:*`` op),
Memcpy, Memset, Communication (those kernels plus the host collective ops), Runtime, DataLoader
(``enumerate(DataLoader)#*.__next__`` / ``enumerate(DataPipe)#*``), CPU Exec (other operator,
python and annotation events, not the step itself), Other (the rest of the step). Each category
gets the part of the step time not already taken by a higher one, so the categories add up to
the step time. The Overview shows the mean over steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.traces import intervals
from stepscope.traces.events import position_dtype, positions_where
from stepscope.traces.links import (
    ANNOTATION, GLOO_OPS, KERNEL, MEMCPY, MEMSET, NCCL_OPS, OPERATOR, PYTHON, RUNTIME, STEP, BoolArray, EventLinks,
    FloatArray, IntArray, int_isin, is_plugin_dataloader, unique_ints,
)

CATEGORIES = ("Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CPU Exec", "Other")


@dataclass(frozen=True)
class TraceSteps:
    """The trace's steps (``ProfilerStep#N`` spans, or one synthetic step) and their bounds."""

    names: tuple[str, ...]
    start: np.ndarray
    end: np.ndarray
    device_ops: tuple[int, ...]  # device ops matched per step (before tail removal)
    removed_tail: int = 0
    synthetic: bool = False  # True when the trace has no ProfilerStep


#: The columns of :attr:`StepBreakdown.per_step`: the categories, then the step's duration.
PER_STEP_COLUMNS = (*CATEGORIES, "Total")


@dataclass(frozen=True)
class StepBreakdown:
    """Where each step's time went, per category (kernel, memcpy, runtime, DataLoader, …), and the mean step."""

    step_names: tuple[str, ...]
    #: µs per step (rows) and :data:`PER_STEP_COLUMNS` (columns). An array, not a dict per step:
    #: a job's merge keeps every rank's breakdown, and a rank of 8,696 steps took ~5 MB as dicts.
    per_step: np.ndarray
    mean_us: dict[str, float]
    has: dict[str, bool] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def per_step_us(self) -> tuple[dict[str, float], ...]:
        """Per step, category -> µs, plus "Total"."""
        return tuple(dict(zip(PER_STEP_COLUMNS, row)) for row in self.per_step.tolist())

    def share(self, category: str) -> float | None:
        total = self.mean_us.get("Total", 0.0)
        return self.mean_us.get(category, 0.0) / total if total > 0 else None

    def to_dict(self) -> dict[str, Any]:
        total = self.mean_us.get("Total", 0.0)
        return {
            "steps": list(self.step_names),
            "per_step_us": [dict(s) for s in self.per_step_us],
            "mean_us": dict(self.mean_us),
            "mean_share": {c: (self.mean_us[c] / total if total > 0 else None) for c in CATEGORIES},
            "has": dict(self.has),
            "notes": list(self.notes),
        }


def _walk_steps(
    r_ts: list[float], r_end: list[float], r_count: IntArray, host_s: FloatArray, host_e: FloatArray
) -> IntArray:
    """The plugin's two-way walk over runtimes (by start) and steps (in file order): the step each
    runtime call is matched to, -1 when none. Used when steps overlap or are out of order."""
    n = len(host_s)
    out = np.full(len(r_ts), -1, dtype=np.int64)
    i_step = i_rt = 0
    while i_step < n and i_rt < len(r_ts):
        if r_ts[i_rt] < host_s[i_step]:
            i_rt += 1
        elif r_end[i_rt] <= host_e[i_step]:
            if r_count[i_rt]:
                out[i_rt] = i_step
            i_rt += 1
        elif r_ts[i_rt] < host_e[i_step]:
            i_rt += 1
        else:
            i_step += 1
    return out


def _runtime_steps(r_ts: FloatArray, r_end: FloatArray, r_count: IntArray, host_s: FloatArray, host_e: FloatArray) -> IntArray:
    """Step of each runtime call (sorted by start) that lies wholly inside a host step, -1 if none."""
    n = len(host_s)
    ordered = n < 2 or bool(np.all(host_s[1:] >= host_e[:-1]) and np.all(host_e >= host_s))
    if not ordered:
        return _walk_steps(r_ts.tolist(), r_end.tolist(), r_count, host_s, host_e)
    # steps in order and disjoint: the walk matches a call to the first step ending at or after
    # its end, when that step also started at or before its start
    pos = np.searchsorted(host_e, r_end, side="left")
    ok = pos < n
    ok[ok] &= host_s[pos[ok]] <= r_ts[ok]
    ok &= r_count > 0
    pos[~ok] = -1
    return pos


def _by_start(runtimes: IntArray, ts: FloatArray, linked: IntArray) -> tuple[IntArray, IntArray]:
    """``runtimes`` (rows in file order) sorted by start, and the position in that order of each of
    ``linked`` (runtime rows), -1 for a row that is not a runtime call."""
    by_start = np.argsort(ts[runtimes], kind="stable")
    positions = position_dtype(len(runtimes))
    rank = np.empty(len(runtimes), dtype=positions)
    rank[by_start] = np.arange(len(runtimes), dtype=positions)
    at = np.minimum(np.searchsorted(runtimes, linked), max(len(runtimes) - 1, 0))
    found = runtimes[at] == linked if len(runtimes) else np.zeros(len(linked), dtype=bool)
    return runtimes[by_start], np.where(found, rank[at] if len(runtimes) else -1, -1)


def find_steps(links: EventLinks) -> TraceSteps:
    events = links.events
    ts = events.ts
    step_rows = links.step_rows
    if len(step_rows):
        names = tuple(str(n) for n in links.step_number[step_rows].tolist())  # file order, as the plugin keeps them
        host_s, host_e, synthetic = ts[step_rows].copy(), events.end_at(step_rows), False
    else:
        cpu = links.rows(PYTHON, OPERATOR, STEP)
        if not len(cpu):
            return TraceSteps((), np.zeros(0), np.zeros(0), (), 0, True)
        names, synthetic = ("0",), True
        host_s, host_e = np.array([ts[cpu].min()]), np.array([events.end_at(cpu).max()])
    n = len(host_s)
    device = links.rows(KERNEL, MEMCPY, MEMSET)
    launcher = links.launcher[device]
    linked = launcher >= 0
    dev_rows, rt_rows = device[linked], launcher[linked]
    # per runtime call (sorted by start): its device ops' first start, last end and count
    runtimes, link = _by_start(links.rows(RUNTIME), ts, rt_rows)
    r_count = np.bincount(link, minlength=len(runtimes)) if len(link) else np.zeros(len(runtimes), np.int64)
    r_step = _runtime_steps(ts[runtimes], events.end_at(runtimes), r_count, host_s, host_e)
    hit = r_step >= 0
    # each step's device ops (those of its runtime calls): first start, last end (taken straight
    # from the ops: a column per runtime call of their first start and last end held more)
    dev_min = np.full(n, np.inf)
    dev_max = np.full(n, -np.inf)
    dev_step = r_step[link]
    in_step = dev_step >= 0
    dev_step, stepped = dev_step[in_step], dev_rows[in_step]
    np.minimum.at(dev_min, dev_step, ts[stepped])
    np.maximum.at(dev_max, dev_step, events.end_at(stepped))
    del dev_step, stepped, in_step
    matched = np.bincount(r_step[hit], weights=r_count[hit], minlength=n).astype(np.int64) if n else np.zeros(0, np.int64)
    removed = 0
    if matched.sum() > 0:
        prev_end = host_s[0]
        if np.isfinite(dev_min[0]):
            inside = np.zeros(len(events), dtype=bool)
            inside[dev_rows[hit[link]]] = True
            loose = device[~inside[device]]
            if len(loose):
                loose_end = events.end_at(loose)
                early = loose_end[loose_end < dev_min[0]]
                if len(early):
                    prev_end = max(prev_end, early.max())
        for i in range(n):
            start_i = max(prev_end, host_s[i])
            end_i = max(host_e[i], dev_max[i]) if np.isfinite(dev_min[i]) else max(host_e[i], start_i)
            end_i = max(end_i, start_i)
            host_s[i], host_e[i] = start_i, end_i
            prev_end = end_i
        if n > 1:
            last = n - 1
            while last >= 0 and matched[last] == 0:
                last -= 1
            if last >= 0:
                keep = last + 1
                if last > 0 and matched[last - 1] * 0.8 > matched[last]:
                    keep = last
                removed = n - keep
                host_s, host_e, names = host_s[:keep], host_e[:keep], names[:keep]
    return TraceSteps(names, host_s, host_e, tuple(int(m) for m in matched), removed, synthetic)


def _role_ranges(links: EventLinks) -> Iterator[tuple[str, tuple[FloatArray, FloatArray]]]:
    """Each category's merged host or device ranges, in :data:`CATEGORIES` order, one at a time
    (the caller drops each before the next is merged: a big trace's were ~300 MB together)."""
    events = links.events
    role = links.role

    def host_kinds() -> BoolArray:
        found: BoolArray = (role == PYTHON) | (role == OPERATOR) | (role == ANNOTATION)
        return found

    comm_names = links.names_where(lambda s: s in NCCL_OPS or s in GLOO_OPS)
    host_comm = host_kinds() & links.name_in(comm_names) if len(comm_names) else None
    comm_kernel = None
    if host_comm is not None and host_comm.any():
        comm_ext = unique_ints(events.external_id[host_comm]).astype(np.int64)
        comm_kernel = (role == KERNEL) & int_isin(events.external_id, comm_ext)
    loader_ids = links.names_where(is_plugin_dataloader)
    loader = ((role == OPERATOR) | (role == ANNOTATION)) & links.name_in(loader_ids)

    def communication() -> BoolArray:
        found = np.zeros(len(role), bool) if host_comm is None else host_comm.copy()
        if comm_kernel is not None:
            found |= comm_kernel
        return found

    def cpu_exec() -> BoolArray:
        found: BoolArray = host_kinds() & ~loader
        if host_comm is not None:
            found &= ~host_comm
        return found

    masks = {  # built one at a time from the roles: seven masks of the whole table at once were the step breakdown's peak
        "Kernel": lambda: role == KERNEL if comm_kernel is None else (role == KERNEL) & ~comm_kernel,
        "Memcpy": lambda: role == MEMCPY,
        "Memset": lambda: role == MEMSET,
        "Communication": communication,
        "Runtime": lambda: role == RUNTIME,
        "DataLoader": lambda: loader,
        "CPU Exec": cpu_exec,
    }
    for key, mask in masks.items():
        yield key, intervals.merge_rows(events.ts, events.dur, positions_where(mask()))


def _has_key(category: str) -> str:
    return category.lower().replace(" ", "_")


def step_breakdown(links: EventLinks, steps: TraceSteps) -> StepBreakdown:
    if not len(steps.start):
        has = {_has_key(k): bool(len(v[0])) for k, v in _role_ranges(links)}
        return StepBreakdown((), np.zeros((0, len(PER_STEP_COLUMNS))), {c: 0.0 for c in PER_STEP_COLUMNS}, has,
                             ("no steps and no CPU events",))
    # each category takes what the ones before it left of the steps; its time per step is summed
    # at once and its ranges dropped before the next category's are merged
    slots = intervals.merge(steps.start, steps.end)
    per_step = np.empty((len(steps.start), len(PER_STEP_COLUMNS)), order="F")  # a column per category
    has = {}
    for column, (category, ranges) in enumerate(_role_ranges(links)):
        has[_has_key(category)] = bool(len(ranges[0]))
        part = intervals.intersect(slots, ranges)
        del ranges
        per_step[:, column] = intervals.totals_within(part, steps.start, steps.end)
        slots = intervals.subtract(slots, part)
        del part
    per_step[:, len(CATEGORIES) - 1] = intervals.totals_within(slots, steps.start, steps.end)  # "Other"
    per_step[:, -1] = steps.end - steps.start
    mean = {c: float(np.mean(per_step[:, column])) for column, c in enumerate(PER_STEP_COLUMNS)}
    notes = []
    if steps.synthetic:
        notes.append("no ProfilerStep in the trace: one step spans all CPU events")
    if steps.removed_tail:
        notes.append(f"{steps.removed_tail} trailing step(s) left out: their device work was not fully captured")
    return StepBreakdown(steps.names, per_step, mean, has, tuple(notes))
