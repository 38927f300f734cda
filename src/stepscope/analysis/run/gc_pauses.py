"""Garbage-collector pauses over the steady state: how much of the step time the collector takes.

Pure function of a :class:`~stepscope.record.run.RunRecord` (its ``gc_pauses``); no torch.

Algorithm (:func:`summarize_gc_pauses`): keep the pauses that began inside a chosen step (default:
the steady state); ``share_of_step_time`` is their summed duration over the summed duration of
those steps (a pause stops every Python thread, so its whole duration is lost to the step it hit);
``pauses_per_step`` is their count over the number of steps; counts, totals and maxima are split by
generation (0, 1, 2) and the time by the phase each pause interrupted; ``largest`` is the longest.
Pauses are an overlay: their time is already inside the phase they interrupted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.record.run import PHASES, RunRecord


@dataclass(frozen=True)
class GcPause:
    """One collection."""

    start_ns: int
    duration_s: float
    generation: int
    collected: int
    uncollectable: int
    step: int
    phase: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GcGeneration:
    """Collections of one generation in the chosen steps."""

    generation: int
    count: int
    total_s: float
    max_s: float
    collected: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GcPauseSummary:
    """GC pauses in the chosen steps. ``measured`` is False when the record has no GC data
    (then every number is zero and ``share_of_step_time`` is None, never read it as "no pauses")."""

    measured: bool
    steps: int
    count: int
    total_s: float
    share_of_step_time: float | None
    pauses_per_step: float | None
    by_generation: tuple[GcGeneration, ...]
    by_phase_s: dict[str, float]
    largest: GcPause | None
    collected: int
    uncollectable: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "by_generation": [item.to_dict() for item in self.by_generation],
                "largest": self.largest.to_dict() if self.largest is not None else None}


def summarize_gc_pauses(record: RunRecord, step_mask: np.ndarray | None = None) -> GcPauseSummary:
    """Summarize the record's GC pauses over the chosen steps (see the module docstring).

    Args:
        record: a run record.
        step_mask: boolean per step of the steps to use (default: the steady state).
    """
    pauses = record.gc_pauses
    if step_mask is None:
        from stepscope.analysis.run.steady import steady_mask

        step_mask = steady_mask(record)
    step_mask = np.asarray(step_mask, dtype=bool)
    steps = int(step_mask.sum())
    if not pauses.enabled:
        return GcPauseSummary(False, steps, 0, 0.0, None, None, (), {}, None, 0, 0)
    inside = pauses.step >= 0
    chosen = np.zeros(len(pauses), dtype=bool)
    if len(step_mask):
        chosen[inside] = step_mask[np.clip(pauses.step[inside], 0, len(step_mask) - 1)]
    durations = pauses.duration_ns[chosen]
    step_ns = float(record.steps.duration_ns[step_mask].sum()) if steps else 0.0
    total_ns = float(durations.sum())
    generations = pauses.generation[chosen]
    by_generation = tuple(
        GcGeneration(generation=int(gen), count=int((generations == gen).sum()),
                     total_s=float(durations[generations == gen].sum()) / 1e9,
                     max_s=float(durations[generations == gen].max()) / 1e9,
                     collected=int(pauses.collected[chosen][generations == gen].sum()))
        for gen in sorted(set(generations.tolist())))
    phases = pauses.phase[chosen]
    by_phase = {name: float(durations[phases == index].sum()) / 1e9 for index, name in enumerate(PHASES)
                if (phases == index).any()}
    return GcPauseSummary(
        measured=True, steps=steps, count=int(chosen.sum()), total_s=total_ns / 1e9,
        share_of_step_time=total_ns / step_ns if step_ns > 0 else None,
        pauses_per_step=int(chosen.sum()) / steps if steps else None,
        by_generation=by_generation, by_phase_s=by_phase, largest=_largest(record, chosen),
        collected=int(pauses.collected[chosen].sum()), uncollectable=int(pauses.uncollectable[chosen].sum()))


def _largest(record: RunRecord, chosen: np.ndarray) -> GcPause | None:
    pauses = record.gc_pauses
    rows = np.flatnonzero(chosen)
    if not len(rows):
        return None
    row = int(rows[np.argmax(pauses.duration_ns[rows])])
    phase = int(pauses.phase[row])
    return GcPause(start_ns=int(pauses.start_ns[row]), duration_s=int(pauses.duration_ns[row]) / 1e9,
                   generation=int(pauses.generation[row]), collected=int(pauses.collected[row]),
                   uncollectable=int(pauses.uncollectable[row]), step=int(pauses.step[row]),
                   phase=PHASES[phase] if 0 <= phase < len(PHASES) else None)


__all__ = ["GcGeneration", "GcPause", "GcPauseSummary", "summarize_gc_pauses"]
