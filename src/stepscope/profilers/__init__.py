"""The profiler family: Lightning's profilers, usable in any loop and in Lightning's Trainer.

Contract:
- ``import stepscope.profilers`` needs neither Lightning nor torch; ``PyTorchProfiler``,
  ``XLAProfiler`` and the ``pytorch_schedule`` helpers import torch when first accessed.
- Every profiler is a :class:`Profiler`: ``start``/``stop``/``profile``/``setup``/``describe``/
  ``teardown``/``summary`` with Lightning's semantics (see each module for the deliberate
  differences). ``Trainer(profiler=SimpleProfiler())`` works with a real Lightning Trainer;
  when Lightning is loaded, stepscope's ``Profiler`` is registered as a virtual subclass of
  Lightning's ``Profiler`` ABC (see :func:`register_with_loaded_lightning`).
- :func:`create_profiler` builds one by name (``stepscope run --profiler NAME``).
"""

from __future__ import annotations

from typing import Any

from stepscope.profilers._config import ProfilerConfigError, ProfilerKeyError
from stepscope.profilers.advanced import AdvancedProfiler
from stepscope.profilers.device_stats import DeviceStatsMonitor, format_device_stats
from stepscope.profilers.factory import PROFILER_NAMES, create_profiler
from stepscope.profilers.passthrough import PassThroughProfiler
from stepscope.profilers.profiler import Profiler, register_with_loaded_lightning
from stepscope.profilers.simple import SimpleProfiler

__all__ = [
    "Profiler",
    "PassThroughProfiler",
    "SimpleProfiler",
    "AdvancedProfiler",
    "PyTorchProfiler",
    "XLAProfiler",
    "DeviceStatsMonitor",
    "format_device_stats",
    "create_profiler",
    "PROFILER_NAMES",
    "ProfilerConfigError",
    "ProfilerKeyError",
    "register_with_loaded_lightning",
]

_LAZY = {
    "PyTorchProfiler": "stepscope.profilers.pytorch",
    "XLAProfiler": "stepscope.profilers.xla",
}
register_with_loaded_lightning()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'stepscope.profilers' has no attribute {name!r}")
