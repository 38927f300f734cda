"""`XLAProfiler`: XLA (TPU) device traces through ``torch_xla``'s profiler server.

Contract:
- The constructor validates ``port`` (an int in 1..65535) and imports
  ``torch_xla.debug.profiler``; without ``torch_xla`` it raises ``ProfilerConfigError`` saying
  what to install (Lightning raises a bare ``ModuleNotFoundError``).
- Only step-like actions are traced, as in Lightning: those whose last ``.``-segment is
  ``training_step``, ``backward``, ``validation_step``, ``test_step`` or ``predict_step``, plus
  the plain ``step`` action of ``stepscope run`` and plain loops. The first one starts the
  profiler server on ``port``; ``validation_step``/``test_step``/``predict_step``/``step`` are
  ``xp.StepTrace(action, step_num=k)`` with a per-action counter from 1, the others
  ``xp.Trace(action)``.
- There is no text report: capture the trace with TensorBoard's profile plugin or XProf
  pointed at ``localhost:<port>``. ``dirpath``/``filename`` are always None.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from stepscope.profilers._config import config_error
from stepscope.profilers.profiler import Profiler

__all__ = ["XLAProfiler"]

_XLA_PROFILER_MODULE = "torch_xla.debug.profiler"


def _load_xla_profiler() -> ModuleType:
    try:
        return importlib.import_module(_XLA_PROFILER_MODULE)
    except ImportError as exc:
        raise config_error(
            f"XLAProfiler needs torch_xla ({exc}). Install the torch_xla build matching your torch"
            " (pip install torch_xla) on a machine with XLA devices (TPU), or use 'simple',"
            " 'advanced' or 'pytorch' instead."
        ) from exc


class XLAProfiler(Profiler):
    """Traces training/evaluation steps for the XLA profiler (TPU).

    Args:
        port: port of the profiler server that TensorBoard/XProf connects to.

    Raises:
        ProfilerConfigError: an invalid port, or torch_xla is not installed.
    """

    STEP_FUNCTIONS = {"validation_step", "test_step", "predict_step", "step"}
    RECORD_FUNCTIONS = {"training_step", "backward", "validation_step", "test_step", "predict_step", "step"}
    _transient_state = ("_xp", "_recording_map", "server")

    def __init__(self, port: int = 9012) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise config_error(f"XLAProfiler: port must be an int in 1..65535, got {port!r}.")
        self.port = port
        self._step_counts: dict[str, int] = {}
        self._xp = _load_xla_profiler()
        super().__init__(dirpath=None, filename=None)
        self._recording_map: dict[str, Any] = {}
        self.server: Any = None

    def _restore_transient_state(self) -> None:
        self._xp = _load_xla_profiler()
        self._recording_map = {}
        self.server = None

    def start(self, action_name: str) -> None:
        hook = action_name.split(".")[-1]
        if hook not in self.RECORD_FUNCTIONS:
            return
        if self.server is None:
            self.server = self._xp.start_server(self.port)
        if hook in self.STEP_FUNCTIONS:
            step = self._step_counts[action_name] = self._step_counts.get(action_name, 0) + 1
            recording = self._xp.StepTrace(action_name, step_num=step)
        else:
            recording = self._xp.Trace(action_name)
        recording.__enter__()
        self._recording_map[action_name] = recording

    def stop(self, action_name: str) -> None:
        recording = self._recording_map.pop(action_name, None)
        if recording is not None:
            recording.__exit__(None, None, None)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: Any = None) -> None:
        super().setup(stage, local_rank, None)  # XLA traces are read from the server, not files

    def teardown(self, stage: str | None) -> None:
        for recording in self._recording_map.values():
            recording.__exit__(None, None, None)
        self._recording_map = {}
        super().teardown(stage)
