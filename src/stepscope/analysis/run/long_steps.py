"""Where a difference of the mean step comes from: the typical step, or a few long steps.

The mean steady step (what ``diff`` compares: it is what the length of training follows) moves
when every step gets longer *or* when a few steps take seconds — a recompilation in the steady
state, a checkpoint, an evaluation pass, a collection of the garbage collector. The two call for
different fixes, so ``diff`` says which:

- a step is **long** when it lasts more than :data:`~stepscope.analysis.run.stalls.STALL_FACTOR`
  times the run's median steady step and at least
  :data:`~stepscope.analysis.run.stalls.STALL_MIN_EXCESS_S` more (the periodic-stall analysis'
  own thresholds); its **excess** is its time above the median;
- each long step is named from the run's own evidence: torch.compile time inside the step (the
  compile phase, and the compilations dynamo reported in it: a *recompilation* when a guard
  failed), garbage-collector pauses timed inside it, or else the phase whose excess over its own
  median is largest (work outside forward/backward/optimizer is where checkpoints, evaluation loops
  and logging run; extra forward time is an evaluation pass), with the line of the user's code the
  stack samples of that step and phase were in most often (``at train.py:88``) when there are any;
- :func:`split_change` splits the mean's relative change into the long steps' part (the change of
  their excess per steady step, relative to A's mean) and the rest (the typical step).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from stepscope.analysis.run.stalls import STALL_FACTOR, STALL_MIN_EXCESS_S
from stepscope.record.run import PHASES, RunRecord, StackSamples

#: A long step is named by a cause when that cause holds at least this share of its excess.
CAUSE_SHARE = 0.5
#: The long steps "make" the mean's change when their part is at least this share of it.
TAIL_SHARE = 0.5

#: What a long step's excess in a phase is, in the user's words.
PHASE_CAUSE = {
    "data_wait": "waiting for data",
    "forward": "extra forward time (an evaluation pass)",
    "backward": "backward",
    "optimizer": "optimizer",
    "communication": "collectives (waiting for other ranks)",
    "other": "work outside the model (a checkpoint, evaluation or logging)",
}
COMPILE, RECOMPILE, GC = "torch.compile", "torch.compile recompilation", "garbage-collector pauses"


@dataclass(frozen=True)
class LongSteps:
    """The long steps of one run's steady state."""

    steady: int  # steady steps
    median_s: float  # the median steady step
    count: int  # long steps among them
    excess_s: float  # their time above the median, summed
    mean_s: float | None  # their mean duration
    #: (cause, long steps, their excess in seconds), the costliest first: a few checkpoints of
    #: 0.4 s outweigh many steps a millisecond late
    causes: tuple[tuple[str, int, float], ...]
    steps: tuple[int, ...] = ()  # their indexes in the run (the first 20)

    @property
    def excess_per_step_s(self) -> float:
        return self.excess_s / self.steady if self.steady else 0.0


def long_steps(record: RunRecord, mask: np.ndarray) -> LongSteps | None:
    """The long steps of ``record`` among its steady steps ``mask``; None without steady steps."""
    steps = record.steps
    index = np.flatnonzero(mask)
    if not len(index):
        return None
    duration = steps.duration_ns[index].astype(np.float64) / 1e9
    median = float(np.median(duration))
    long = (duration > STALL_FACTOR * median) & (duration - median >= STALL_MIN_EXCESS_S)
    chosen = index[long]
    if not len(chosen):
        return LongSteps(len(index), median, 0, 0.0, None, ())
    phase_medians = {phase: float(np.median(steps.phase(phase)[index])) / 1e9 for phase in PHASES}
    gc = _gc_per_step(record)
    compiles = _compile_starts(record)
    lines = _sampled_lines(record.stack_samples, chosen)
    counts: Counter[str] = Counter()
    costs: dict[str, float] = {}
    excess = duration[long] - median
    for position, extra in zip(chosen, excess):
        cause = _cause(record, int(position), median, phase_medians, gc, compiles, lines)
        counts[cause] += 1
        costs[cause] = costs.get(cause, 0.0) + float(extra)
    causes = tuple(sorted(((cause, counts[cause], costs[cause]) for cause in counts), key=lambda item: -item[2]))
    return LongSteps(len(index), median, int(len(chosen)), float(excess.sum()), float(duration[long].mean()),
                     causes, tuple(int(item) for item in chosen[:20]))


def _gc_per_step(record: RunRecord) -> np.ndarray | None:
    pauses = record.gc_pauses
    if not pauses.enabled:
        return None
    per_step = np.zeros(len(record.steps), dtype=np.float64)
    inside = (pauses.step >= 0) & (pauses.step < len(record.steps))
    np.add.at(per_step, pauses.step[inside], pauses.duration_ns[inside].astype(np.float64))
    return per_step / 1e9


def _compile_starts(record: RunRecord) -> list[tuple[int, bool]]:
    """(start, recompilation?) of every compilation capture saw with a known start."""
    facts = record.facts.compile
    if facts is None:
        return []
    return [(item.start_ns, bool(item.trigger)) for item in facts.compilations if item.start_ns >= 0]


def _sampled_lines(samples: StackSamples, chosen: np.ndarray) -> dict[tuple[int, int], str]:
    """``(step, phase index) -> "file.py:line"``: where the training thread's stack samples inside
    each chosen step and phase were most often (the innermost frame of the user's code)."""
    if not len(samples.ts_ns) or not len(chosen):
        return {}
    from collections import defaultdict
    from pathlib import PurePath

    from stepscope.analysis.run.code_locations import stack_locations

    inside = np.isin(samples.step, chosen) & (samples.role == 0) & (samples.stack >= 0)
    if not inside.any():
        return {}
    locations, _ = stack_locations(samples)
    seen: dict[tuple[int, int], Counter[int]] = defaultdict(Counter)
    for step, phase, stack in zip(samples.step[inside], samples.phase[inside], samples.stack[inside]):
        frame_id = int(locations[int(stack)]) if int(stack) < len(locations) else -1
        if frame_id >= 0:
            seen[(int(step), int(phase))][frame_id] += 1
    out = {}
    for key, counts in seen.items():
        frame = samples.frames[counts.most_common(1)[0][0]]
        out[key] = f"{PurePath(frame.file).name}:{frame.line}"
    return out


def _cause(record: RunRecord, position: int, median_s: float, phase_medians: dict[str, float],
           gc: np.ndarray | None, compiles: list[tuple[int, bool]], lines: dict[tuple[int, int], str]) -> str:
    steps = record.steps
    excess = float(steps.duration_ns[position]) / 1e9 - median_s
    start, end = int(steps.start_ns[position]), int(steps.start_ns[position] + steps.duration_ns[position])
    inside = [recompile for at, recompile in compiles if start <= at < end]
    compile_s = float(steps.phase("compile")[position]) / 1e9
    if inside or compile_s >= CAUSE_SHARE * excess > 0:
        return RECOMPILE if any(inside) else COMPILE
    if gc is not None and gc[position] >= CAUSE_SHARE * excess:
        return GC
    over = {phase: float(steps.phase(phase)[position]) / 1e9 - phase_medians[phase]
            for phase in PHASES if phase != "compile"}
    phase = max(over, key=lambda name: over[name])
    if over[phase] <= 0:
        return "no single phase (the whole step was slower)"
    where = lines.get((position, PHASES.index(phase)))
    return f"{PHASE_CAUSE.get(phase, phase)} at {where}" if where else PHASE_CAUSE.get(phase, phase)


def split_change(mean_a: float | None, long_a: LongSteps | None, long_b: LongSteps | None) -> float | None:
    """The part of the mean's relative change (B/A − 1) the long steps make: the change of their
    excess per steady step, over A's mean. None when it cannot be said."""
    if not mean_a or long_a is None or long_b is None:
        return None
    return (long_b.excess_per_step_s - long_a.excess_per_step_s) / mean_a
