"""A killed run's ``rank<R>.lock`` (nobody holds it) neither blocks nor confuses the next run into
the same directory; what the killed run did write is still protected."""

from __future__ import annotations

import json
import os

import pytest

from stepscope.capture import rundir
from stepscope.errors import CaptureError


@pytest.fixture
def plain_process(monkeypatch):
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _stale_lock(out, rank: int, content: dict | None) -> None:
    out.mkdir(exist_ok=True)
    (out / f"rank{rank}.lock").write_text("" if content is None else json.dumps(content))


def test_a_directory_holding_only_a_killed_runs_lock_is_taken_without_force(tmp_path, plain_process):
    out = tmp_path / "out"
    _stale_lock(out, 0, {"job": "process:host:123:1", "pid": 123, "rank": 0})
    path, lock = rundir.claim_run_dir(out, 0)
    try:
        assert os.listdir(path) == ["rank0.lock"]
        assert json.loads((path / "rank0.lock").read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_an_empty_stale_lock_of_another_rank_is_not_a_run_in_use(tmp_path, plain_process):
    """Killed between creating its lock and writing its owner: the empty, unheld file read as
    'in use by another run', which --force could not take either."""
    out = tmp_path / "out"
    _stale_lock(out, 1, None)
    _stale_lock(out, 2, {"job": "torchelastic:old", "pid": 99, "rank": 2})
    path, lock = rundir.claim_run_dir(out, 0)
    try:
        assert os.listdir(path) == ["rank0.lock"]  # no stale rank reads as a rank of this run that ended
    finally:
        lock.release()


def test_a_killed_runs_checkpoint_is_still_another_run(tmp_path, plain_process):
    out = tmp_path / "out"
    _stale_lock(out, 0, {"job": "process:host:123:1", "pid": 123, "rank": 0})
    (out / "record.rank0.partial.json.gz").write_bytes(b"the killed run's last checkpoint")
    with pytest.raises(CaptureError, match=r"holds another run \(rank0.lock of an earlier run, "
                                           r"record.rank0.partial.json.gz\)"):
        rundir.claim_run_dir(out, 0)
    assert (out / "record.rank0.partial.json.gz").exists()
    _, lock = rundir.claim_run_dir(out, 0, force=True)
    lock.release()
    assert os.listdir(out) == ["rank0.lock"]


def test_temporary_files_of_a_killed_write_are_removed_and_are_no_run(tmp_path, plain_process):
    out = tmp_path / "out"
    _stale_lock(out, 0, {"job": "process:host:123:1", "pid": 123, "rank": 0})
    (out / ".record.rank0.partial.json.gz.0123456789abcdef.tmp").write_bytes(b"half")
    (out / ".report.json.fedcba9876543210.tmp").write_bytes(b"{")
    (out / ".record.rank1.json.gz.0123456789abcdef.tmp").write_bytes(b"rank 1's, not ours")
    (out / "notes.txt").write_text("the user's own file")
    _, lock = rundir.claim_run_dir(out, 0)
    lock.release()
    assert sorted(os.listdir(out)) == [".record.rank1.json.gz.0123456789abcdef.tmp", "notes.txt", "rank0.lock"]


def test_a_lock_held_by_a_live_process_of_another_run_still_refuses(tmp_path, plain_process):
    _, held = rundir.claim_run_dir(tmp_path / "out", 0)
    try:
        with pytest.raises(CaptureError, match="in use"):
            rundir.claim_run_dir(tmp_path / "out", 1)
    finally:
        held.release()


def _ended(tmp_path, rank: int = 0, world_size: int = 1, exit_code: int = 0, saved: bool = True):
    from types import SimpleNamespace

    from stepscope.record import layout

    if saved:
        layout.record_path(tmp_path, rank).write_bytes(b"")
    meta = SimpleNamespace(rank=rank, world_size=world_size, exit_code=exit_code, exception=None, interrupted_by=None)
    return SimpleNamespace(meta=meta)


def test_a_finished_run_drops_its_lock_where_nothing_will_read_it(tmp_path):
    from types import SimpleNamespace

    from stepscope.capture.job_end import lock_still_needed

    clean_job = SimpleNamespace(failure=None, missing=())
    # one process, its record saved: gone, whatever the exit (the record says how it ended)
    assert not lock_still_needed(_ended(tmp_path), tmp_path, True, None)
    assert not lock_still_needed(_ended(tmp_path, exit_code=1), tmp_path, True, None)
    # a job: a rank that did not fail and does not merge; the merger of a job with every rank and no failure
    assert not lock_still_needed(_ended(tmp_path, 1, 2), tmp_path, False, None)
    assert not lock_still_needed(_ended(tmp_path, 0, 2), tmp_path, True, clean_job)


def test_a_lock_that_still_says_something_stays(tmp_path):
    from types import SimpleNamespace

    from stepscope.capture.job_end import lock_still_needed

    # no record saved: the lock is what says the rank started and ended
    assert lock_still_needed(_ended(tmp_path, saved=False), tmp_path, True, None)
    # a rank that failed, and a merger whose job failed or lacks a rank: a late rank reads the claim
    assert lock_still_needed(_ended(tmp_path, 1, 2, exit_code=1), tmp_path, False, None)
    assert lock_still_needed(_ended(tmp_path, 0, 2), tmp_path, True, SimpleNamespace(failure=object(), missing=()))
    assert lock_still_needed(_ended(tmp_path, 0, 2), tmp_path, True, SimpleNamespace(failure=None, missing=(1,)))
