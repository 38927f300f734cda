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
- **Where a graph break is in the user's code**: a break inside library code (``torch/``,
  ``site-packages``) is logged at the library's line; the record's first "User code traceback"
  (dynamo's user stack) names the frames that led there, and the deepest one in the user's own
  files (``model.py:142 self.encoder(src, mask=mask)``) is kept with the break. That logged stack
  is lossy in torch 2.13: ``collapse_resume_frames`` merges consecutive frames of the same name, so
  a user's ``forward`` that calls a library ``forward`` (``nn.TransformerEncoder``) disappears from
  it. The stack is therefore read where dynamo logs the break
  (``InstructionTranslatorBase.log_graph_break``, wrapped: the exception's ``real_stack``, the
  stack the log is formatted from before that merge); the logged traceback is the fall-back, and a
  duplicate of a break takes the user frame of the first.
- **Every guard that failed** (recompilations only): dynamo reports the first failed check of a
  cache entry (``recompile_reason``). Its ``get_guard_fail_reason_helper`` (called once per cached
  variant when a frame recompiles) is wrapped: the wrapper walks the variant's guard tree and
  checks each leaf guard on the same frame locals, so the size, grad-mode and mask guards that
  failed together are all named; they belong to the compilation that starts next.
- **Compile caches**: dynamo's counters of FX graph cache (inductor) and AOTAutograd cache hits
  and misses, and each compilation's backend compile time: cold or warm, and what a warm run
  would still pay.
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
import sysconfig
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
#: One frame of dynamo's "User code traceback:" (``File "F", line N, in FN`` and the source line).
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>[^\n]+)\n(?P<code>[^\n]*)', re.M)
#: The lines of a break's reason that say what was unsupported (the first line is often generic:
#: "Encountered graph break when attempting to trace CALL").
_SPECIFIC = re.compile(r"^\s*(Unsupported|Data-dependent|Attempted|Dynamo does not|torch\.\*|Failed|Call to)", re.M)
#: At most this many graph-break records are kept (a break in a loop repeats).
MAX_BREAKS = 2000
MAX_TEXT = 500
#: At most this many guard-tree nodes, and this long, per cached variant when a frame recompiles
#: (a recompilation takes far longer; a large model's tree has thousands of nodes).
MAX_GUARD_NODES = 20000
MAX_GUARD_WALK_S = 0.05
#: Guard sources (``L['self']._modules['encoder']``) compiled once.
_SOURCES: dict[str, Any] = {}
#: dynamo's counters of its compile caches: (counter group, key) -> the record's name.
CACHE_COUNTERS = {("inductor", "fxgraph_cache_hit"): "fx_hit", ("inductor", "fxgraph_cache_miss"): "fx_miss",
                  ("inductor", "fxgraph_cache_bypass"): "fx_bypass",
                  ("aot_autograd", "autograd_cache_hit"): "aot_hit", ("aot_autograd", "autograd_cache_miss"): "aot_miss",
                  ("aot_autograd", "autograd_cache_bypass"): "aot_bypass"}


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
        # (ts_ns, file, line, reason, user file, user line, user code, library function)
        self.breaks: list[tuple[int, str, int, str, str, int, str, str]] = []
        self._user_frames: dict[tuple[str, int], tuple[str, int, str, str]] = {}
        self._stack: list[tuple[str, int, str, str]] | None = None  # the break being logged
        self.guard_failures: dict[str, list[str]] = {}  # compile id -> every guard that failed before it
        self._pending_guards: list[str] = []
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
        self._watch_guard_failures()
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
        self._watch_break_stacks()

    def _watch_break_stacks(self) -> None:
        try:
            from torch._dynamo.symbolic_convert import InstructionTranslatorBase

            original = InstructionTranslatorBase.log_graph_break
        except Exception:  # noqa: BLE001 - the logged traceback is the fall-back
            return
        watcher = self

        def log_graph_break(translator: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                exc = kwargs.get("exc", args[-1] if args else None)
                stack = getattr(exc, "real_stack", None)
                if stack is None:
                    from torch._guards import TracingContext

                    stack = TracingContext.extract_stack()
                watcher._stack = [(str(item.filename), int(item.lineno or 0), str(item.name), (item.line or "").strip())
                                  for item in stack]
            except Exception:  # noqa: BLE001
                watcher._stack = None
            try:
                return original(translator, *args, **kwargs)
            finally:
                watcher._stack = None

        InstructionTranslatorBase.log_graph_break = log_graph_break  # type: ignore[method-assign]

        def undo() -> None:
            if InstructionTranslatorBase.log_graph_break is log_graph_break:
                InstructionTranslatorBase.log_graph_break = original  # type: ignore[method-assign]

        self._undo.append(undo)
        self.sources.append("graph-break user stacks")

    def _watch_guard_failures(self) -> None:
        try:
            import torch._dynamo.guards as guards

            original = guards.get_guard_fail_reason_helper
        except Exception as exc:  # noqa: BLE001
            self.warnings.once("compile-guards", f"recompilations name only dynamo's first failed guard ({exc})")
            return
        pending = self._pending_guards

        def helper(guard_manager: Any, f_locals: Any, *args: Any, **kwargs: Any) -> Any:
            reason = original(guard_manager, f_locals, *args, **kwargs)
            try:
                for item in failed_guards(guard_manager, f_locals):
                    if item not in pending:
                        pending.append(item)
            except Exception:  # noqa: BLE001 - observing must not break compilation
                pass
            return reason

        guards.get_guard_fail_reason_helper = helper

        def undo() -> None:
            if guards.get_guard_fail_reason_helper is helper:
                guards.get_guard_fail_reason_helper = original

        self._undo.append(undo)
        self.sources.append("every failed guard")

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
        compile_id = str(getattr(args, "compile_id", ""))
        if self._pending_guards:  # the guards that failed are checked just before the recompilation starts
            self.guard_failures.setdefault(compile_id, []).extend(self._pending_guards)
            self._pending_guards.clear()
        self._open.append((_now(), compile_id, trigger))
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
        message = record.getMessage()
        match = _BREAK_AT.search(message)
        if match is None:
            return
        file, line = match["file"], int(match["line"])
        user = user_frame(file, line, message, self._stack) if self._stack else None
        if user is None:
            user = self._user_frames.get((file, line))
        if user is None:
            user = user_frame(file, line, message)
            if user is not None:
                self._user_frames[(file, line)] = user
        user_file, user_line, user_code, function = user or ("", 0, "", "")
        self.breaks.append((_now(), file, line, break_reason(match["reason"]), user_file, user_line, user_code,
                            function))

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
                "compilations": metrics, "guard_failures": {key: list(value) for key, value in self.guard_failures.items()}, "graph_breaks": [list(item) for item in self.breaks],
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
            # a lazily compiled backward is its own entry with the forward's compile id: its cache
            # counts and backend time belong to that compilation
            cache = {name: getattr(entry, name, None) for name in (
                "inductor_fx_local_cache_hit_count", "inductor_fx_local_cache_miss_count",
                "inductor_fx_remote_cache_hit_count", "inductor_fx_remote_cache_miss_count",
                "aotautograd_local_cache_hit_count", "aotautograd_local_cache_miss_count",
                "aotautograd_remote_cache_hit_count", "aotautograd_remote_cache_miss_count")}
            item["cache_hits"] = _sum_counts(cache, "_hit_count")
            item["cache_misses"] = _sum_counts(cache, "_miss_count")
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

            caches = {name: int(counters[group][key]) for (group, key), name in CACHE_COUNTERS.items()
                      if group in counters and key in counters[group]}
            return {"graph_break": {str(key)[:MAX_TEXT]: int(value) for key, value in counters["graph_break"].items()},
                    "stats": {str(key): int(value) for key, value in counters["stats"].items()
                              if isinstance(value, int)}, "caches": caches}
        except Exception:  # noqa: BLE001
            return {}

    def _limit(self) -> int | None:
        try:
            config = self._dynamo.config
            value = getattr(config, "recompile_limit", None)
            return int(value if value is not None else config.cache_size_limit)
        except Exception:  # noqa: BLE001
            return None


def _sum_counts(values: dict[str, Any], suffix: str) -> int | None:
    counts = [int(value) for name, value in values.items() if name.endswith(suffix) and isinstance(value, int)]
    return sum(counts) if counts else None


def _library_roots() -> tuple[str, ...]:
    """Directories whose files are not the user's: torch's, the installed packages', the standard
    library's, the environment's scripts (``bin/stepscope``) and stepscope's own (its zoo aside)."""
    roots = set()
    for name in ("purelib", "platlib", "stdlib", "platstdlib", "scripts"):
        try:
            roots.add(os.path.realpath(sysconfig.get_paths()[name]))
        except (KeyError, OSError):
            continue
    try:
        import torch

        roots.add(os.path.realpath(os.path.dirname(torch.__file__)))
    except Exception:  # noqa: BLE001
        pass
    roots.add(_STEPSCOPE)
    return tuple(sorted(root + os.sep for root in roots if root))


_STEPSCOPE = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: stepscope's planted scenarios are the user's code of a demo
_ZOO = os.path.join(_STEPSCOPE, "zoo") + os.sep
_ROOTS: tuple[str, ...] | None = None


def is_library_file(path: str) -> bool:
    """Whether ``path`` is library code the user does not edit: under torch, site-packages or
    dist-packages, the standard library, the environment's scripts, stepscope (but its zoo of
    demos) — or not a file (``<frozen …>``, ``<string>``)."""
    global _ROOTS
    if not path or path.startswith("<"):
        return True
    parts = path.replace("\\", "/").split("/")
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    if _ROOTS is None:
        _ROOTS = _library_roots()
    real = os.path.realpath(path)
    if real.startswith(_ZOO):
        return False
    return any(real.startswith(root) for root in _ROOTS)


def user_frame(file: str, line: int, message: str, stack: list[tuple[str, int, str, str]] | None = None
               ) -> tuple[str, int, str, str] | None:
    """(user file, user line, user source line, the library function that broke) of a graph break
    at ``file:line``: the break itself when it is in the user's code, else the deepest frame in
    the user's files of ``stack`` (``(file, line, function, source)`` frames, outermost first) or
    of the record's "User code traceback"; None when there is no stack (a duplicate) and the break
    is in library code."""
    if not is_library_file(file):
        return file, line, "", ""
    if stack:
        frames = list(stack)
    else:
        _, found, text = message.partition("User code traceback:")
        if not found:
            return None
        frames = [(item["file"], int(item["line"]), item["function"].strip(), item["code"].strip())
                  for item in _FRAME.finditer(text)]
    function = frames[-1][2] if frames else ""
    for path, number, _function, code in reversed(frames):
        if not is_library_file(path):
            return path, number, code[:MAX_TEXT], function
    return None


def failed_guards(guard_manager: Any, f_locals: Any) -> list[str]:
    """Every leaf guard of a cached variant that fails on ``f_locals`` (dynamo stops at the first),
    each as ``"src: size (dim 0) 16 -> 12"``, ``"global state: grad_mode"``, ``"mask: requires_grad"``…"""
    root = guard_manager.root
    scope: dict[str, Any] = {"L": f_locals}
    global_scope = getattr(guard_manager, "global_scope", None) or {}
    if "G" in global_scope:
        scope["G"] = global_scope["G"]
    scope.update(getattr(guard_manager, "closure_vars", None) or {})
    out: list[str] = []
    budget = [MAX_GUARD_NODES]
    deadline = _now() + int(MAX_GUARD_WALK_S * 1e9)

    def visit(manager: Any, value: Any, source: str) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            return
        for leaf in manager.get_leaf_guards():
            kind = type(leaf).__name__
            detail = ""
            try:
                if hasattr(leaf, "check_verbose"):
                    info = leaf.check_verbose(value)
                    ok = bool(info.result)
                    detail = " ".join(str(part) for part in info.verbose_code_parts)
                else:
                    ok = bool(leaf(value))
            except Exception:  # noqa: BLE001 - a guard that cannot be called alone (aliasing, …)
                continue
            if not ok:
                text = describe_guard(kind, source, leaf, value, detail)
                if text not in out:
                    out.append(text)
        for child in manager.get_child_managers():
            if _now() > deadline:
                return
            try:
                child_source = child.get_source()
                code = _SOURCES.get(child_source)
                if code is None:
                    code = _SOURCES[child_source] = compile(child_source, "<guard source>", "eval")
                child_value = eval(code, {"__builtins__": __builtins__}, scope)  # noqa: S307 - dynamo's own source text
            except Exception:  # noqa: BLE001
                continue
            visit(child, child_value, child_source)

    visit(root, f_locals, "")
    return out


_TENSOR_MATCH = re.compile(r"check_tensor\((?P<source>[^,]+), \w+, DispatchKeySet\((?P<keys>[^)]*)\), (?P<dtype>[\w.]+), "
                           r"device=(?P<device>[^,]+), requires_grad=(?P<grad>\w+), size=\[(?P<size>[^\]]*)\], "
                           r"stride=\[(?P<stride>[^\]]*)\]")


def source_name(source: str) -> str:
    """``L['self']._modules['encoder']`` -> ``self.encoder``; ``L['src']`` -> ``src``."""
    text = re.sub(r"^L\[['\"]([^'\"]+)['\"]\]", r"\1", source.strip())
    text = re.sub(r"\.__dict__\[['\"]_(?:modules|parameters|buffers)['\"]\]\[['\"]([^'\"]+)['\"]\]", r".\1", text)
    text = re.sub(r"\._(?:modules|parameters|buffers)\[['\"]([^'\"]+)['\"]\]", r".\1", text)
    return re.sub(r"^G\[['\"]([^'\"]+)['\"]\]", r"\1", text)


def describe_guard(kind: str, source: str, leaf: Any, value: Any, detail: str = "") -> str:
    """One failed guard, in words."""
    name = source_name(source) if source else ""
    if kind == "GLOBAL_STATE":
        what = detail.replace("GLOBAL_STATE changed:", "").strip() or "changed"
        return f"global state: {what}"
    if kind == "TENSOR_MATCH":
        parts = [str(part) for part in leaf.verbose_code_parts()]
        match = _TENSOR_MATCH.search(parts[0]) if parts else None
        if match is not None:
            changes = _tensor_changes(match, value)
            if changes:
                return f"{name}: {', '.join(changes)}"
        return f"{name}: tensor properties"
    parts = [str(part).split("#")[0].strip() for part in leaf.verbose_code_parts()]
    code = parts[0] if parts else kind
    code = re.sub(r"L\[['\"]([^'\"]+)['\"]\]", r"\1", code)
    code = re.sub(r"\.__dict__\[['\"]_(?:modules|parameters|buffers)['\"]\]\[['\"]([^'\"]+)['\"]\]", r".\1", code)
    code = re.sub(r"\._(?:modules|parameters|buffers)\[['\"]([^'\"]+)['\"]\]", r".\1", code)
    if name and kind in _VALUE_GUARDS:  # "scale == 2, now 3", "self.drop.training == True, now False"
        shown = "a tensor" if hasattr(value, "shape") and hasattr(value, "dtype") else repr(value)
        return f"{code}, now {shown if len(shown) <= 40 else shown[:39] + '…'}"[:MAX_TEXT]
    return (f"{name}: {kind.lower()} ({code})" if name else f"{kind.lower()} ({code})")[:MAX_TEXT]


#: Guards on a value (not a tensor): their failure is shown with the value now.
_VALUE_GUARDS = frozenset({"EQUALS_MATCH", "TRUE_MATCH", "FALSE_MATCH", "NONE_MATCH", "NOT_NONE", "LENGTH_CHECK",
                           "DICT_LENGTH", "TUPLE_ITERATOR_LEN"})


def _tensor_changes(match: re.Match[str], value: Any) -> list[str]:
    changes = []
    try:
        size = [item.strip() for item in match["size"].split(",") if item.strip()]
        actual = list(value.shape)
        if len(size) != len(actual):
            changes.append(f"dimensions {len(size)} -> {len(actual)}")
        else:
            for dim, (expected, got) in enumerate(zip(size, actual)):
                if expected != "None" and expected.isdigit() and int(expected) != int(got):
                    changes.append(f"size (dim {dim}) {expected} -> {got}")
        if match["grad"] in ("True", "False") and (match["grad"] == "True") != bool(value.requires_grad):
            changes.append(f"requires_grad {match['grad']} -> {bool(value.requires_grad)}")
        if not str(value.dtype).endswith(match["dtype"].split(".")[-1]):
            changes.append(f"dtype {match['dtype']} -> {value.dtype}")
        if not changes and len(size) == len(actual):
            stride = [item.strip() for item in match["stride"].split(",") if item.strip()]
            if [int(item) for item in stride if item.isdigit()] != [int(item) for item in value.stride()][:len(stride)]:
                changes.append("stride")
    except Exception:  # noqa: BLE001 - not a plain tensor
        return changes
    return changes


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
    entries: dict[str, list[dict[str, Any]]] = {}
    for item in raw["compilations"]:
        compile_id = str(item.get("compile_id") or "")
        if compile_id:
            entries.setdefault(compile_id, []).append(item)
    guards = raw.get("guard_failures") or {}
    for compile_id, group in entries.items():
        item = group[0]  # the frame's compilation; a lazily compiled backward adds its own entry
        start, end = spans.get(compile_id, (-1, -1))
        duration_s = item.get("entire_frame_compile_time_s")
        duration_ns = end - start if start >= 0 else int(float(duration_s or 0.0) * 1e9)
        failure = None
        if item.get("fail_type"):
            failure = f"{item['fail_type']}: {item.get('fail_reason') or ''}".strip()
        frame, _, attempt = compile_id.partition("/")
        latency = item.get("guard_latency_us")
        backend = [float(entry["backend_compile_time_s"]) for entry in group
                   if isinstance(entry.get("backend_compile_time_s"), (int, float))]
        found = [int(entry["cache_hits"]) for entry in group if isinstance(entry.get("cache_hits"), int)]
        missed = [int(entry["cache_misses"]) for entry in group if isinstance(entry.get("cache_misses"), int)]
        compilations.append(Compilation(
            compile_id=compile_id, frame=frame.split("-")[-1], function=str(item.get("co_name") or "?"),
            file=str(item.get("co_filename") or ""), line=int(item.get("co_firstlineno") or 0), start_ns=start,
            duration_ns=max(0, duration_ns), trigger=str(item.get("recompile_reason") or ""),
            graph_breaks=None if item.get("num_graph_breaks") is None else int(item["num_graph_breaks"]),
            guard_latency_us=None if latency is None else float(latency), failure=failure,
            guard_failures=tuple(str(text)[:MAX_TEXT] for text in guards.get(compile_id, ())),
            backend_ns=int(sum(backend) * 1e9) if backend else None,
            cache_hits=sum(found) if found else None, cache_misses=sum(missed) if missed else None))
    compilations.sort(key=lambda item: (item.start_ns if item.start_ns >= 0 else 2**62, item.compile_id))
    breaks: dict[tuple[str, int, str], list[int]] = {}
    users: dict[tuple[str, int, str], tuple[str, int, str, str]] = {}
    for ts, file, line, reason, *user in raw["graph_breaks"]:
        key = (str(file), int(line), str(reason))
        breaks.setdefault(key, []).append(int(ts))
        if len(user) == 4 and user[0] and key not in users:
            users[key] = (str(user[0]), int(user[1]), str(user[2]), str(user[3]))
    for key in breaks:  # a duplicate logged without its stack: the user frame of the same library line
        if key not in users:
            same = next((value for (file, line, _), value in users.items() if (file, line) == key[:2]), None)
            if same is not None:
                users[key] = same
    limit = raw.get("recompile_limit")
    hits = []
    for ts, function, limit_seen, reason in raw["limit_hits"]:
        name, file, line = _function_info(str(function))
        hits.append(RecompileLimitHit(int(ts), name, file, line, int(limit_seen if limit_seen >= 0 else limit or -1),
                                      str(reason)))
    return CompileFacts(
        sources=tuple(raw.get("sources", ())), compilations=tuple(compilations),
        graph_breaks=tuple(GraphBreak(file, line, reason, len(times), min(times),
                                      *users.get((file, line, reason), ("", 0, "", "")))
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
