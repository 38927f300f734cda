"""The default run directory: ``./stepscope-runs/<timestamp>-<name>/``.

Under torchrun every rank must pick the *same* directory without talking to the others. The
timestamp therefore comes from the launching agent when there is one: ``TORCHELASTIC_RUN_ID`` if
torchrun was given a real ``--rdzv-id``, else the start time of the parent process (the elastic
agent, shared by all local ranks). On several nodes pass ``--out`` on a shared filesystem.

:func:`claim_run_dir` makes a directory this run's own before anything is written into it; see its
docstring for what it refuses and why.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from stepscope.record import layout

RUNS_DIR = "stepscope-runs"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "run"


def _parent_start_time() -> float | None:
    try:
        import psutil

        return psutil.Process(os.getppid()).create_time()
    except Exception:  # noqa: BLE001
        return None


def default_run_dir(name: str, base: str | Path = RUNS_DIR) -> Path:
    """Directory for a new run of ``name`` (a script or module name)."""
    stem = _safe(Path(name).stem if name.endswith(".py") else name)
    in_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if in_torchrun and run_id and run_id.lower() != "none":
        return Path(base) / f"{_safe(run_id)}-{stem}"
    started = _parent_start_time() if in_torchrun else None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started or time.time()))
    path = Path(base) / f"{stamp}-{stem}"
    if not in_torchrun:
        suffix = 1
        while os.path.lexists(path):  # a dangling symlink is taken too
            suffix += 1
            path = Path(base) / f"{stamp}-{stem}-{suffix}"
    return path


# -- claiming a run directory ------------------------------------------------------------------

#: Names a run writes into its directory (and which therefore mark a directory as holding a run).
_RUN_ENTRY_RE = re.compile(r"^(?:record\.rank\d+(?:\.partial)?\.json\.gz|samples\.rank\d+\.jsonl\.gz"
                           r"|roles\.rank\d+\.jsonl|worker_batches\.rank\d+\.txt|report(?:\.rank\d+)?\.json|report\.html"
                           r"|rank\d+\.lock|traces"
                           r"|profiler)$")
#: The temporary file of an atomic write of one of those names (left only by a killed process).
_TEMPORARY_RE = re.compile(r"^\.(.+)\.[0-9a-f]{16}\.tmp$")
_RANK_RE = re.compile(r"rank(\d+)")
#: How long a lock held by another process may take to show our job (a sibling rank mid-claim).
_LOCK_PATIENCE_S = 1.0
_PREVIOUS_OWNER = " of an earlier run"


def _multi_node() -> bool:
    try:
        return int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def job_id() -> str:
    """Who may share a run directory: the ranks of one torchrun job, else only this process."""
    import socket

    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id.lower() != "none":
        return f"torchelastic:{run_id}"
    if _multi_node() and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        # several nodes' agents share one rendezvous (and its store's address), not a parent process
        return f"rendezvous:{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ:
        return f"agent:{socket.gethostname()}:{os.getppid()}:{_parent_start_time()}"
    return f"process:{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"


class RunDirLock:
    """This rank's hold on its run directory: ``rank<R>.lock``, ``flock``'ed while the process lives.

    The file holds JSON ``{"job", "pid", "rank", "hostname", "start_wall_ns"}``; it stays after the
    run only where it still says something (:func:`stepscope.capture.job_end.lock_still_needed`):
    a rank that ended without its record, a failed job. DataLoader workers inherit the descriptor (harmless: the
    lock is released when the last holder exits).
    """

    def __init__(self, path: Path, descriptor: int, previous: dict):
        self.path = path
        self.descriptor = descriptor
        self.previous = previous  # what the file said before we took it ({} if new)

    def write(self, content: dict) -> None:
        import json

        os.ftruncate(self.descriptor, 0)
        os.pwrite(self.descriptor, json.dumps(content).encode(), 0)

    def release(self) -> None:
        if self.descriptor >= 0:
            os.close(self.descriptor)
            self.descriptor = -1


def claim_run_dir(run_dir: str | Path, rank: int, *, force: bool = False, derived: bool = False) -> tuple[Path, RunDirLock]:
    """Create or take over ``run_dir`` for ``rank``; return its absolute path and the lock.

    Refuses (:class:`~stepscope.errors.CaptureError`, i.e. ``stepscope: error:`` and exit 2):

    - a directory in use: another process holds one of its ``rank<R>.lock`` files and belongs to
      another job (also with ``force``);
    - a directory holding another run — files of a run (records, samples, roles, reports, traces,
      locks) that belong to no rank of this job — unless ``force``: then those files are removed
      first, so nothing of the old run (its samples, say) mixes into this one;
    - a directory owned by another user, and a derived (default) name that is a symbolic link:
      its name is predictable, so someone else could have planted it.

    Ranks of one torchrun job (same :func:`job_id`) share the directory; a rank's own files from an
    earlier attempt of the same job are removed.
    """
    from stepscope.errors import CaptureError

    path = Path(os.path.abspath(run_dir))
    if derived and path.is_symlink():
        raise CaptureError(f"run directory {path} is a symbolic link, not made by stepscope; "
                           "remove it or choose a directory with -o/--out")
    try:
        path.mkdir(parents=True, exist_ok=True)
        info = path.stat()
    except OSError as exc:
        raise CaptureError(f"cannot write the run directory {path} ({exc.strerror or exc}); "
                           "choose another with -o/--out") from None
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise CaptureError(f"run directory {path} belongs to another user; choose another with -o/--out")
    import socket

    job = job_id()
    lock = _take_lock(path, rank, job, force)
    # Say whose lock this is before looking at the others': a sibling rank claiming at the same
    # moment reads our job from it (else each would wait for the other, then call it foreign).
    owner = {"job": job, "pid": os.getpid(), "rank": rank, "hostname": socket.gethostname(),
             "start_wall_ns": time.time_ns()}
    try:
        lock.write(owner)
    except OSError as exc:
        lock.release()
        raise CaptureError(f"cannot write the run directory {path} ({exc.strerror or exc}); "
                           "choose another with -o/--out") from None
    try:
        foreign = _foreign_entries(path, rank, job, lock)
        if foreign and not force:
            shown = ", ".join(sorted(foreign)[:4]) + (", …" if len(foreign) > 4 else "")
            raise CaptureError(f"run directory {path} holds another run ({shown}); pass --force to replace it, "
                               "or choose another with -o/--out")
        for name in foreign | _own_stale_entries(path, rank, job, lock) | _temporary_leftovers(path, rank):
            _remove(path / name)
        _check_writable(path)
    except CaptureError:
        _restore(lock)
        raise
    except OSError as exc:
        _restore(lock)
        raise CaptureError(f"cannot write the run directory {path} ({exc.strerror or exc}); "
                           "choose another with -o/--out") from None
    return path, lock


def _restore(lock: RunDirLock) -> None:
    """Give the lock back as we found it (a refused claim leaves the earlier run's owner mark)."""
    try:
        if lock.previous:
            lock.write(lock.previous)
        else:
            os.ftruncate(lock.descriptor, 0)
    except OSError:
        pass
    lock.release()


def _read_lock(descriptor: int) -> dict:
    import json

    try:
        data = os.pread(descriptor, 65536, 0)
        content = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {"job": "unreadable"}
    return content if isinstance(content, dict) else {"job": "unreadable"}


def _open_lock(lock_path: Path, create: bool) -> int:
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | (os.O_CREAT if create else 0)
    return os.open(lock_path, flags, 0o644)


def _take_lock(path: Path, rank: int, job: str, force: bool) -> RunDirLock:
    """Hold ``rank<R>.lock`` (waiting briefly if a sibling rank holds it while cleaning up)."""
    import fcntl

    from stepscope.errors import CaptureError

    lock_path = layout.lock_path(path, rank)
    deadline = time.monotonic() + _LOCK_PATIENCE_S
    while True:
        try:
            descriptor = _open_lock(lock_path, create=True)
        except OSError as exc:  # a symlink or something else planted under the lock's name
            if force and not lock_path.is_dir():
                _remove(lock_path)
                continue
            raise CaptureError(f"run directory {path} holds another run ({lock_path.name}: {exc.strerror}); "
                               "pass --force to replace it, or choose another with -o/--out") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_lock(descriptor)
            os.close(descriptor)
            if time.monotonic() > deadline:
                raise CaptureError(f"run directory {path} is in use by another run (pid {holder.get('pid', '?')}); "
                                   "--force does not take a running run's directory: wait for it to end or choose another with -o/--out") from None
            time.sleep(0.02)
            continue
        if _same_file(lock_path, descriptor):
            return RunDirLock(lock_path, descriptor, _read_lock(descriptor))
        os.close(descriptor)  # removed under us by a sibling rank: take the new one


def _same_file(lock_path: Path, descriptor: int) -> bool:
    try:
        return os.stat(lock_path, follow_symlinks=False).st_ino == os.fstat(descriptor).st_ino
    except OSError:
        return False


def _lock_jobs(path: Path, own: RunDirLock, job: str) -> dict[int, str | None]:
    """Rank -> job of every other rank's lock file (None: held by a live process of another job)."""
    import fcntl

    jobs: dict[int, str | None] = {}
    for entry in os.scandir(path):
        match = re.fullmatch(r"rank(\d+)\.lock", entry.name)
        if not match or entry.name == own.path.name:
            continue
        try:
            descriptor = _open_lock(Path(entry.path), create=False)
        except OSError:
            jobs[int(match.group(1))] = "unreadable"
            continue
        try:
            deadline = time.monotonic() + _LOCK_PATIENCE_S
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    held = False
                except OSError:
                    held = True
                other = _read_lock(descriptor).get("job")
                if not held or other == job or time.monotonic() > deadline:
                    break
                time.sleep(0.02)  # a sibling rank may not have written its job yet
            # a lock nobody holds is a stale mark of a run that ended ("" when it never said whose:
            # killed between creating and writing it), never a run in use
            jobs[int(match.group(1))] = (other or "") if not held else other if other == job else None
        finally:
            os.close(descriptor)
    return jobs


def _foreign_entries(path: Path, rank: int, job: str, lock: RunDirLock) -> set[str]:
    """Entries of a run that is not this job's; raises if that run is still going."""
    from stepscope.errors import CaptureError

    jobs = _lock_jobs(path, lock, job)
    busy = [other for other, owner in jobs.items() if owner is None]
    if busy:
        raise CaptureError(f"run directory {path} is in use by another run (rank{busy[0]}.lock is held); "
                           "--force does not take a running run's directory: wait for it to end or choose another with -o/--out")
    previous = lock.previous.get("job")
    owners = {**jobs, rank: previous}
    foreign = set()
    for name in os.listdir(path):
        if not _RUN_ENTRY_RE.match(name) or name.endswith(".lock"):
            continue
        match = _RANK_RE.search(name)
        owner_rank = int(match.group(1)) if match else (0 if name == "report.json" else None)
        if owner_rank is not None and owners.get(owner_rank) != job:
            foreign.add(name)
    stale_locks = {f"rank{other}.lock" for other, owner in jobs.items() if owner != job}
    if not foreign and not _unowned_shared_entries(path, owners, job):
        # the earlier run left nothing but its locks (killed before writing anything): they are
        # stale marks, not a run to protect; other ranks' are removed so that none of them reads
        # as a rank of this job that already ended
        for name in stale_locks:
            _remove_unheld_lock(path / name, job)
        return set()
    foreign |= stale_locks
    if previous not in (None, job):
        foreign.add(lock.path.name + _PREVIOUS_OWNER)
    if foreign:  # traces/ and profiler/ hold files of every rank: they go with the old run
        foreign |= {name for name in ("traces", "profiler") if os.path.lexists(path / name)}
    return foreign


def _unowned_shared_entries(path: Path, owners: dict[int, str | None], job: str) -> bool:
    """True when traces/ or profiler/ hold something while no rank of this job owns the directory
    yet: the files of an earlier run (which left its locks) that must not mix into this one."""
    if any(owner == job for owner in owners.values()):
        return False
    for name in ("traces", "profiler"):
        try:
            if any(os.scandir(path / name)):
                return True
        except NotADirectoryError:
            return True
        except OSError:
            continue
    return False


def _remove_unheld_lock(lock_path: Path, job: str) -> None:
    """Remove another rank's stale lock, unless a process holds it (or wrote this job into it)
    meanwhile. Unlinked while we hold it: a rank that opened it just before takes the lock only
    after the unlink, sees the name no longer is its file and makes a new one (``_take_lock``)."""
    import fcntl

    try:
        descriptor = _open_lock(lock_path, create=False)
    except OSError:
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _read_lock(descriptor).get("job") != job and _same_file(lock_path, descriptor):
            lock_path.unlink()
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _temporary_leftovers(path: Path, rank: int) -> set[str]:
    """Temporary files of atomic writes of this rank's entries (rank 0: also the run's reports),
    left by a process killed mid-write: never a complete file, removed when the rank claims."""
    found = set()
    for name in os.listdir(path):
        match = _TEMPORARY_RE.match(name)
        if not match or not _RUN_ENTRY_RE.match(match.group(1)):
            continue
        owner = _RANK_RE.search(match.group(1))
        if (int(owner.group(1)) if owner else 0) == rank:
            found.add(name)
    return found


def _own_stale_entries(path: Path, rank: int, job: str, lock: RunDirLock) -> set[str]:
    """This rank's files from an earlier attempt of the same job (replaced, not mixed in)."""
    if lock.previous.get("job") != job:
        return set()
    names = {f"record.rank{rank}.json.gz", f"record.rank{rank}.partial.json.gz", f"samples.rank{rank}.jsonl.gz",
             f"roles.rank{rank}.jsonl", f"worker_batches.rank{rank}.txt", f"report.rank{rank}.json"}
    names |= {"report.json", "report.html"} if rank == 0 else set()
    return {name for name in names if os.path.lexists(path / name)}


def _remove(path: Path) -> None:
    """Remove a file, a symlink (never its target) or a directory tree; gone already is fine."""
    import shutil

    if path.name.endswith(_PREVIOUS_OWNER):
        return  # our own lock file: rewritten, not removed
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def _check_writable(path: Path) -> None:
    """Create and remove a file with an unpredictable name (raises OSError when the directory refuses)."""
    import secrets

    from stepscope.safe_write import create_exclusive

    probe = path / f".write-test.{secrets.token_hex(8)}"
    create_exclusive(probe).close()
    probe.unlink()
