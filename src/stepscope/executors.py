"""Where the per-rank map of a job's trace analysis runs: local processes, or a Dask cluster.

``analyze_traces`` takes any :class:`concurrent.futures.Executor`. Local processes are the default
(:func:`stepscope.analysis.trace.trace_evidence.local_executor`). For trace sets that outgrow one
machine, Dask's distributed scheduler is the optional engine (``pip install 'stepscope[dask]'``):
``Client.get_executor()`` is a ``concurrent.futures`` executor, so the cluster runs the very same
map as the local processes, with no code path of its own. (Ray would need an adapter around its
tasks and a much heavier runtime: a C++ core, its own object store and dashboard.)

Each Dask worker must be able to import stepscope (the same environment on every node) and read
the trace files at the paths given (a shared or replicated filesystem, or object storage mounted
at the same path): only the small per-rank results travel back to the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Executor

from stepscope.errors import UsageError

__all__ = ["dask_executor"]


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
