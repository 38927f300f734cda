"""Where the per-rank map of a job's trace analysis runs: local processes, or a Dask cluster.

``analyze_traces`` takes any :class:`concurrent.futures.Executor`. Local processes are the default
(:func:`local_executor`, which also decodes one large trace in byte ranges:
:mod:`stepscope.traces.split_load`). For trace sets that outgrow one machine, Dask's distributed
scheduler is the optional engine (``pip install 'stepscope[dask]'``): ``Client.get_executor()`` is a
``concurrent.futures`` executor, so the cluster runs the very same map as the local processes, with
no code path of its own. (Ray would need an adapter around its
tasks and a much heavier runtime: a C++ core, its own object store and dashboard.)

Each Dask worker must be able to import stepscope (the same environment on every node) and read
the trace files at the paths given (a shared or replicated filesystem, or object storage mounted
at the same path): only the small per-rank results travel back to the caller.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from stepscope.errors import UsageError

if TYPE_CHECKING:  # concurrent.futures costs ~25 ms to import: only where a pool is made
    from concurrent.futures import Executor

__all__ = ["dask_executor", "fork_is_safe", "local_executor", "usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def fork_is_safe() -> bool:
    """This process may fork: the platform has ``fork`` and no other thread runs (a child forked
    beside a thread can deadlock on a lock that thread held)."""
    import threading

    return threading.active_count() == 1 and hasattr(os, "fork")  # no fork on Windows


def local_executor(workers: int) -> Executor:
    """Worker processes on this machine: forked from this process where :func:`fork_is_safe` (what it
    imported is there already: no start-up per worker), else spawned."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if fork_is_safe() else "spawn"
    return ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context(method))


@contextlib.contextmanager
def dask_executor(address: str, workers: int = 2, connect_timeout_s: float = 5.0) -> Iterator[Executor]:
    """A Dask cluster as an executor: ``address`` is a scheduler (``tcp://host:8786``) or ``local``
    (a LocalCluster of ``workers`` single-threaded worker processes on this machine, closed on exit).

    Raises:
        UsageError: Dask's ``distributed`` is not installed, or the scheduler cannot be reached.
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise UsageError("--dask needs Dask's distributed scheduler: pip install 'stepscope[dask]'") from None
    cluster = None
    try:
        if address == "local":
            cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            client = Client(cluster)
        else:
            client = Client(address, timeout=connect_timeout_s)
    except (OSError, TimeoutError) as exc:
        if cluster is not None:
            cluster.close()
        raise UsageError(f"cannot reach the Dask scheduler at {address} ({exc}); give its address "
                         "(tcp://HOST:8786) or 'local'") from None
    try:
        yield client.get_executor(pure=False)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
