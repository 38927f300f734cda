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

Categories, in priority order: Kernel (kernels not launched by a ``nccl:*``/``gloo:*`` op),
Memcpy, Memset, Communication (those kernels plus the host collective ops), Runtime, DataLoader
(``enumerate(DataLoader)#*.__next__`` / ``enumerate(DataPipe)#*``), CPU Exec (other operator,
python and annotation events, not the step itself), Other (the rest of the step). Each category
gets the part of the step time not already taken by a higher one, so the categories add up to
the step time. The Overview shows the mean over steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.analysis.trace import intervals
from stepscope.analysis.trace.tb_events import (
    ANNOTATION, GLOO_OPS, KERNEL, MEMCPY, MEMSET, NCCL_OPS, OPERATOR, PYTHON, RUNTIME, STEP, TbRoles,
)
from stepscope.traces.events import EventTable

CATEGORIES = ("Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CPU Exec", "Other")


@dataclass(frozen=True)
class TraceSteps:
    names: tuple[str, ...]
    start: np.ndarray
    end: np.ndarray
    device_ops: tuple[int, ...]  # device ops matched per step (before tail removal)
    removed_tail: int = 0
    synthetic: bool = False  # True when the trace has no ProfilerStep


@dataclass(frozen=True)
class StepBreakdown:
    step_names: tuple[str, ...]
    per_step_us: tuple[dict[str, float], ...]  # category -> µs, plus "Total"
    mean_us: dict[str, float]
    has: dict[str, bool] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

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


def _device_links(events: EventTable, roles: TbRoles) -> tuple[np.ndarray, np.ndarray]:
    """(runtime row, device row) pairs sharing a correlation id."""
    runtime = roles.rows(RUNTIME)
    device = roles.rows(KERNEL, MEMCPY, MEMSET)
    r_corr = events.correlation[runtime]
    order = np.argsort(r_corr, kind="stable")
    r_sorted, r_rows = r_corr[order], runtime[order]
    d_corr = events.correlation[device]
    # the plugin keeps the last runtime seen for a correlation id
    pos = np.searchsorted(r_sorted, d_corr, side="right") - 1
    ok = (pos >= 0) & (r_sorted[np.clip(pos, 0, None)] == d_corr) if len(r_sorted) else np.zeros(len(device), bool)
    return r_rows[pos[ok]], device[ok]


def find_steps(events: EventTable, roles: TbRoles) -> TraceSteps:
    ts, end = events.ts, events.ts + events.dur
    step_rows = roles.rows(STEP)
    if len(step_rows):
        order = step_rows  # file order, as the plugin keeps them
        names = tuple(str(n) for n in roles.step_number[order])
        host_s, host_e, synthetic = ts[order].copy(), end[order].copy(), False
    else:
        cpu = roles.rows(PYTHON, OPERATOR, STEP)
        if not len(cpu):
            return TraceSteps((), np.zeros(0), np.zeros(0), (), 0, True)
        names, synthetic = ("0",), True
        host_s, host_e = np.array([ts[cpu].min()]), np.array([end[cpu].max()])
    rt_rows, dev_rows = _device_links(events, roles)
    n = len(host_s)
    dev_min = np.full(n, np.inf)
    dev_max = np.full(n, -np.inf)
    matched = np.zeros(n, dtype=np.int64)
    # per runtime call: its device ops' first start, last end and count
    runtimes = roles.rows(RUNTIME)
    runtimes = runtimes[np.argsort(ts[runtimes], kind="stable")]
    slot = np.full(len(events), -1, dtype=np.int64)
    slot[runtimes] = np.arange(len(runtimes))
    link = slot[rt_rows]
    r_min = np.full(len(runtimes), np.inf)
    r_max = np.full(len(runtimes), -np.inf)
    r_count = np.bincount(link, minlength=len(runtimes)) if len(link) else np.zeros(len(runtimes), np.int64)
    np.minimum.at(r_min, link, ts[dev_rows])
    np.maximum.at(r_max, link, end[dev_rows])
    matched_runtime = np.zeros(len(runtimes), dtype=bool)
    # the plugin's two-way walk over runtimes (by start) and steps (in file order)
    i_step = i_rt = 0
    r_ts, r_end = ts[runtimes].tolist(), end[runtimes].tolist()
    cur_min, cur_max, cur_count = np.inf, -np.inf, 0
    while i_step < n and i_rt < len(runtimes):
        if r_ts[i_rt] < host_s[i_step]:
            i_rt += 1
        elif r_end[i_rt] <= host_e[i_step]:
            if r_count[i_rt]:
                cur_min, cur_max = min(cur_min, r_min[i_rt]), max(cur_max, r_max[i_rt])
                cur_count += int(r_count[i_rt])
                matched_runtime[i_rt] = True
            i_rt += 1
        elif r_ts[i_rt] < host_e[i_step]:
            i_rt += 1
        else:
            dev_min[i_step], dev_max[i_step], matched[i_step] = cur_min, cur_max, cur_count
            cur_min, cur_max, cur_count = np.inf, -np.inf, 0
            i_step += 1
    if i_step < n:
        dev_min[i_step], dev_max[i_step], matched[i_step] = cur_min, cur_max, cur_count
    inside = matched_runtime[link] if len(link) else np.zeros(0, bool)
    removed = 0
    if matched.sum() > 0:
        prev_end = host_s[0]
        if np.isfinite(dev_min[0]):
            matched_set = set(dev_rows[inside].tolist())
            all_dev = roles.rows(KERNEL, MEMCPY, MEMSET)
            loose = np.array([d for d in all_dev.tolist() if d not in matched_set], dtype=np.int64)
            if len(loose):
                early = end[loose][end[loose] < dev_min[0]]
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


def _role_ranges(events: EventTable, roles: TbRoles) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    symbols = events.symbols
    ts, end = events.ts, events.ts + events.dur
    comm_names = symbols.ids_where(lambda s: s in NCCL_OPS or s in GLOO_OPS)
    host_kinds = np.isin(roles.kind, (PYTHON, OPERATOR, ANNOTATION))
    host_comm = host_kinds & np.isin(events.name, comm_names)
    comm_ext = np.unique(events.external_id[host_comm & np.isin(roles.kind, (OPERATOR, ANNOTATION, PYTHON))])
    kernel = roles.kind == KERNEL
    comm_kernel = kernel & np.isin(events.external_id, comm_ext)
    loader_ids = symbols.ids_where(
        lambda s: (s.startswith("enumerate(DataLoader)#") and s.endswith(".__next__")) or s.startswith("enumerate(DataPipe)#")
    )
    loader = np.isin(roles.kind, (OPERATOR, ANNOTATION)) & np.isin(events.name, loader_ids)
    cpu_exec = host_kinds & ~loader & ~host_comm
    masks = {
        "Kernel": kernel & ~comm_kernel,
        "Memcpy": roles.kind == MEMCPY,
        "Memset": roles.kind == MEMSET,
        "Communication": comm_kernel | host_comm,
        "Runtime": roles.kind == RUNTIME,
        "DataLoader": loader,
        "CPU Exec": cpu_exec,
    }
    return {k: intervals.merge(ts[m], end[m]) for k, m in masks.items()}


def step_breakdown(events: EventTable, roles: TbRoles, steps: TraceSteps) -> StepBreakdown:
    ranges = _role_ranges(events, roles)
    has = {k.lower().replace(" ", "_"): bool(len(v[0])) for k, v in ranges.items()}
    if not len(steps.start):
        return StepBreakdown((), (), {c: 0.0 for c in (*CATEGORIES, "Total")}, has, ("no steps and no CPU events",))
    slots = intervals.merge(steps.start, steps.end)
    taken: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for category in CATEGORIES[:-1]:
        part = intervals.intersect(slots, ranges[category])
        taken[category] = part
        slots = intervals.subtract(slots, part)
    taken["Other"] = slots
    per_step = []
    for s, e in zip(steps.start, steps.end):
        row = {c: intervals.total(*intervals.clip(taken[c], s, e)) for c in CATEGORIES}
        row["Total"] = float(e - s)
        per_step.append(row)
    mean = {c: float(np.mean([r[c] for r in per_step])) for c in (*CATEGORIES, "Total")}
    notes = []
    if steps.synthetic:
        notes.append("no ProfilerStep in the trace: one step spans all CPU events")
    if steps.removed_tail:
        notes.append(f"{steps.removed_tail} trailing step(s) left out: their device work was not fully captured")
    return StepBreakdown(steps.names, tuple(per_step), mean, has, tuple(notes))
