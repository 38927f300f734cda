"""Which lines of the user's code own the time inside each phase (from the record's stack samples).

Pure functions of a :class:`~stepscope.record.run.RunRecord`; no torch.

Algorithm (:func:`attribute_code`):

1. Keep the samples that fall in the chosen steps (default: the steady state of
   :func:`~stepscope.analysis.run.steady.steady_mask`). Main-thread samples carry the phase the
   training thread was in; worker samples were taken while the main thread waited for data.
2. Classify every frame once: *library* when its file lies under one of the record's
   ``library_paths`` (the stdlib, site-packages, torch, stepscope) and under none of its
   ``user_paths``, or when it is synthetic (``<frozen …>``, ``<string>``); otherwise *user*.
3. Fold: a sample's *location* is its innermost user frame — library frames below it are the
   work that line asked for, so their time is the line's. A stack without any user frame keeps its
   innermost frame, marked ``library``. A location is ``(file, line, function)``, where
   comprehensions fold into the function that holds them (:func:`function_name`). A *leaf*
   function — one that calls no other user code in the phase's samples — is one location, named at
   its hottest line, with the time of all its lines: they are all its own work, and inside a tight
   loop a sampler that runs at bytecode boundaries cannot split the time between the loop's lines
   as well as it measures the whole (BENCHMARKS.md, "Code attribution against py-spy"). The
   function that drives the loop keeps one location per line.
4. Weigh per (phase, location): each sample stands for the time of its ``weight_ns`` (a
   wall-clock sample of the training thread: the timer ticks that fired since its previous sample,
   so one sample taken when a long C call returned counts for the ticks that fell in the call;
   older records: one tick each). ``share_of_phase`` is the location's weight over the phase's; ``share_of_step`` its
   weight over all main-thread samples of the steps; ``estimated_s`` is ``share_of_phase`` × the
   phase's measured time in those steps (exact phase totals from the step table, split by the
   samples).
5. Worker samples are reported apart: shares among worker samples, and ``share_of_step`` =
   worker share × the data-wait share of the step (the part of the step the main thread waited
   while the workers ran that line).

:func:`collapse_stacks` gives one phase's folded stacks (``report --flame`` prints them) in the
collapsed-stack text that ``flamegraph.pl`` and speedscope read (``frame;frame;frame count``).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.record.run import PHASES, STACK_ROLES, RunRecord, StackSamples, is_library_path

#: Locations listed per phase.
TOP_LOCATIONS = 5
#: Flame-view pseudo-phase for the worker processes' samples (taken during data waits).
WORKERS = "workers"
_MAIN, _WORKER = STACK_ROLES.index("main"), STACK_ROLES.index("worker")
_COMPREHENSIONS = (".<listcomp>", ".<dictcomp>", ".<setcomp>", ".<genexpr>", ".<lambda>")


@dataclass(frozen=True)
class CodeLocation:
    """One source line and the share of a phase that its samples (folded) account for."""

    file: str
    line: int
    function: str
    library: bool
    samples: int
    share_of_phase: float
    share_of_step: float
    estimated_s: float | None

    @property
    def label(self) -> str:
        """``train.py:41 tokenize()`` — the short form renderers print."""
        return f"{os.path.basename(self.file)}:{self.line} {self.function}()"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


@dataclass(frozen=True)
class PhaseCode:
    """The top locations of one phase, for one process role (``main`` or ``worker``)."""

    phase: str
    role: str
    samples: int
    share_of_step: float
    locations: tuple[CodeLocation, ...]

    @property
    def top(self) -> CodeLocation | None:
        return self.locations[0] if self.locations else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "locations": [item.to_dict() for item in self.locations]}


@dataclass(frozen=True)
class CodeAttribution:
    """Per phase, the user-code lines that own its time; worker processes apart.

    ``phases`` holds the main thread's phases that have samples, in :data:`PHASES` order;
    ``workers`` the DataLoader workers' samples taken during data waits (None when there are none).
    """

    rate_hz: float
    mechanism: str
    steps: int
    samples: int
    phases: tuple[PhaseCode, ...]
    workers: PhaseCode | None
    notes: tuple[str, ...] = ()

    def phase(self, name: str) -> PhaseCode | None:
        """The main thread's locations of phase ``name`` (None when it has no samples)."""
        return next((item for item in self.phases if item.phase == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"rate_hz": self.rate_hz, "mechanism": self.mechanism, "steps": self.steps,
                "samples": self.samples, "phases": [item.to_dict() for item in self.phases],
                "workers": self.workers.to_dict() if self.workers is not None else None,
                "notes": list(self.notes)}


def library_frames(samples: StackSamples) -> np.ndarray:
    """Boolean per frame id: True where the frame is library code (see the module docstring)."""
    library, user = tuple(samples.library_paths), tuple(samples.user_paths)
    return np.array([is_library_path(frame.file, library, user) for frame in samples.frames], dtype=bool)


def function_name(qualname: str) -> str:
    """The function a location is reported under: comprehensions and generator expressions
    (their own code objects, on the line of the function that holds them) fold into it, so
    ``tokenize.<locals>.<listcomp>`` is reported as ``tokenize``."""
    while qualname.endswith(_COMPREHENSIONS):
        # f.<locals>.<listcomp> -> f; a class body's C.<genexpr> -> C
        head = qualname.rsplit(".<locals>.", 1)[0] if ".<locals>." in qualname else qualname.rsplit(".", 1)[0]
        if not head or head == qualname:
            break
        qualname = head
    return qualname


def stack_locations(samples: StackSamples, library: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per stack id: the folded location (innermost user frame id, else innermost frame) and
    whether that location is library code."""
    flags = library_frames(samples) if library is None else library
    locations = np.full(len(samples.stacks), -1, dtype=np.int64)
    is_library = np.zeros(len(samples.stacks), dtype=bool)
    for index, stack in enumerate(samples.stacks):
        user = [frame_id for frame_id in stack if not flags[frame_id]]
        if user:
            locations[index] = user[-1]
        elif stack:
            locations[index], is_library[index] = stack[-1], True
    return locations, is_library


def _location_keys(samples: StackSamples) -> list[tuple[str, int, str]]:
    """Per frame id: the reported location ``(file, line, function)``."""
    return [(frame.file, frame.line, function_name(frame.function)) for frame in samples.frames]


def _step_mask(record: RunRecord, step_mask: np.ndarray | None) -> np.ndarray:
    """The steps to use: ``step_mask``, or the steady state."""
    if step_mask is None:
        from stepscope.analysis.run.steady import steady_mask

        return steady_mask(record)
    return np.asarray(step_mask, dtype=bool)


def _selected(record: RunRecord, step_mask: np.ndarray) -> np.ndarray:
    """Boolean per sample: inside a selected step."""
    samples = record.stack_samples
    inside = samples.step >= 0
    chosen = np.zeros(len(samples), dtype=bool)
    if len(step_mask):
        chosen[inside] = step_mask[np.clip(samples.step[inside], 0, len(step_mask) - 1)]
    return chosen


def attribute_code(record: RunRecord, step_mask: np.ndarray | None = None,
                   top: int = TOP_LOCATIONS) -> CodeAttribution:
    """Top user-code locations per phase (and in worker processes) over the chosen steps.

    Args:
        record: a run record; without stack samples the result is empty, with a note.
        step_mask: boolean per step of the steps to use (default: the steady state).
        top: locations kept per phase.

    Returns:
        A :class:`CodeAttribution` (see the module docstring for the algorithm).
    """
    samples = record.stack_samples
    mask = _step_mask(record, step_mask)
    chosen = _selected(record, mask)
    steps = record.steps.select(mask) if len(record.steps) else record.steps
    if not len(samples) or not chosen.any():
        note = ("no stack samples (sampling off: --stacks-hz 0, or a record from an older stepscope)"
                if not len(samples) else "no stack samples inside the chosen steps (steps shorter than the "
                "sampling period: raise --stacks-hz)")
        return CodeAttribution(samples.rate_hz, samples.mechanism, len(steps), 0, (), None, (note,))
    locations, is_library = stack_locations(samples)
    weights = samples.weights()
    main = chosen & (samples.role == _MAIN)
    total_main = float(weights[main].sum())
    step_total = float(steps.duration_ns.sum())
    phases = []
    for phase_index, phase in enumerate(PHASES):
        selected = main & (samples.phase == phase_index)
        if not selected.any():
            continue
        phase_s = float(steps.phase(phase).sum()) / 1e9 if len(steps) else None
        phases.append(_phase_code(samples, phase, "main", selected, locations, is_library, weights,
                                  total_main, 1.0, phase_s, top))
    workers = None
    worker_rows = chosen & (samples.role == _WORKER)
    if worker_rows.any():
        wait_share = float(steps.data_wait_ns.sum()) / step_total if step_total > 0 else 0.0
        workers = _phase_code(samples, "data_wait", "worker", worker_rows, locations, is_library, weights,
                              float(weights[worker_rows].sum()), wait_share, None, top)
    return CodeAttribution(samples.rate_hz, samples.mechanism, len(steps), int(chosen.sum()),
                           tuple(phases), workers)


def _phase_code(samples: StackSamples, phase: str, role: str, selected: np.ndarray, locations: np.ndarray,
                is_library: np.ndarray, weights: np.ndarray, denominator: float, scale: float,
                phase_s: float | None, top: int) -> PhaseCode:
    stack_ids = samples.stack[selected]
    selected_weights = weights[selected]
    total = float(selected_weights.sum())
    keys = _location_keys(samples)
    drivers = _drivers(samples, np.unique(stack_ids))
    weight_of: dict[tuple[str, int, str], float] = {}
    hits_of: Counter[tuple[str, int, str]] = Counter()
    library_of: dict[tuple[str, int, str], bool] = {}
    line_weight: dict[tuple[str, int, str], float] = {}
    for frame_id, library, weight in zip(locations[stack_ids].tolist(), is_library[stack_ids].tolist(),
                                         selected_weights.tolist()):
        line_key = keys[frame_id]
        line_weight[line_key] = line_weight.get(line_key, 0.0) + weight
        # a leaf function (one that calls no other user code here) is one location, named at its
        # hottest line: its lines are all its own work. The function that drives the loop keeps a
        # location per line (its lines are unrelated statements: zero_grad, the loss, a log call).
        key = line_key if library or (line_key[0], line_key[2]) in drivers else (line_key[0], -1, line_key[2])
        weight_of[key] = weight_of.get(key, 0.0) + weight
        hits_of[key] += 1
        library_of[key] = bool(library)
    hottest: dict[tuple[str, int, str], int] = {}
    for (file, line, function), weight in sorted(line_weight.items(), key=lambda item: -item[1]):
        hottest.setdefault((file, -1, function), line)
    items = []
    for key, weight in sorted(weight_of.items(), key=lambda item: (-item[1], item[0]))[:top]:
        share = weight / total if total > 0 else 0.0
        items.append(CodeLocation(
            file=key[0], line=hottest.get(key, key[1]), function=key[2], library=library_of[key],
            samples=hits_of[key], share_of_phase=share,
            share_of_step=(weight / denominator) * scale if role == "main" and denominator > 0 else share * scale,
            estimated_s=share * phase_s if phase_s is not None else None))
    return PhaseCode(phase=phase, role=role, samples=len(stack_ids),
                     share_of_step=(total / denominator * scale if denominator > 0 else 0.0) if role == "main"
                     else scale,
                     locations=tuple(items))


def _drivers(samples: StackSamples, stack_ids: np.ndarray) -> set[tuple[str, str]]:
    """``(file, function)`` of user frames that call other user code in these stacks."""
    flags = library_frames(samples)
    keys = _location_keys(samples)
    drivers: set[tuple[str, str]] = set()
    for stack_id in stack_ids.tolist():
        user = [frame_id for frame_id in samples.stacks[stack_id] if not flags[frame_id]]
        for frame_id in user[:-1]:
            drivers.add((keys[frame_id][0], keys[frame_id][2]))
    return drivers


# -- flame view ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FoldedStack:
    """One distinct folded stack (outermost frame first) and how many samples had it."""

    frames: tuple[str, ...]
    samples: int


def collapse_stacks(record: RunRecord, phase: str, step_mask: np.ndarray | None = None,
                    keep_library: bool = False) -> tuple[FoldedStack, ...]:
    """The folded stacks of one phase, most samples first.

    Args:
        record: a run record.
        phase: one of :data:`PHASES` (main thread), or :data:`WORKERS` (worker processes during
            data waits).
        step_mask: the steps to use (default: the steady state).
        keep_library: keep library frames instead of folding them into their user caller.

    Raises:
        ValueError: unknown phase (the message lists the known ones).
    """
    if phase not in (*PHASES, WORKERS):
        raise ValueError(f"unknown phase {phase!r}; choose one of: {', '.join((*PHASES, WORKERS))}")
    samples = record.stack_samples
    if not len(samples):
        return ()
    chosen = _selected(record, _step_mask(record, step_mask))
    if phase == WORKERS:
        chosen &= samples.role == _WORKER
    else:
        chosen &= (samples.role == _MAIN) & (samples.phase == PHASES.index(phase))
    flags = library_frames(samples)
    names = [_frame_text(frame) for frame in samples.frames]
    # counts in ticks of the sampling rate: a sample that stands for several ticks counts for them
    tick = 1e9 / samples.rate_hz if samples.rate_hz else 1.0
    ticks: dict[int, float] = {}
    for stack_id, weight in zip(samples.stack[chosen].tolist(), samples.weights()[chosen].tolist()):
        ticks[stack_id] = ticks.get(stack_id, 0.0) + weight / tick
    folded: Counter[tuple[str, ...]] = Counter()
    for stack_id, hits in ticks.items():
        stack = samples.stacks[stack_id]
        kept = stack if keep_library else tuple(frame_id for frame_id in stack if not flags[frame_id])
        if not kept and stack:
            kept = (stack[-1],)
        folded[tuple(names[frame_id] for frame_id in kept)] += max(1, round(hits))
    return tuple(FoldedStack(frames, hits) for frames, hits in
                 sorted(folded.items(), key=lambda item: (-item[1], item[0])))


def _frame_text(frame: Any) -> str:
    text = f"{frame.function} ({os.path.basename(frame.file)}:{frame.line})"
    return text.replace(";", ":")


__all__ = ["CodeAttribution", "CodeLocation", "FoldedStack", "PhaseCode", "TOP_LOCATIONS", "WORKERS",
           "attribute_code", "collapse_stacks", "function_name", "library_frames",
           "stack_locations"]
