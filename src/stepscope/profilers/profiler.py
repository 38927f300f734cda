"""The profiler base class: action timing protocol, report files and console output.

Contract (shared by every profiler, and by Lightning's ``Trainer(profiler=...)``):
- ``start(action)`` / ``stop(action)`` record one action; ``profile(action)`` is a context
  manager that calls ``stop`` even when the block raises. ``setup(stage, local_rank, log_dir)``
  is called before a run (Lightning: before each ``fit``/``validate``/``test``/``predict``),
  ``describe()`` after it, ``teardown(stage)`` releases resources.
- ``describe()`` writes ``summary()``: to ``dirpath/<stage>-<filename>-<rank>.txt`` (append mode)
  when both ``dirpath`` and ``filename`` are known (``dirpath`` may come from ``setup``'s
  ``log_dir``; an explicit one wins), else to the console on local rank 0. Unlike Lightning,
  console output is printed to :attr:`console_stream` (standard error by default), not sent to
  a logger that is silent unless configured; a file report is announced there in one line.
- File names follow Lightning's rule: stage, filename, rank, action joined by ``-``; the
  characters ``\\ / : * ? " < > | \\n \\r \\t`` become ``_``, runs of ``_`` collapse; an empty
  name becomes ``profile``.
- A profiler pickles and deep-copies at any time, even while recording: live handles (open
  file, the Lightning module proxy, recorder objects of subclasses listed in
  ``_transient_state``) are dropped from the copy.
- Lightning's Trainer needs only these methods plus a writable ``_lightning_module``; see
  :mod:`stepscope.integrations.lightning` for how ``isinstance`` checks against Lightning's
  ``Profiler`` are satisfied.
"""

from __future__ import annotations

import os
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TextIO

__all__ = ["Profiler", "ActionScope", "register_with_loaded_lightning"]

_UNSAFE_CHARACTERS = re.compile(r"[\\/:*?\"<>|\n\r\t]")
_UNDERSCORE_RUNS = re.compile(r"_+")
#: Beyond this many distinct action names, scopes are built per call instead of cached.
_SCOPE_CACHE_LIMIT = 4096


#: Modules defining a Lightning ``Profiler`` ABC (``lightning`` and ``pytorch_lightning``).
_LIGHTNING_PROFILER_MODULES = ("lightning.pytorch.profilers.profiler", "pytorch_lightning.profilers.profiler")
_registered: set[int] = set()


def register_with_loaded_lightning() -> None:
    """Register :class:`Profiler` as a virtual subclass of each *loaded* Lightning ``Profiler``.

    Never imports Lightning; costs two dictionary lookups when there is nothing new to register.
    """
    for module_name in _LIGHTNING_PROFILER_MODULES:
        module = sys.modules.get(module_name)
        base = getattr(module, "Profiler", None) if module is not None else None
        if base is not None and id(base) not in _registered and hasattr(base, "register"):
            base.register(Profiler)
            _registered.add(id(base))


class ActionScope:
    """The context manager returned by :meth:`Profiler.profile` (stateless, reusable)."""

    __slots__ = ("_profiler", "_name")

    def __init__(self, profiler: Profiler, name: str) -> None:
        self._profiler = profiler
        self._name = name

    def __enter__(self) -> str:
        self._profiler.start(self._name)
        return self._name

    def __exit__(self, *exc_info: object) -> None:
        self._profiler.stop(self._name)


class _ScopeCache(dict):
    """``name -> scope``; missing names are built by ``factory`` (cached up to a limit)."""

    def __init__(self, factory: Callable[[str], Any]) -> None:
        super().__init__()
        self.factory = factory

    def __missing__(self, name: str) -> Any:
        scope = self.factory(name)
        if len(self) < _SCOPE_CACHE_LIMIT:
            self[name] = scope
        return scope


class Profiler(ABC):
    """Base class of every profiler; subclass it to write your own (implement start and stop).

    Args:
        dirpath: directory for report files. When None, ``setup``'s ``log_dir`` is used.
        filename: base name of the report file (``.txt`` is added). Without it, the report is
            printed to the console.
    """

    #: Where console reports go; None means ``sys.stderr`` at the time of writing.
    console_stream: ClassVar[TextIO | None] = None
    #: Attributes that hold live objects; they are not copied by pickle/deepcopy.
    _transient_state: ClassVar[tuple[str, ...]] = ()

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._output_file: TextIO | None = None
        self._write_stream: Callable[[str], Any] | None = None
        self._local_rank: int | None = None
        self._stage: str | None = None
        self._lightning_module: Any = None  # set by Lightning's Trainer (a weak proxy)
        self._install_fast_profile()
        register_with_loaded_lightning()

    # -- recording protocol ------------------------------------------------------------------
    @abstractmethod
    def start(self, action_name: str) -> None:
        """Start recording ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """Stop recording ``action_name``."""

    def summary(self) -> str:
        """The report text ("" when there is nothing to report)."""
        return ""

    def profile(self, action_name: str) -> Any:
        """Context manager recording ``action_name`` around a block; yields the name.

        Example::

            with profiler.profile("load batch"):
                batch = next(iterator)
        """
        return self._make_scope(action_name)

    def _make_scope(self, action_name: str) -> Any:
        """Build the scope object for one action name (subclasses may return faster ones)."""
        return ActionScope(self, action_name)

    def _install_fast_profile(self) -> None:
        # `profiler.profile(name)` becomes a C-level dict lookup of a cached scope. Only when
        # `profile` is not overridden by a subclass.
        if type(self).profile is Profiler.profile:
            self._scopes = _ScopeCache(self._make_scope)
            self.profile = self._scopes.__getitem__  # type: ignore[method-assign,assignment]

    # -- lifecycle -----------------------------------------------------------------------------
    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | Path | None = None) -> None:
        """Prepare for a run: remember the stage and rank; use ``log_dir`` unless dirpath is set."""
        # Lightning passes a str-valued enum (TrainerFn.FITTING); keep its plain value ("fit").
        self._stage = str.__str__(stage) if isinstance(stage, str) else stage
        self._local_rank = local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """Release resources: close the report file."""
        self._write_stream = None
        if self._output_file is not None:
            self._output_file.close()
            self._output_file = None

    def describe(self) -> None:
        """Write the report (file or console, see the module contract), then tear down.

        An empty summary writes nothing and creates no file (Lightning creates an empty one).
        """
        text = self.summary()
        if text:
            self._prepare_streams()
            assert self._write_stream is not None
            self._write_stream(text)
            if self._output_file is not None:
                self._output_file.flush()
                stage = f"{self._stage} " if self._stage else ""
                self._rank_zero_console(f"{stage}profiler report written to {self._output_file.name}")
        self.teardown(stage=self._stage)

    @property
    def local_rank(self) -> int:
        return 0 if self._local_rank is None else self._local_rank

    @property
    def report_path(self) -> Path | None:
        """The file ``describe()`` writes to, or None when it prints to the console."""
        if self.filename and self.dirpath:
            return Path(self.dirpath) / self._prepare_filename()
        return None

    # -- output --------------------------------------------------------------------------------
    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        parts = [self._stage, self.filename or None, None if self._local_rank is None else str(self._local_rank), action_name]
        base = "-".join(part for part in parts if part is not None)
        base = _UNDERSCORE_RUNS.sub("_", _UNSAFE_CHARACTERS.sub("_", base)).strip()
        return (base or "profile") + extension

    def _prepare_streams(self) -> None:
        if self._write_stream is not None:
            return
        path = self.report_path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._output_file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in teardown
            self._write_stream = self._output_file.write
        else:
            self._write_stream = self._rank_zero_console

    def _rank_zero_console(self, text: str) -> None:
        if self._local_rank in (None, 0):
            self._console_write(text if text.endswith("\n") else text + "\n")

    def _console_write(self, text: str) -> None:
        stream = self.console_stream if self.console_stream is not None else sys.stderr
        stream.write(text)
        stream.flush()

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        """Lightning's report layout: a title line, then a header line and the text per action."""
        lines = [(f"{self._stage.upper()} " if self._stage is not None else "") + "Profiler Report"]
        rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
        for action, text in stats.items():
            lines.append(f"Profile stats for: {action}{rank}")
            lines.append(text)
        return os.linesep.join(lines)

    # -- copying -------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_output_file", "_write_stream", "_lightning_module", "_scopes", "profile", *self._transient_state):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._output_file = None
        self._write_stream = None
        self._lightning_module = None
        self._restore_transient_state()
        self._install_fast_profile()

    def _restore_transient_state(self) -> None:
        """Recreate the attributes named in ``_transient_state`` on a copy (subclasses)."""

    def __del__(self) -> None:
        if "_output_file" in self.__dict__:
            try:
                self.teardown(stage=self._stage)
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass
