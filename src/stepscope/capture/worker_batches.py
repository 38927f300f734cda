"""Each DataLoader worker's time per batch, measured in the worker.

The training thread sees only its own wait in ``next(loader)``; how long a worker takes to make a
batch — and how much of that it ran on a CPU, waited for a core, or slept (reads, a remote source,
a lock) — is the loader's pace, the floor under the step that no change to the model moves.

The dataset fetchers (``_MapDatasetFetcher.fetch``, ``_IterableDatasetFetcher.fetch``: one call per
batch, in the worker) are wrapped in the training process before its workers start, so forked
workers inherit the wrapper; spawned workers (``multiprocessing_context="spawn"``) import torch
anew and are not timed. In the training process itself (``num_workers=0``) the wrapper only calls
through: that time is already the training thread's data wait.

Per batch a worker appends one line ``pid end_ns wall_ns cpu_ns runq_ns`` to the rank's file
(``layout.worker_batches_path``; ``O_APPEND``, one ``write`` per line, so lines of several workers
never interleave): the monotonic clock at the end (the clock of the steps and the samples), and the
worker thread's wall time, on-CPU time (its CPU clock) and run-queue delay (from
``/proc/thread-self/schedstat``; -1 where that file is missing) over the call.
A worker stops writing after :data:`MAX_LINES_PER_WORKER` lines; ``STEPSCOPE_WORKER_BATCHES=0`` turns the
timing off (capture then installs no wrapper). Anything that fails in a worker
turns the timing off there, silently: a worker's output is the user's.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Lines one worker writes at most (about 50 bytes each); the analysis reads the steady steps'.
MAX_LINES_PER_WORKER = 20_000
#: Rows the record keeps (the last ones: the steady state is at the end of a run).
MAX_RECORD_ROWS = 4_096

_SCHEDSTAT = "/proc/thread-self/schedstat"


class WorkerBatchTimer:
    """Wraps the dataset fetchers; state is per process (a forked worker starts from the parent's
    and notices the new pid)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._pid = -1
        self._fd = -1
        self._stat_fd = -1
        self._lines = 0
        self._off = False

    def wrap(self, fetch: Callable[..., Any], worker_info: Callable[[], Any]) -> Callable[..., Any]:
        timer = self
        monotonic_ns, thread_time_ns = time.monotonic_ns, time.thread_time_ns

        @functools.wraps(fetch)
        def timed_fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
            if timer._off or worker_info() is None:
                return fetch(fetcher, possibly_batched_index)
            try:
                runq_before = timer._runq()
            except Exception:  # noqa: BLE001 - never the user's problem
                timer._off = True
                return fetch(fetcher, possibly_batched_index)
            # the CPU clock is read inside the wall clock's interval: on CPU never exceeds the wall
            start = monotonic_ns()
            cpu_start = thread_time_ns()
            data = fetch(fetcher, possibly_batched_index)  # StopIteration and the dataset's errors pass as they are
            cpu = thread_time_ns() - cpu_start
            end = monotonic_ns()
            try:
                runq_after = timer._runq()
                runq = runq_after - runq_before if runq_before >= 0 and runq_after >= 0 else -1
                timer._write(f"{os.getpid()} {end} {end - start} {cpu} {runq}\n")
            except Exception:  # noqa: BLE001
                timer._off = True
            return data

        return timed_fetch

    def _runq(self) -> int:
        """The calling thread's run-queue delay so far (ns), -1 where it cannot be read. Current for
        a running thread: it last grew when the thread was put on a CPU. (Its schedstat run time
        lags by up to a tick, so the time on a CPU comes from the thread's CPU clock instead.)"""
        if self._pid != os.getpid():  # first batch of this worker
            self._pid, self._lines, self._fd = os.getpid(), 0, -1
            try:
                self._stat_fd = os.open(_SCHEDSTAT, os.O_RDONLY)
            except OSError:
                self._stat_fd = -1
        return int(os.pread(self._stat_fd, 128, 0).split()[1]) if self._stat_fd >= 0 else -1

    def _write(self, line: str) -> None:
        if self._lines >= MAX_LINES_PER_WORKER:
            return
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._fd, line.encode("ascii"))
        self._lines += 1


def install(path: Path, patch: Callable[[Any, str, Any], Any]) -> None:
    """Wrap both dataset fetchers with one timer writing to ``path``; ``patch(owner, name, value)``
    replaces an attribute undoably (capture's hooks)."""
    from torch.utils.data import get_worker_info
    from torch.utils.data._utils import fetch

    timer = WorkerBatchTimer(path)
    for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        patch(cls, "fetch", timer.wrap(cls.fetch, get_worker_info))


def read_rows(path: Path, worker_pids: set[int]) -> tuple[tuple[int, ...], ...] | None:
    """The complete lines of ``path`` from the given workers as (pid, end_ns, wall_ns, cpu_ns,
    runq_ns), the last :data:`MAX_RECORD_ROWS`; None when there is no such line. A damaged line
    (a worker killed mid-write, a stray writer) is skipped."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_LINES_PER_WORKER * 64 * max(1, len(worker_pids)))
    except OSError:
        return None
    rows: list[tuple[int, ...]] = []
    for line in data.split(b"\n")[:-1]:  # the last piece is incomplete (or empty)
        fields = line.split()
        if len(fields) != 5:
            continue
        try:
            row = tuple(int(field) for field in fields)
        except ValueError:
            continue
        if row[0] in worker_pids and row[2] >= 0 and row[3] >= 0:
            rows.append(row)
    return tuple(rows[-MAX_RECORD_ROWS:]) or None
