"""`PyTorchProfiler`: torch.profiler operator tables and Chrome traces per step window.

Contract:
- Constructor arguments and defaults are Lightning's; every argument is validated in the
  constructor (see :mod:`stepscope.profilers.pytorch_config`). Unknown ``**profiler_kwargs`` are
  rejected with the list of accepted ones (Lightning drops them silently, issue #12656).
- The first ``start`` creates and enters one ``torch.profiler.profile`` (default activities: CPU,
  plus CUDA when available; an already enabled autograd profiler is stopped with a warning).
  Every action is labelled ``[pl][profile]<action>``; inside Lightning's Trainer (or after
  :meth:`PyTorchProfiler.watch_module`) every named submodule is labelled ``[pl][module]...``.
- Each ``stop`` of a step action (``step``, or ``*training_step``/``*validation_step``/
  ``*test_step``/``*predict_step``) advances the schedule: ``profiler.step()`` with per-stage
  counters (:class:`~stepscope.profilers.pytorch_schedule.StageSchedule`). With the default
  schedule and a Lightning stage of fewer than 5 steps, the schedule is replaced by "record every
  step" with one warning ("…default schedule will be overridden as there is not enough steps…").
- When a window completes, its Chrome trace goes to ``dirpath/<worker>.<time_ns>.pt.trace.json``
  (worker = ``<stage>-<filename>-<rank>-<step action>``), plus a ``.stack`` flame graph with
  ``export_to_flame_graph=True``; with no dirpath, one warning says no trace was written.
- ``summary()`` ends profiling and renders ``key_averages(...).table(...)`` as
  "Profile stats for: records[ rank: N]". When the schedule recorded nothing (a run shorter than
  its warm-up) the summary says so instead of being empty.
- With ``emit_nvtx=True`` the autograd profiler emits NVTX ranges for Nsight Systems (needs CUDA,
  checked at construction); there is no table then.
- Pickles and deep-copies at any time: the live profiler, open labels and hooks are not copied.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from stepscope.profilers.profiler import Profiler
from stepscope.profilers.pytorch_config import PyTorchProfilerConfig, resolve_config
from stepscope.profilers.pytorch_schedule import (
    DEFAULT_SCHEDULE,
    ModuleNameRecorder,
    StageSchedule,
    record_every_step,
    stage_of,
)

__all__ = ["PyTorchProfiler"]

SHORT_RUN_WARNING = (
    "The PyTorch Profiler default schedule will be overridden as there is not enough steps to properly"
    " record traces (fewer than 5 in this stage): every step is recorded instead."
)
PROFILE_PREFIX = "[pl][profile]"


class PyTorchProfiler(Profiler):
    """torch.profiler per step window, with Lightning's arguments (see the module contract)."""

    STEP_FUNCTIONS = {"training_step", "validation_step", "test_step", "predict_step"}
    _transient_state = ("profiler", "function_events", "_register", "_parent_profiler", "_recording_map", "_watched")

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        group_by_input_shapes: bool = False,
        emit_nvtx: bool = False,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: str | None = None,
        record_module_names: bool = True,
        table_kwargs: dict[str, Any] | None = None,
        **profiler_kwargs: Any,
    ) -> None:
        self.config: PyTorchProfilerConfig = resolve_config(
            group_by_input_shapes=group_by_input_shapes,
            emit_nvtx=emit_nvtx,
            export_to_chrome=export_to_chrome,
            row_limit=row_limit,
            sort_by_key=sort_by_key,
            record_module_names=record_module_names,
            table_kwargs=table_kwargs,
            profiler_kwargs=profiler_kwargs,
        )
        schedule = self.config.schedule
        self._schedule: StageSchedule | None = StageSchedule(schedule) if schedule is not None else None
        self._warned: set[str] = set()
        super().__init__(dirpath=dirpath, filename=filename)
        self._restore_transient_state()

    def _restore_transient_state(self) -> None:
        self.profiler: Any = None
        self.function_events: Any = None
        self._register: ModuleNameRecorder | None = None
        self._parent_profiler: Any = None
        self._recording_map: dict[str, Any] = {}
        self._watched: torch.nn.Module | None = None  # a copy does not drag the model along

    def watch_module(self, module: torch.nn.Module) -> None:
        """Label ``module``'s named submodules in traces (the Trainer does this for its model)."""
        self._watched = module

    # -- recording -----------------------------------------------------------------------------
    def start(self, action_name: str) -> None:
        if self.profiler is None:
            self._start_profiler(action_name)
        module = self._lightning_module if self._lightning_module is not None else self._watched
        if module is not None and self._register is None and self.config.record_module_names:
            self._register = ModuleNameRecorder(module).__enter__()
        if action_name not in self._recording_map:
            record = torch.autograd.profiler.record_function(PROFILE_PREFIX + action_name)
            record.__enter__()
            self._recording_map[action_name] = record

    def _start_profiler(self, action_name: str) -> None:
        if torch.autograd._profiler_enabled():
            self._warn_once("foreign", "PyTorchProfiler: another torch profiler was running; it has been stopped.")
            torch.autograd._disable_profiler()
        if self._schedule is not None:
            self._schedule.setup(action_name)
        if self.config.emit_nvtx:
            self._parent_profiler = torch.cuda.profiler.profile()
            self._parent_profiler.__enter__()
            self.profiler = torch.autograd.profiler.emit_nvtx(record_shapes=self.config.record_shapes)
            self.profiler.__enter__()
            return
        kwargs = dict(self.config.torch_kwargs)
        kwargs["schedule"] = self._schedule
        if self.config.has_on_trace_ready:
            kwargs["on_trace_ready"] = self._user_trace_handler(kwargs["on_trace_ready"])
        profiler = torch.profiler.profile(**kwargs)
        self.profiler = profiler.__enter__() or profiler

    def stop(self, action_name: str) -> None:
        record = self._recording_map.pop(action_name, None)
        if record is not None:
            record.__exit__(None, None, None)
        if self.profiler is None or self.config.emit_nvtx or stage_of(action_name) is None:
            return
        self._step(action_name)

    def _step(self, step_action: str) -> None:
        schedule = self._schedule
        if schedule is not None:
            schedule.pre_step(step_action)
            if self._should_override_schedule():
                self._warn_once("short", SHORT_RUN_WARNING, UserWarning)
                self._schedule = None
                self.profiler.schedule = record_every_step
        if not self.config.has_on_trace_ready:
            self.profiler.on_trace_ready = self._trace_handler(step_action)
        if self._schedule is not None:
            self.profiler.step_num = self._schedule.num_step
        self.profiler.step()
        framework = "pytorch-lightning" if self._lightning_module is not None else "stepscope"
        self.profiler.add_metadata("Framework", framework)

    def _should_override_schedule(self) -> bool:
        if self._lightning_module is None or self._schedule is None or self._schedule.schedule != DEFAULT_SCHEDULE:
            return False
        try:
            trainer = self._lightning_module.trainer
        except (RuntimeError, ReferenceError):  # module not attached (any more)
            return False
        steps = _stage_total_steps(trainer, self._schedule.current_stage)
        return steps is not None and steps < 5

    def _remember_events(self, profiler: Any) -> None:
        # torch drops a window's events once the schedule moves on: keep the last window's.
        self.function_events = profiler.events()

    def _user_trace_handler(self, handler: Any):
        def on_trace_ready(profiler: Any) -> None:
            handler(profiler)
            self._remember_events(profiler)

        return on_trace_ready

    def _trace_handler(self, step_action: str):
        def on_trace_ready(profiler: Any) -> None:
            self._remember_events(profiler)
            if self.dirpath is None:
                self._warn_once("dirpath", "PyTorchProfiler: no trace was exported because dirpath is None; pass dirpath=.")
                return
            if self.config.export_to_chrome:
                worker = self._prepare_filename(action_name=step_action, extension="")
                torch.profiler.tensorboard_trace_handler(str(self.dirpath), worker)(profiler)
            if self.config.export_to_flame_graph:
                path = os.path.join(self.dirpath, self._prepare_filename(action_name=step_action, extension=".stack"))
                profiler.export_stacks(path, metric=self.config.metric)

        return on_trace_ready

    # -- report --------------------------------------------------------------------------------
    def summary(self) -> str:
        if not self.config.enabled or self.config.emit_nvtx:
            self._delete_profilers()
            return ""
        self._delete_profilers()
        if not self.function_events:
            return self._stats_to_str({"records": self._nothing_recorded_note()})
        averages = self.function_events.key_averages(group_by_input_shapes=self.config.group_by_input_shapes)
        table = averages.table(sort_by=self.config.sort_by_key, row_limit=self.config.row_limit, **self.config.table_kwargs)
        return self._stats_to_str({"records": table})

    def _nothing_recorded_note(self) -> str:
        return (
            "No operator was recorded: the run ended before the schedule's first recording window"
            f" ({self.config.schedule_description}). Run more steps, or pass schedule=None to record every step."
        )

    def _delete_profilers(self) -> None:
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            if not self.config.emit_nvtx and self.profiler.profiler is not None:
                events = self.profiler.events()
                if events:  # an unfinished window with records; else keep the last finished one
                    self.function_events = events
            self.profiler = None
        if self._schedule is not None:
            self._schedule.reset()
        if self._parent_profiler is not None:
            self._parent_profiler.__exit__(None, None, None)
            self._parent_profiler = None
        if self._register is not None:
            self._register.__exit__(None, None, None)
            self._register = None

    def teardown(self, stage: str | None) -> None:
        self._delete_profilers()
        for record in self._recording_map.values():
            record.__exit__(None, None, None)
        self._recording_map = {}
        super().teardown(stage=stage)

    def _warn_once(self, key: str, message: str, category: type[Warning] = RuntimeWarning) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, category, stacklevel=4)


def _stage_total_steps(trainer: Any, stage: str | None) -> float | None:
    """Batches in the current Lightning stage (sanity-check batches count for validation)."""

    def total(value: Any) -> float:  # may be inf (iterable datasets)
        return float(sum(value)) if isinstance(value, (list, tuple)) else float(value)

    if stage == "train":
        return total(trainer.num_training_batches)
    if stage == "validate":
        return total(trainer.num_val_batches) + total(trainer.num_sanity_val_batches)
    if stage == "test":
        return total(trainer.num_test_batches)
    if stage == "predict":
        return total(trainer.num_predict_batches)
    return None
