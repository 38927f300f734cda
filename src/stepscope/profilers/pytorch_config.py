"""Validation and resolution of `PyTorchProfiler`'s arguments (pure; no profiling here).

Contract: :func:`resolve_config` checks every argument and returns a frozen
:class:`PyTorchProfilerConfig`, or raises with a message listing the allowed values:
- ``ProfilerConfigError`` (a ``UsageError`` and ``ValueError``; also Lightning's
  ``MisconfigurationException`` when Lightning is loaded) for a non-callable schedule, a schedule
  that does not return a ``ProfilerAction``, an unknown ``sort_by_key``, unknown
  ``profiler_kwargs`` (Lightning drops those silently), ``group_by_input_shapes`` without
  ``record_shapes=True`` (Lightning ignores it silently), ``emit_nvtx`` without CUDA, and
  arguments of the wrong type.
- ``ProfilerKeyError`` (a ``KeyError``) for ``table_kwargs`` keys, with Lightning's messages.
Defaults as in Lightning: schedule wait=1/warmup=1/active=3 (one cycle per stage), activities
CPU plus CUDA when available, sort key ``cuda_time_total``-like when CUDA is profiled, else
``cpu_time_total``. ``schedule=None`` explicitly means "record every step".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.profiler_util import EventList
from torch.profiler import ProfilerAction, ProfilerActivity

from stepscope.profilers._config import ProfilerKeyError, allowed, config_error
from stepscope.profilers.pytorch_schedule import DEFAULT_SCHEDULE, CycleSchedule

__all__ = ["PyTorchProfilerConfig", "resolve_config", "AVAILABLE_SORT_KEYS", "EXTRA_PROFILER_KWARGS"]

#: Lightning's sort keys, plus the self-time and device-time keys torch's table also sorts by.
AVAILABLE_SORT_KEYS = frozenset(
    {
        "cpu_time", "cuda_time", "cpu_time_total", "cuda_time_total", "cpu_memory_usage",
        "cuda_memory_usage", "self_cpu_memory_usage", "self_cuda_memory_usage", "count",
        "self_cpu_time_total", "self_cuda_time_total", "device_time", "device_time_total",
        "self_device_time_total", "device_memory_usage", "self_device_memory_usage",
    }
)  # fmt: skip
#: Keyword arguments consumed by the profiler itself rather than torch.profiler.profile.
EXTRA_PROFILER_KWARGS = frozenset({"export_to_flame_graph", "metric"})
_FLAME_GRAPH_METRICS = frozenset({"self_cpu_time_total", "self_cuda_time_total"})
_SCHEDULE_WORDS = frozenset({"wait", "warmup", "active", "repeat", "skip_first"})


@dataclass(frozen=True)
class PyTorchProfilerConfig:
    group_by_input_shapes: bool
    emit_nvtx: bool
    export_to_chrome: bool
    row_limit: int
    sort_by_key: str
    record_module_names: bool
    table_kwargs: Mapping[str, Any]
    torch_kwargs: Mapping[str, Any]  # for torch.profiler.profile, schedule excluded
    schedule: Callable[[int], ProfilerAction] | None
    has_on_trace_ready: bool
    export_to_flame_graph: bool
    metric: str
    record_shapes: bool
    enabled: bool = True

    @property
    def schedule_description(self) -> str:
        schedule = self.schedule
        if isinstance(schedule, CycleSchedule):
            return f"wait={schedule.wait}, warmup={schedule.warmup}, active={schedule.active}"
        return "no schedule" if schedule is None else f"schedule {schedule!r}"


def torch_profile_parameters() -> frozenset[str]:
    """Keyword arguments that this torch's ``torch.profiler.profile`` accepts."""
    parameters = inspect.signature(torch.profiler.profile.__init__).parameters
    return frozenset(name for name, p in parameters.items() if name != "self" and p.kind is not p.VAR_KEYWORD)


def table_parameters() -> frozenset[str]:
    return frozenset(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}


def resolve_config(
    *,
    group_by_input_shapes: bool,
    emit_nvtx: bool,
    export_to_chrome: bool,
    row_limit: int,
    sort_by_key: str | None,
    record_module_names: bool,
    table_kwargs: Mapping[str, Any] | None,
    profiler_kwargs: dict[str, Any],
) -> PyTorchProfilerConfig:
    """Validate the arguments of ``PyTorchProfiler(...)`` (see the module contract)."""
    flags = dict(group_by_input_shapes=group_by_input_shapes, emit_nvtx=emit_nvtx,
                 export_to_chrome=export_to_chrome, record_module_names=record_module_names)  # fmt: skip
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise config_error(f"PyTorchProfiler: {name} must be True or False, got {value!r}.")
    if isinstance(row_limit, bool) or not isinstance(row_limit, int) or row_limit < -1:
        raise config_error(f"PyTorchProfiler: row_limit must be an int >= 1, or -1 for no limit, got {row_limit!r}.")
    _check_profiler_kwargs(profiler_kwargs)
    schedule = _resolve_schedule(profiler_kwargs)
    torch_kwargs = {k: v for k, v in profiler_kwargs.items() if k not in EXTRA_PROFILER_KWARGS and k != "schedule"}
    if not torch_kwargs.get("activities"):
        torch_kwargs["activities"] = _default_activities()
    flame = profiler_kwargs.get("export_to_flame_graph", False)
    metric = profiler_kwargs.get("metric", "self_cpu_time_total")
    if not isinstance(flame, bool):
        raise config_error(f"PyTorchProfiler: export_to_flame_graph must be True or False, got {flame!r}.")
    if metric not in _FLAME_GRAPH_METRICS:
        raise config_error(f"PyTorchProfiler: metric must be one of {allowed(_FLAME_GRAPH_METRICS)}, got {metric!r}.")
    torch_kwargs["with_stack"] = bool(torch_kwargs.get("with_stack", False) or flame)
    record_shapes = bool(profiler_kwargs.get("record_shapes", False))
    if group_by_input_shapes and not record_shapes:
        raise config_error(
            "PyTorchProfiler: group_by_input_shapes=True needs record_shapes=True (shapes are only known when recorded)."
        )
    if emit_nvtx and not torch.cuda.is_available():
        raise config_error("PyTorchProfiler: emit_nvtx=True needs a CUDA device (NVTX ranges are read by Nsight Systems).")
    sort_key = sort_by_key or _default_sort_key(torch_kwargs)
    if sort_key not in AVAILABLE_SORT_KEYS:
        raise config_error(f"Found sort_by_key: {sort_key}. Should be within {allowed(AVAILABLE_SORT_KEYS)}.")
    return PyTorchProfilerConfig(
        group_by_input_shapes=group_by_input_shapes,
        emit_nvtx=emit_nvtx,
        export_to_chrome=export_to_chrome,
        row_limit=row_limit,
        sort_by_key=sort_key,
        record_module_names=record_module_names,
        table_kwargs=_check_table_kwargs(table_kwargs),
        torch_kwargs=torch_kwargs,
        schedule=schedule,
        has_on_trace_ready="on_trace_ready" in profiler_kwargs,
        export_to_flame_graph=flame,
        metric=metric,
        record_shapes=record_shapes,
    )


def _check_profiler_kwargs(profiler_kwargs: Mapping[str, Any]) -> None:
    accepted = torch_profile_parameters() | EXTRA_PROFILER_KWARGS
    unknown = sorted(set(profiler_kwargs) - accepted)
    if not unknown:
        return
    message = (
        f"PyTorchProfiler got unknown keyword argument(s) {allowed(unknown)}. Accepted: the profiler's own"
        f" arguments and {allowed(accepted)} (torch {torch.__version__})."
    )
    if _SCHEDULE_WORDS & set(unknown):
        message += " To change the schedule pass schedule=torch.profiler.schedule(wait=..., warmup=..., active=..., repeat=...)."
    raise config_error(message)


def _resolve_schedule(profiler_kwargs: Mapping[str, Any]) -> Callable[[int], ProfilerAction] | None:
    if "schedule" not in profiler_kwargs:
        return DEFAULT_SCHEDULE
    schedule = profiler_kwargs["schedule"]
    if schedule is None:
        return None
    if not callable(schedule):
        raise config_error(f"Schedule should be a callable. Found: {schedule}")
    action = schedule(0)
    if not isinstance(action, ProfilerAction):
        raise config_error(f"Schedule should return a `torch.profiler.ProfilerAction`. Found: {action}")
    return schedule


def _check_table_kwargs(table_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    if table_kwargs is None:
        return {}
    if not isinstance(table_kwargs, Mapping):
        raise config_error(f"PyTorchProfiler: table_kwargs must be a dict, got {table_kwargs!r}.")
    valid = table_parameters()
    for key in table_kwargs:
        if key in {"sort_by", "row_limit"}:
            raise ProfilerKeyError(
                f"Found invalid table_kwargs key: {key}. This is already a positional argument of the Profiler."
            )
        if key not in valid:
            raise ProfilerKeyError(f"Found invalid table_kwargs key: {key}. Should be within {allowed(valid)}.")
    return dict(table_kwargs)


def _default_activities() -> list[ProfilerActivity]:
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities


def _default_sort_key(torch_kwargs: Mapping[str, Any]) -> str:
    activities = torch_kwargs.get("activities") or []
    on_cuda = bool(torch_kwargs.get("use_cuda")) or ProfilerActivity.CUDA in activities
    if not on_cuda:
        return "cpu_time_total"
    return "device_time_total" if hasattr(torch.autograd.profiler_util.FunctionEventAvg, "device_time_total") else "cuda_time_total"
