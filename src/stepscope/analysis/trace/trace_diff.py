"""Operators and kernels of two traces compared (HTA ``TraceDiff`` parity).

:func:`trace_diff` gives, per event name, the count and total duration in a control trace (A) and
a test trace (B) over the chosen iterations, exactly as HTA 0.5.0/0.6.x ``TraceDiff.compare_traces``
computes them (checked on HTA's reference pair in the tests):

- the rows are HTA's (:class:`stepscope.traces.links.HtaRows`: no ``Trace`` category, times rounded
  inward, the last profiled step dropped when there are several);
- a host row (``stream < 0``) belongs to the ``ProfilerStep#N`` whose ``[ts, ts + dur)`` holds its
  start (the last such step in file order); a GPU row (``stream > 0``) to its correlated host row's
  step;
- by default the first iteration (the lowest N) of the first rank of each side; ``device`` picks
  CPU rows (``stream == -1``), GPU rows (``stream != -1``) or both.

Each :class:`OpDiff` is classified as HTA's ``ops_diff`` does — ``added`` (absent in A),
``deleted`` (absent in B), ``increased``/``decreased`` (count), ``unchanged`` — and carries the
per-call mean duration on each side, so a renderer can show the largest changes per call and in
total. HTA has no notion of noise and neither has one iteration; :attr:`TraceDiff.iterations`
says how many steps each side summed.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.errors import UsageError
from stepscope.traces.events import EventTable
from stepscope.traces.links import HtaRows, links_of

DEVICES = ("all", "cpu", "gpu")
_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")


@dataclass(frozen=True)
class OpDiff:
    name: str
    count_a: int
    total_us_a: float
    count_b: int
    total_us_b: float
    category: str  # "added" | "deleted" | "increased" | "decreased" | "unchanged"
    gpu: bool  # a kernel / memcpy / memset name (seen on a GPU row)

    @property
    def diff_count(self) -> int:
        return self.count_b - self.count_a

    @property
    def diff_us(self) -> float:
        return self.total_us_b - self.total_us_a

    @property
    def mean_us_a(self) -> float | None:
        return self.total_us_a / self.count_a if self.count_a else None

    @property
    def mean_us_b(self) -> float | None:
        return self.total_us_b / self.count_b if self.count_b else None

    @property
    def per_call_change(self) -> float | None:
        """B's mean duration per call over A's, minus 1 (None when either side has no call or 0 µs)."""
        if self.mean_us_a is None or self.mean_us_b is None or self.mean_us_a <= 0:
            return None
        return self.mean_us_b / self.mean_us_a - 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(diff_count=self.diff_count, diff_us=self.diff_us, mean_us_a=self.mean_us_a,
                    mean_us_b=self.mean_us_b, per_call_change=self.per_call_change)
        return data


@dataclass(frozen=True)
class TraceDiff:
    a: str
    b: str
    device: str
    iterations_a: tuple[int, ...]
    iterations_b: tuple[int, ...]
    ops: tuple[OpDiff, ...]  # sorted by total duration change, largest increase first
    step_us_a: float | None  # the compared iterations' ProfilerStep durations, summed
    step_us_b: float | None

    def by_category(self, category: str) -> tuple[OpDiff, ...]:
        return tuple(op for op in self.ops if op.category == category)

    @property
    def counts(self) -> dict[str, int]:
        """How many names are in each category (HTA's ``ops_diff`` classes)."""
        return {category: len(self.by_category(category))
                for category in ("added", "deleted", "increased", "decreased", "unchanged")}

    @property
    def step_change(self) -> float | None:
        """The compared iterations' ProfilerStep time, B over A minus 1."""
        return self.step_us_b / self.step_us_a - 1 if self.step_us_a and self.step_us_b else None

    def _without_steps(self) -> list[OpDiff]:
        return [op for op in self.ops if not op.name.startswith("ProfilerStep")]

    def largest_increases(self, top: int) -> list[OpDiff]:
        return [op for op in self._without_steps() if op.diff_us > 0][:top]  # ops are sorted that way

    def largest_decreases(self, top: int) -> list[OpDiff]:
        return sorted((op for op in self._without_steps() if op.diff_us < 0), key=lambda op: op.diff_us)[:top]

    def per_call_slowdowns(self, top: int, min_total_us: float = 10.0) -> list[OpDiff]:
        """The largest per-call slow-downs among names called in both, at least ``min_total_us`` in B."""
        found = [op for op in self._without_steps()
                 if op.per_call_change is not None and op.total_us_b >= min_total_us]
        return sorted(found, key=lambda op: -(op.per_call_change or 0.0))[:top]

    def added(self, top: int) -> list[OpDiff]:
        return sorted(self.by_category("added"), key=lambda op: -op.total_us_b)[:top]

    def deleted(self, top: int) -> list[OpDiff]:
        return sorted(self.by_category("deleted"), key=lambda op: -op.total_us_a)[:top]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "stepscope.trace_diff", "a": self.a, "b": self.b, "device": self.device,
                "iterations_a": list(self.iterations_a), "iterations_b": list(self.iterations_b),
                "step_us_a": self.step_us_a, "step_us_b": self.step_us_b,
                "counts": self.counts,
                "ops": [op.to_dict() for op in self.ops]}


def _step_number_of_symbols(events: EventTable) -> np.ndarray:
    """For each symbol, the N of a ``ProfilerStep#N`` name, else -1 (one pass over the names)."""
    number_of = np.full(len(events.symbols.strings), -1, dtype=np.int64)
    for ident, text in enumerate(events.symbols.strings):
        if text.startswith("ProfilerStep"):
            match = _STEP.match(text)
            if match:
                number_of[ident] = int(match.group(1))
    return number_of


def step_numbers(events: EventTable) -> list[int]:
    """The ``ProfilerStep#N`` numbers named in the trace, sorted (HTA's ``iterations()``)."""
    return sorted({int(n) for n in _step_number_of_symbols(events) if n >= 0})


def _iterations(events: EventTable, rows: HtaRows) -> np.ndarray:
    """HTA's ``add_iteration`` over the HTA rows: the step number of each row, -1 outside."""
    names = events.name[rows.index]
    number_of = _step_number_of_symbols(events)
    row_numbers = np.where(names >= 0, number_of[np.maximum(names, 0)], -1)
    steps = np.flatnonzero(row_numbers >= 0)
    iteration = np.full(len(rows.index), -1, dtype=np.int64)
    stream = events.stream[rows.index]
    host = np.flatnonzero(stream < 0)
    ts = rows.ts
    for position in steps:  # file order: a later step overrides an earlier one (HTA's loop)
        start, end = ts[position], ts[position] + (rows.end[position] - rows.ts[position])
        inside = host[(ts[host] >= start) & (ts[host] < end)]
        iteration[inside] = row_numbers[position]
    device = np.flatnonzero((stream > 0) & (rows.cpu_link > 0))
    iteration[device] = iteration[rows.cpu_link[device]]
    return iteration


def _summary(events: EventTable, iterations: tuple[int, ...] | None, device: str
             ) -> tuple[dict[str, tuple[int, float, bool]], tuple[int, ...], float | None]:
    rows = links_of(events).hta
    numbers = step_numbers(events)
    if not numbers:
        raise UsageError("the trace has no ProfilerStep#N annotation: TraceDiff compares iterations "
                         "(record it with torch.profiler's schedule and prof.step())")
    chosen = tuple(numbers[:1]) if iterations is None else tuple(iterations)
    missing = [n for n in chosen if n not in numbers]
    if missing:
        raise UsageError(f"iteration(s) {missing} are not in the trace; it has {numbers[0]}…{numbers[-1]}")
    iteration = _iterations(events, rows)
    keep = np.isin(iteration, np.asarray(chosen, dtype=np.int64))
    stream = events.stream[rows.index]
    if device == "cpu":
        keep &= stream == -1
    elif device == "gpu":
        keep &= stream != -1
    names = events.name[rows.index][keep]
    durations = rows.dur[keep]
    is_gpu = (stream != -1)[keep]
    out: dict[str, tuple[int, float, bool]] = {}
    if len(names):
        unique, inverse = np.unique(names, return_inverse=True)
        counts = np.bincount(inverse)
        totals = np.bincount(inverse, weights=durations)
        gpu_any = np.bincount(inverse, weights=is_gpu.astype(np.float64)) > 0
        for ident, count, total, gpu in zip(unique, counts, totals, gpu_any):
            out[events.symbols.decode(int(ident))] = (int(count), float(total), bool(gpu))
    step_us = sum(out.get(f"ProfilerStep#{n}", (0, 0.0, False))[1] for n in chosen) or None
    return out, chosen, step_us


def trace_diff(a: EventTable, b: EventTable, *, label_a: str = "A", label_b: str = "B",
               iterations_a: tuple[int, ...] | None = None, iterations_b: tuple[int, ...] | None = None,
               device: str = "all") -> TraceDiff:
    """Per-name counts and total durations of two traces' iterations (module docstring)."""
    if device not in DEVICES:
        raise UsageError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    sa, chosen_a, step_a = _summary(a, iterations_a, device)
    sb, chosen_b, step_b = _summary(b, iterations_b, device)
    ops = []
    for name in sa.keys() | sb.keys():
        ca, ta, ga = sa.get(name, (0, 0.0, False))
        cb, tb, gb = sb.get(name, (0, 0.0, False))
        if name not in sa:
            category = "added"
        elif name not in sb:
            category = "deleted"
        else:
            category = "increased" if cb > ca else "decreased" if cb < ca else "unchanged"
        ops.append(OpDiff(name, ca, ta, cb, tb, category, ga or gb))
    ops.sort(key=lambda op: (-op.diff_us, op.name))
    return TraceDiff(label_a, label_b, device, chosen_a, chosen_b, tuple(ops), step_a, step_b)
