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
import os
import re
import threading
import time
from typing import Any

from stepscope.capture.warn import WarningSink
from stepscope.record.run import Compilation, CompileFacts, GraphBreak, RecompileLimitHit

_now = time.perf_counter_ns
_MAIN_THREAD = threading.main_thread().ident

#: "Graph break in user code at FILE:LINE\nGraph Break Reason: REASON" (torch's own log line, kept
#: stable by its test_exc.py::test_graph_break_log) and the short form of a repeated break.
_BREAK_AT = re.compile(r"Graph break(?: \(user stack suppressed due to duplicate graph break\))? in user code at "
                       r"(?P<file>.+?):(?P<line>\d+)\s*\nGraph Break Reason: (?P<reason>.*?)(?:\n\s*User code traceback|$)",
                       re.S)
#: The lines of a break's reason that say what was unsupported (the first line is often generic:
#: "Encountered graph break when attempting to trace CALL").
_SPECIFIC = re.compile(r"^\s*(Unsupported|Data-dependent|Attempted|Dynamo does not|torch\.\*|Failed|Call to)", re.M)
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

    def __init__(self, recorder: Any, warnings: WarningSink, compile_phase: int, skip: Any = frozenset):
        self.recorder = recorder
        self.warnings = warnings
        self.phase = compile_phase
        self.skip = skip  # () -> code objects of capture's wrappers, never to be compiled as frames
        self._skipped: set[Any] = set()
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
        self.skip_wrappers()
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
    def skip_wrappers(self) -> None:
        """Mark capture's wrappers as frames dynamo skips (it still compiles the frames they call):
        ``torch.compile(model)`` enters ``nn.Module.__call__`` first, which capture wraps, and
        dynamo would otherwise compile the wrapper — another frame, other guards, other
        recompilations than the script has without capture."""
        try:
            from torch._dynamo.eval_frame import skip_code
        except Exception as exc:  # noqa: BLE001
            self.warnings.once("compile-skip", f"capture's wrappers could not be hidden from torch.compile ({exc})")
            return
        for code in self.skip():
            if code not in self._skipped:
                skip_code(code)
                self._skipped.add(code)

    def _on_start(self, args: Any) -> None:
        if threading.get_ident() != _MAIN_THREAD:
            return  # the step recorder belongs to the training thread
        self.skip_wrappers()  # wrappers installed since (the model's own class, after discovery)
        trigger = str(getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO")).lower()
        self._open.append((_now(), str(getattr(args, "compile_id", "")), trigger))
        self.recorder.enter(self.phase)

    def _on_end(self, args: Any) -> None:
        if threading.get_ident() != _MAIN_THREAD:
            return
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
            self.breaks.append((_now(), match["file"], int(match["line"]), break_reason(match["reason"])))

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


def break_reason(text: str) -> str:
    """The most specific line of a graph break's reason (``Unsupported Tensor.item() call …``)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    specific = next((line for line in lines if _SPECIFIC.match(line)), None)
    return (specific or (lines[0] if lines else ""))[:MAX_TEXT]


def compile_facts(raw: dict[str, Any] | None) -> CompileFacts | None:
    """The record's :class:`CompileFacts` from :meth:`CompileWatcher.facts`: each compilation is
    dynamo's metrics entry joined by compile id with the callbacks' timing on our clock."""
    if raw is None:
        return None
    spans: dict[str, tuple[int, int]] = {}
    for start, end, compile_id, _trigger in raw["spans"]:
        spans.setdefault(str(compile_id), (int(start), int(end)))
    compilations = []
    seen: set[str] = set()
    for item in raw["compilations"]:
        compile_id = str(item.get("compile_id") or "")
        if not compile_id or compile_id in seen:
            continue
        seen.add(compile_id)
        start, end = spans.get(compile_id, (-1, -1))
        duration_s = item.get("entire_frame_compile_time_s")
        duration_ns = end - start if start >= 0 else int(float(duration_s or 0.0) * 1e9)
        failure = None
        if item.get("fail_type"):
            failure = f"{item['fail_type']}: {item.get('fail_reason') or ''}".strip()
        frame, _, attempt = compile_id.partition("/")
        latency = item.get("guard_latency_us")
        compilations.append(Compilation(
            compile_id=compile_id, frame=frame.split("-")[-1], function=str(item.get("co_name") or "?"),
            file=str(item.get("co_filename") or ""), line=int(item.get("co_firstlineno") or 0), start_ns=start,
            duration_ns=max(0, duration_ns), trigger=str(item.get("recompile_reason") or ""),
            graph_breaks=None if item.get("num_graph_breaks") is None else int(item["num_graph_breaks"]),
            guard_latency_us=None if latency is None else float(latency), failure=failure))
    compilations.sort(key=lambda item: (item.start_ns if item.start_ns >= 0 else 2**62, item.compile_id))
    breaks: dict[tuple[str, int, str], list[int]] = {}
    for ts, file, line, reason in raw["graph_breaks"]:
        key = (str(file), int(line), str(reason))
        breaks.setdefault(key, []).append(int(ts))
    limit = raw.get("recompile_limit")
    hits = []
    for ts, function, limit_seen, reason in raw["limit_hits"]:
        name, file, line = _function_info(str(function))
        hits.append(RecompileLimitHit(int(ts), name, file, line, int(limit_seen if limit_seen >= 0 else limit or -1),
                                      str(reason)))
    return CompileFacts(
        sources=tuple(raw.get("sources", ())), compilations=tuple(compilations),
        graph_breaks=tuple(GraphBreak(file, line, reason, len(times), min(times))
                           for (file, line, reason), times in breaks.items()),
        limit_hits=tuple(hits), recompile_limit=None if limit is None else int(limit),
        counters=dict(raw.get("counters") or {}))


_FUNCTION_INFO = re.compile(r"^'(?P<name>[^']*)' \((?P<file>.*):(?P<line>\d+)\)$")


def _function_info(text: str) -> tuple[str, str, int]:
    """dynamo's ``'forward' (/path/model.py:12)`` -> ``("forward", "/path/model.py", 12)``."""
    match = _FUNCTION_INFO.match(text.strip())
    if match is None:
        return text, "", 0
    return match["name"], os.path.abspath(match["file"]) if match["file"] else "", int(match["line"])


__all__ = ["CompileWatcher", "compile_facts"]
