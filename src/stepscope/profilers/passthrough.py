"""`PassThroughProfiler`: records nothing, costs next to nothing (Lightning's Trainer default).

Contract: ``start``/``stop`` do nothing, ``summary()`` is empty, so ``describe()`` writes nothing.
``profile(name)`` returns a cached no-op context manager through a C-level dictionary lookup, so
``with profiler.profile("x"):`` costs about what an empty ``with`` block costs.
"""

from __future__ import annotations

from stepscope.profilers.profiler import Profiler

__all__ = ["PassThroughProfiler"]


class _NullScope:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __enter__(self) -> str:
        return self._name

    def __exit__(self, *exc_info: object) -> None:
        return None


class PassThroughProfiler(Profiler):
    """A profiler that does nothing; use it to switch profiling off without changing code."""

    def start(self, action_name: str) -> None:
        return None

    def stop(self, action_name: str) -> None:
        return None

    def _make_scope(self, action_name: str) -> _NullScope:
        return _NullScope(action_name)
