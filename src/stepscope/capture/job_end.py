"""Which rank of a job writes the merged report, when a rank has failed.

A job ends cleanly: rank 0 saves its record, waits (bounded) for the other ranks' and merges them,
as before. A job where a rank fails — an exception, ``sys.exit``/``os._exit`` with a non-zero code,
a signal, or a process killed outright (SIGKILL, the OOM killer) — cannot wait for rank 0: rank 0
may be the rank that died, and a failing rank's peers usually end only *after* it (they wait for it
in a collective until its sockets close, or until the launcher tears the job down with SIGTERM).
So the merged report is written by the **last rank to finish**: every rank, once its record is
saved, looks at the others; when each of them has saved its record or has ended (its
``rank<R>.lock`` is no longer held), and the job has failed, it merges. A failing rank that is not
the last waits a moment (:data:`FINISH_WAIT_S`) for the others, then ends, so that the ranks
blocked on it in a collective can end too — and the last of them merges.

Two ranks that finish together could both see every other rank finished: the check and the claim
run under an exclusive ``flock`` of the run directory, and a claim is written into the claiming
rank's own lock file (``"merges": true``), which the other ranks read under the same lock. A clean
rank 0 claims before it waits, so a rank that fails while rank 0 waits leaves the merge to it.

Only the ranks whose files this directory holds are seen: on nodes without a shared filesystem a
failed job's merge is left to ``stepscope report``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stepscope.record import layout


def failed(meta: Any) -> bool:
    """Whether a record's metadata says its rank failed (a non-zero exit, an exception, a signal)."""
    return bool(meta.exit_code) or meta.exception is not None or meta.interrupted_by is not None


def lock_still_needed(record: Any, run_dir: Path, merged: bool, job: Any) -> bool:
    """Whether this rank's ``rank<R>.lock`` must stay once its report is written.

    The lock marks a rank that ended without its record (the report says so from it) and carries a
    merge's claim while a failed job's ranks finish. It goes when its record is saved and nothing
    will read it: a run of one process; a rank of a job that did not fail and does not merge (the
    merging rank sees it finished by its record); the merging rank once the job's report holds
    every rank and no failure (no rank is left to read its claim)."""
    if not layout.record_path(run_dir, record.meta.rank).exists():
        return True
    if record.meta.world_size <= 1:
        return False
    if failed(record.meta):
        return True
    if not merged:
        return False
    return job is None or job.failure is not None or bool(job.missing)


def drop_lock(run_dir: Path, rank: int) -> None:
    """Remove this rank's lock file (still held by this process until it exits: harmless)."""
    with contextlib.suppress(OSError):
        layout.lock_path(run_dir, rank).unlink()


#: How long a rank of a failed job waits for the others to finish before leaving the merge to
#: them: a rank killed outright may release its lock a moment after its peers saw its sockets close.
FINISH_WAIT_S = 3.0


def decide_merge(run_dir: Path, rank: int, world_size: int, own_failed: bool,
                 finish_wait_s: float = FINISH_WAIT_S) -> bool:
    """Whether this rank, its record saved, writes the job's merged report (see the module docstring).

    Never raises: a directory that cannot be locked or read leaves the merge to rank 0 (when it
    ended cleanly), as before."""
    deadline = time.monotonic() + finish_wait_s
    try:
        while True:
            with _directory_lock(run_dir):
                if _claimed_by_other(run_dir, rank, world_size):
                    return False
                if rank == 0 and not own_failed:
                    _claim(run_dir, rank)  # rank 0 waits for the others and merges, as in a clean job
                    return True
                if not (own_failed or _a_peer_failed(run_dir, rank, world_size)):
                    return False
                if all(_finished(run_dir, other) for other in range(world_size) if other != rank):
                    _claim(run_dir, rank)
                    return True
            if time.monotonic() >= deadline:
                return False  # a rank still runs (maybe waiting for this one): the last one merges
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - coordinating the merge must never cost the run
        return rank == 0 and not own_failed


@contextlib.contextmanager
def _directory_lock(run_dir: Path) -> Iterator[None]:
    descriptor = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # held for a few file checks only
        yield
    finally:
        os.close(descriptor)


def _finished(run_dir: Path, rank: int) -> bool:
    """The rank saved its record, or has ended (its lock is no longer held)."""
    return layout.record_path(run_dir, rank).exists() or not layout.rank_may_still_write(run_dir, rank)


def _a_peer_failed(run_dir: Path, rank: int, world_size: int) -> bool:
    """Another rank has ended without a record, or its record says it failed."""
    from stepscope.record.store import load_record

    for other in range(world_size):
        if other == rank:
            continue
        path = layout.record_path(run_dir, other)
        if path.exists():
            try:
                if failed(load_record(path, with_samples=False).meta):
                    return True
            except Exception:  # noqa: BLE001 - unreadable: the report will say so
                continue
        elif layout.lock_path(run_dir, other).exists() and not layout.rank_may_still_write(run_dir, other):
            return True  # it ended without writing its record
    return False


def _lock_content(run_dir: Path, rank: int) -> dict[str, Any]:
    try:
        content = json.loads(layout.lock_path(run_dir, rank).read_bytes() or b"{}")
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def _own_lock(path: Path) -> Any:
    from stepscope.capture.session import _HELD_LOCKS

    return next((lock for lock in _HELD_LOCKS if Path(lock.path) == path and lock.descriptor >= 0), None)


def _claimed_by_other(run_dir: Path, rank: int, world_size: int) -> bool:
    own = _lock_content(run_dir, rank)
    job = own.get("job")
    for other in range(world_size):
        if other != rank:
            content = _lock_content(run_dir, other)
            if content.get("merges") and content.get("job") == job:
                return True
    return False


def _claim(run_dir: Path, rank: int) -> None:
    lock = _own_lock(layout.lock_path(run_dir, rank))
    if lock is None:
        raise RuntimeError("this rank does not hold its lock")  # no claim, no merge
    lock.write({**_lock_content(run_dir, rank), "merges": True})


__all__ = ["decide_merge", "drop_lock", "failed", "lock_still_needed"]
