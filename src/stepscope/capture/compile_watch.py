"""torch.compile, observed on an unmodified script: every compilation, its wall time, the step it
fell in and what triggered it; graph breaks with their reason and user line; the recompile limit.

Nothing here asks the user for a log switch, and nothing parses console text:

- **Compile time** (hot path: none; one call per compilation): dynamo's compilation callbacks
  (``torch._dynamo.callback.callback_handler``: a start and an end callback around every frame
  compilation, lazy backward compilations included) open and close the step recorder's
  ``compile`` phase, so a step's compile time is its own part of the step, not forward's, and the
  phases still add up.
- **What each compilation was** (at the end of the run): dynamo's own compilation metrics
  (``torch._dynamo.utils.get_compilation_metrics()``: compile id ``frame/attempt``, the frame's
  function, file and line, wall time, the guard that failed for a recompilation —
  ``recompile_reason``, e.g. ``tensor 'tokens' size mismatch at index 1. expected 62, actual 85`` —,
  graph breaks, guard-check latency, the failure that made dynamo give up).
- **Graph breaks** (one log record per break, at compile time): dynamo's ``graph_breaks`` artifact
  logger, read by a ``logging.Handler`` of ours. When the user has not enabled that artifact, the
  logger is enabled for our handler only (``propagate`` off), so nothing reaches the script's
  console; when the user has (``TORCH_LOGS=graph_breaks``), ours is added beside theirs.
- **The recompile limit**: dynamo's warning record when a frame hits ``config.recompile_limit``
  (its arguments: the limit, the function, the last guard failure), read by a handler on the
  ``torch._dynamo.convert_frame`` logger: the frame then runs eager.

Which of these a torch version has is probed, and the record says what was available
(``facts.compile.sources``). Installed only once the script imports ``torch._dynamo`` (which
``torch.compile`` and ``torch.optim`` do): a script that never compiles pays nothing.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from stepscope.capture.warn import WarningSink

_now = time.perf_counter_ns

#: "Graph break in user code at FILE:LINE\nGraph Break Reason: REASON" (torch's own log line, kept
#: stable by its test_exc.py::test_graph_break_log) and the short form of a repeated break.
_BREAK_AT = re.compile(r"Graph break(?: \(user stack suppressed due to duplicate graph break\))? in user code at "
                       r"(?P<file>.+?):(?P<line>\d+)\s*\nGraph Break Reason: (?P<reason>[^\n]*)")
#: At most this many graph-break records are kept (a break in a loop repeats).
MAX_BREAKS = 2000
MAX_TEXT = 500


class _Records(logging.Handler):
    """Hands each log record to ``sink`` (never raises into torch)."""

    def __init__(self, sink: Any):
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink(record)
        except Exception:  # noqa: BLE001 - observing must not break compilation
            pass


class CompileWatcher:
    """Watches torch.compile in the training process (see the module docstring).

    Args:
        recorder: the step recorder (its ``enter``/``leave`` take the compile phase).
        warnings: where failures to observe go.
        compile_phase: the recorder's index of the compile phase.
    """

    def __init__(self, recorder: Any, warnings: WarningSink, compile_phase: int):
        self.recorder = recorder
        self.warnings = warnings
        self.phase = compile_phase
        self.spans: list[tuple[int, int, str, str]] = []  # (start_ns, end_ns, compile id, trigger)
        self.breaks: list[tuple[int, str, int, str]] = []  # (ts_ns, file, line, reason)
        self.limit_hits: list[tuple[int, str, int, str]] = []  # (ts_ns, function, limit, last reason)
        self.sources: list[str] = []
        self._open: list[tuple[int, str, str]] = []
        self._undo: list[Any] = []
        self._dynamo: Any = None

    # -- installing ------------------------------------------------------------------------------
    def install(self) -> None:
        """Called once ``torch._dynamo`` is imported; each source is optional."""
        import torch._dynamo as dynamo

        self._dynamo = dynamo
        try:
            from torch._dynamo.callback import callback_handler

            callback_handler.register_start_callback(self._on_start)
            callback_handler.register_end_callback(self._on_end)
            self._undo.append(lambda: (callback_handler.remove_start_callback(self._on_start),
                                       callback_handler.remove_end_callback(self._on_end)))
            self.sources.append("compilation callbacks")
        except Exception as exc:  # noqa: BLE001
            self.warnings.once("compile-callbacks", f"torch.compile compile times not timed ({exc})")
        self._watch_graph_breaks()
        self._watch_logger("torch._dynamo.convert_frame", self._on_convert_frame, "recompile-limit warning")

    def _watch_graph_breaks(self) -> None:
        try:
            import torch._logging

            logger = torch._logging.getArtifactLogger("torch._dynamo.symbolic_convert", "graph_breaks")
        except Exception as exc:  # noqa: BLE001
            self.warnings.once("compile-breaks", f"graph breaks not observed ({exc})")
            return
        handler = _Records(self._on_break)
        user_enabled = logger.isEnabledFor(logging.DEBUG)
        level, propagate = logger.level, logger.propagate
        if not user_enabled:  # ours alone: nothing reaches the script's console
            logger.setLevel(logging.DEBUG)
            logger.propagate = False
        logger.addHandler(handler)

        def undo() -> None:
            logger.removeHandler(handler)
            if not user_enabled:
                logger.setLevel(level)
                logger.propagate = propagate

        self._undo.append(undo)
        self.sources.append("graph_breaks log records")

    def _watch_logger(self, name: str, sink: Any, what: str) -> None:
        logger = logging.getLogger(name)
        handler = _Records(sink)
        logger.addHandler(handler)
        self._undo.append(lambda: logger.removeHandler(handler))
        self.sources.append(what)

    def remove(self) -> None:
        while self._undo:
            try:
                self._undo.pop()()
            except Exception:  # noqa: BLE001
                pass

    # -- callbacks (compile time only) -------------------------------------------------------------
    def _on_start(self, args: Any) -> None:
        trigger = str(getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO")).lower()
        self._open.append((_now(), str(getattr(args, "compile_id", "")), trigger))
        self.recorder.enter(self.phase)

    def _on_end(self, args: Any) -> None:
        end = _now()
        self.recorder.leave(self.phase)
        if self._open:
            start, compile_id, trigger = self._open.pop()
            self.spans.append((start, end, compile_id, trigger))

    def _on_break(self, record: logging.LogRecord) -> None:
        if len(self.breaks) >= MAX_BREAKS:
            return
        match = _BREAK_AT.search(record.getMessage())
        if match is not None:
            self.breaks.append((_now(), match["file"], int(match["line"]), match["reason"][:MAX_TEXT]))

    def _on_convert_frame(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.levelno >= logging.WARNING and str(record.msg).startswith("torch._dynamo hit config.") \
                and len(args) >= 4:
            limit = str(args[1])
            self.limit_hits.append((_now(), str(args[2])[:MAX_TEXT], int(limit) if limit.isdigit() else -1,
                                    str(args[3])[:MAX_TEXT]))

    # -- at the end of the run --------------------------------------------------------------------
    def facts(self) -> dict[str, Any] | None:
        """``facts.compile`` of the record (None when nothing was compiled or observed)."""
        metrics = self._metrics()
        if not self.spans and not metrics and not self.breaks and not self.limit_hits:
            return None
        counters = self._counters()
        return {"sources": list(self.sources), "spans": [list(item) for item in self.spans],
                "compilations": metrics, "graph_breaks": [list(item) for item in self.breaks],
                "limit_hits": [list(item) for item in self.limit_hits], "counters": counters,
                "recompile_limit": self._limit()}

    def _metrics(self) -> list[dict[str, Any]]:
        dynamo = self._dynamo
        if dynamo is None:
            return []
        try:
            from torch._dynamo.utils import get_compilation_metrics

            entries = list(get_compilation_metrics())
        except Exception as exc:  # noqa: BLE001
            self.warnings.once("compile-metrics", f"torch.compile compilation metrics not read ({exc})")
            return []
        if "compilation metrics" not in self.sources:
            self.sources.append("compilation metrics")
        out = []
        for entry in entries:
            item: dict[str, Any] = {}
            for name in ("compile_id", "co_name", "co_filename", "co_firstlineno", "entire_frame_compile_time_s",
                         "backend_compile_time_s", "recompile_reason", "fail_type", "fail_reason",
                         "fail_user_frame_filename", "fail_user_frame_lineno", "num_graph_breaks",
                         "guard_latency_us", "graph_op_count", "guard_count", "start_time_us", "duration_us",
                         "cache_size", "is_forward"):
                value = getattr(entry, name, None)
                if isinstance(value, str):
                    value = value[:MAX_TEXT]
                elif value is not None and not isinstance(value, (int, float, bool)):
                    value = str(value)[:MAX_TEXT]
                item[name] = value
            out.append(item)
        return out

    def _counters(self) -> dict[str, Any]:
        try:
            from torch._dynamo.utils import counters

            return {"graph_break": {str(key)[:MAX_TEXT]: int(value) for key, value in counters["graph_break"].items()},
                    "stats": {str(key): int(value) for key, value in counters["stats"].items()
                              if isinstance(value, int)}}
        except Exception:  # noqa: BLE001
            return {}

    def _limit(self) -> int | None:
        try:
            config = self._dynamo.config
            value = getattr(config, "recompile_limit", None)
            return int(value if value is not None else config.cache_size_limit)
        except Exception:  # noqa: BLE001
            return None


__all__ = ["CompileWatcher"]
