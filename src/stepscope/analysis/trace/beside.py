"""Part of one rank's views computed in a forked child while this process computes the rest.

Contract: :func:`beside` starts ``work`` in a child forked from this process — which shares the
event table and its links, already built, page for page without copying them — and returns a
:class:`Beside` whose :meth:`Beside.result` is ``work``'s value, pickled back through a pipe, or
``None`` when the child could not deliver it (an exception, a signal, memory, an unpicklable value):
the caller then computes it itself, so the analysis never depends on the child. ``beside`` returns
``None`` where forking is unsafe or impossible: another thread runs in this process (a child forked
beside a thread can deadlock on a lock that thread held), the platform has no ``fork``, or the
machine — or, in a container, its memory cgroup — has less memory available than this process holds
(the most a child could come to need, were it to touch every page it shares: a machine without that
to spare keeps to one process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Beside(Generic[T]):
    """A forked child computing one value."""

    def __init__(self, work: Callable[[], T]) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._receive, send = context.Pipe(duplex=False)
        self._process = context.Process(target=_deliver, args=(work, send), daemon=True)
        self._process.start()  # flushes stdout and stderr first: the child never repeats buffered output
        send.close()

    def result(self) -> T | None:
        """``work``'s value, or None (see the module docstring). Waits for the child to finish."""
        outcome: Any = None
        try:
            outcome = self._receive.recv()
        except Exception:  # noqa: BLE001 - EOF from a child that died, a value that does not unpickle
            outcome = None
        finally:
            self._receive.close()
            self._process.join()
        return outcome[1] if isinstance(outcome, tuple) and outcome and outcome[0] == "ok" else None


def _deliver(work: Callable[[], Any], send: Any) -> None:
    try:
        value = work()
    except BaseException:  # noqa: BLE001 - the parent computes it instead
        send.send(("failed",))
    else:
        try:
            send.send(("ok", value))
        except Exception:  # noqa: BLE001 - unpicklable: the parent computes it instead
            send.send(("failed",))
    send.close()


def beside(work: Callable[[], T]) -> Beside[T] | None:
    """``work`` started in a forked child, or None where forking is not safe (see the module docstring)."""
    from stepscope.executors import fork_is_safe

    if not fork_is_safe():
        return None
    import psutil

    from stepscope.traces.spill import headroom

    try:
        room = headroom()  # the machine's available memory, or what its memory cgroup has left
        if room is None or room < psutil.Process().memory_info().rss:
            return None
    except (psutil.Error, OSError):
        return None
    try:
        return Beside(work)
    except OSError:  # no process left to fork (limits, memory)
        return None
