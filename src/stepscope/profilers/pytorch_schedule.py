"""Step schedules for `PyTorchProfiler`, and the module-name recorder.

Contract:
- A *step action* ends a profiler step: an action named ``step`` (what ``stepscope run`` and
  plain loops use), or one ending in ``training_step``, ``validation_step``, ``test_step`` or
  ``predict_step`` (Lightning's Trainer). Each ``stop`` of a step action advances the schedule.
- :class:`StageSchedule` wraps the user's schedule (``torch.profiler.schedule(...)`` or any
  callable ``step -> ProfilerAction``) and keeps one step counter per stage (train — which the
  plain ``step`` action also counts —, validation, test, predict), ignoring torch's own number,
  as Lightning does; step k of a stage runs under ``schedule(k)`` (when profiling starts with a
  step action, as in plain loops, that first step is step 0). Validation steps do not count during Lightning's sanity check (profiling
  began in ``on_fit_start`` and no training step ran yet). A WARMUP right after a RECORD becomes
  RECORD (validation interleaved inside a training window).
- Deliberate change from Lightning: a stage is *not* frozen after its first RECORD_AND_SAVE, so a
  user schedule's ``repeat`` (and ``repeat=0``: forever) is honoured (Lightning issue #14063).
  The default schedule is :data:`DEFAULT_SCHEDULE` (wait=1, warmup=1, active=3, repeat=1): one
  cycle per stage, which is what Lightning's default records.
- :class:`ModuleNameRecorder` labels each named submodule's forward with
  ``[pl][module]<type module>.<type name>: <dotted name>`` (Lightning's label, so tools that know
  it keep working); it works on any ``nn.Module``, inside Lightning or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch.profiler import ProfilerAction

__all__ = [
    "CycleSchedule",
    "DEFAULT_SCHEDULE",
    "StageSchedule",
    "ModuleNameRecorder",
    "RegisterRecordFunction",
    "stage_of",
    "STEP_SUFFIXES",
]

#: Action-name suffix -> stage counter; the plain action ``step`` counts as training.
STEP_SUFFIXES: dict[str, str] = {
    "training_step": "train",
    "validation_step": "validate",
    "test_step": "test",
    "predict_step": "predict",
}
PLAIN_STEP_ACTION = "step"


def stage_of(action_name: str) -> str | None:
    """The stage whose counter ``action_name`` advances, or None if it is not a step action."""
    if action_name == PLAIN_STEP_ACTION:
        return "train"
    for suffix, stage in STEP_SUFFIXES.items():
        if action_name.endswith(suffix):
            return stage
    return None


@dataclass(frozen=True)
class CycleSchedule:
    """``torch.profiler.schedule`` semantics, as a picklable, comparable value."""

    wait: int
    warmup: int
    active: int
    repeat: int = 0
    skip_first: int = 0
    _fn: Callable[[int], ProfilerAction] | None = field(default=None, compare=False, repr=False)

    def __call__(self, step: int) -> ProfilerAction:
        fn = self._fn
        if fn is None:
            fn = torch.profiler.schedule(
                wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat, skip_first=self.skip_first
            )
            object.__setattr__(self, "_fn", fn)
        return fn(step)

    def __getstate__(self) -> dict[str, Any]:
        return {"wait": self.wait, "warmup": self.warmup, "active": self.active, "repeat": self.repeat, "skip_first": self.skip_first}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)
        object.__setattr__(self, "_fn", None)


#: Lightning's default (wait=1, warmup=1, active=3), one cycle per stage.
DEFAULT_SCHEDULE = CycleSchedule(wait=1, warmup=1, active=3, repeat=1)


def record_every_step(step: int) -> ProfilerAction:
    """The schedule used when a run is too short for the default one: always record."""
    return ProfilerAction.RECORD


class StageSchedule:
    """Per-stage step counters in front of a schedule (see the module contract)."""

    def __init__(self, schedule: Callable[[int], ProfilerAction]) -> None:
        self.schedule = schedule
        self.reset()

    def reset(self) -> None:
        self.counts = {"train": 0, "validate": 0, "test": 0, "predict": 0}
        self.current_stage: str | None = None
        self.first_action: str | None = None
        self._previous: ProfilerAction | None = None

    def setup(self, first_action: str) -> None:
        """Remember the action that started profiling (used to skip Lightning's sanity check)."""
        self.first_action = first_action

    def pre_step(self, step_action: str) -> None:
        self.current_stage = stage_of(step_action)

    @property
    def num_step(self) -> int:
        return self.counts.get(self.current_stage, 0) if self.current_stage else 0

    def _advance(self) -> None:
        stage = self.current_stage
        if stage is None:
            return
        if stage == "validate" and (self.first_action or "").endswith("on_fit_start") and self.counts["train"] == 0:
            return  # sanity-check validation before any training step
        self.counts[stage] += 1

    def __call__(self, _torch_step: int) -> ProfilerAction:
        if self.current_stage is None:
            # Before the first step ends. When profiling began with a step action (plain loops),
            # that step is step 0 of its stage; otherwise (a Trainer hook) nothing is recorded yet.
            if self.first_action is not None and stage_of(self.first_action) is not None:
                self._previous = self.schedule(0)
                return self._previous
            return ProfilerAction.NONE
        self._advance()
        action = self.schedule(max(self.num_step, 0))
        if self._previous == ProfilerAction.RECORD and action == ProfilerAction.WARMUP:
            action = ProfilerAction.RECORD
        self._previous = action
        return action


class ModuleNameRecorder:
    """Context manager labelling every named submodule's forward in profiler traces.

    Example::

        with ModuleNameRecorder(model):
            model(batch)   # ops appear under "[pl][module]torch.nn.modules.linear.Linear: 0"
    """

    PREFIX = "[pl][module]"

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._records: dict[str, list[Any]] = {}
        self._handles: list[Any] = []

    def _enter(self, record_name: str, _module: torch.nn.Module, args: Any) -> None:
        record = torch.autograd.profiler.record_function(self.PREFIX + record_name)
        record.__enter__()
        self._records.setdefault(record_name, []).append(record)

    def _exit(self, record_name: str, _module: torch.nn.Module, _args: Any, _output: Any) -> None:
        stack = self._records.get(record_name)
        if stack:
            stack.pop().__exit__(None, None, None)

    def __enter__(self) -> ModuleNameRecorder:
        for name, module in self._model.named_modules():
            if not name:
                continue
            kind = type(module)
            record_name = f"{kind.__module__}.{kind.__name__}: {name}"
            self._handles.append(module.register_forward_pre_hook(partial(self._enter, record_name)))
            self._handles.append(module.register_forward_hook(partial(self._exit, record_name)))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for stack in self._records.values():
            while stack:
                stack.pop().__exit__(None, None, None)


#: Lightning's name for the same helper.
RegisterRecordFunction = ModuleNameRecorder
