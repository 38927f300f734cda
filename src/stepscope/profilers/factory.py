"""`create_profiler`: a profiler by name, for ``stepscope run --profiler NAME`` and config files.

Contract: ``create_profiler(name, dirpath=None, filename=None)`` returns a new profiler of the
named kind (case-insensitive: ``passthrough``, ``simple``, ``advanced``, ``pytorch``, ``xla``) with
that report directory and file name, or raises ``UsageError`` (a ``ProfilerConfigError``) listing
the allowed names. Modules that need torch are imported only when their profiler is asked for.

How a driver uses the result (this is what ``stepscope run`` does on an unmodified script)::

    profiler = create_profiler("simple", dirpath=run_dir, filename="profiler")
    profiler.setup(stage="run", local_rank=rank, log_dir=run_dir)
    for each training step:
        profiler.start("step")
        profiler.start("data_wait"); ...; profiler.stop("data_wait")   # likewise "forward",
        ...                                                          # "backward", "optimizer"
        profiler.stop("step")       # PyTorchProfiler: advances its schedule here
    profiler.describe()             # file <dirpath>/run-profiler-<rank>.txt, or the console
    profiler.teardown("run")
"""

from __future__ import annotations

import importlib
from pathlib import Path

from stepscope.profilers._config import config_error
from stepscope.profilers.profiler import Profiler

__all__ = ["create_profiler", "PROFILER_NAMES"]

#: name -> (module, class); the order is the order shown to users.
_REGISTRY: dict[str, tuple[str, str]] = {
    "passthrough": ("stepscope.profilers.passthrough", "PassThroughProfiler"),
    "simple": ("stepscope.profilers.simple", "SimpleProfiler"),
    "advanced": ("stepscope.profilers.advanced", "AdvancedProfiler"),
    "pytorch": ("stepscope.profilers.pytorch", "PyTorchProfiler"),
    "xla": ("stepscope.profilers.xla", "XLAProfiler"),
}
PROFILER_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def create_profiler(name: str, dirpath: str | Path | None = None, filename: str | None = None) -> Profiler:
    """A new profiler of kind ``name`` writing its report to ``dirpath``/``filename``.

    Raises:
        ProfilerConfigError: unknown name (the message lists the allowed ones), or invalid
            arguments for that profiler (e.g. ``xla`` without torch_xla).
    """
    key = name.lower() if isinstance(name, str) else name
    if key not in _REGISTRY:
        raise config_error(f"Unknown profiler {name!r}: use one of {', '.join(repr(n) for n in PROFILER_NAMES)}.")
    module_name, class_name = _REGISTRY[key]
    cls = getattr(importlib.import_module(module_name), class_name)
    if key == "xla":
        if dirpath is not None or filename is not None:
            raise config_error("The 'xla' profiler writes no report file: leave dirpath and filename unset.")
        return cls()
    return cls(dirpath=dirpath, filename=filename)
