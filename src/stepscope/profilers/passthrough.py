"""`PassThroughProfiler`: records nothing, costs next to nothing (Lightning's Trainer default).

Contract: ``start``/``stop`` do nothing, ``summary()`` is empty, so ``describe()`` writes nothing.
``profile(name)`` returns a cached no-op context manager through a C-level dictionary lookup, and
entering and leaving it runs no Python code, so ``with profiler.profile("x"):`` costs about what
an empty ``with`` block costs (see ``benchmarks/bench_profilers.py``).
"""

from __future__ import annotations

from stepscope.profilers.profiler import Profiler

__all__ = ["PassThroughProfiler"]


class _NullScope(str):
    """A no-op context manager whose ``with`` costs no Python frame.

    It is the action name itself (a ``str`` subclass). ``__enter__`` is ``str.__str__``: it returns
    the name as a plain ``str``. ``__exit__`` is ``object.__init__``: called as
    ``scope.__exit__(exc_type, exc, tb)`` it returns None without doing anything, because CPython's
    ``object.__init__`` accepts extra arguments for types that override ``__new__`` but not
    ``__init__`` (true of every ``str`` subclass). Returning None lets exceptions propagate.
    """

    __slots__ = ()
    __enter__ = str.__str__
    __exit__ = object.__init__


class PassThroughProfiler(Profiler):
    """A profiler that does nothing; use it to switch profiling off without changing code."""

    def start(self, action_name: str) -> None:
        return None

    def stop(self, action_name: str) -> None:
        return None

    def _make_scope(self, action_name: str) -> _NullScope:
        return _NullScope(action_name)
