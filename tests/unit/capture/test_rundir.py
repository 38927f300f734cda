"""Claiming a run directory: one run per directory, ranks of one job share it, --force replaces."""

from __future__ import annotations

import os

import pytest

from stepscope.capture import rundir
from stepscope.errors import CaptureError


@pytest.fixture
def plain_process(monkeypatch):
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_a_new_directory_is_claimed_with_an_owner_lock(tmp_path, plain_process):
    path, lock = rundir.claim_run_dir(tmp_path / "out", 0)
    try:
        assert path.is_absolute() and path == tmp_path / "out"
        assert os.listdir(path) == ["rank0.lock"]
        assert f'"pid": {os.getpid()}' in (path / "rank0.lock").read_text()
    finally:
        lock.release()


def test_a_directory_in_use_is_refused_even_with_force(tmp_path, plain_process):
    _, lock = rundir.claim_run_dir(tmp_path / "out", 0)
    try:
        with pytest.raises(CaptureError, match="in use"):
            rundir.claim_run_dir(tmp_path / "out", 0, force=True)
    finally:
        lock.release()


def test_another_runs_files_are_refused_then_removed_with_force(tmp_path, plain_process):
    out = tmp_path / "out"
    _, lock = rundir.claim_run_dir(out, 0)
    lock.release()
    for name in ("record.rank0.json.gz", "samples.rank0.jsonl.gz", "worker_batches.rank0.txt", "report.json"):
        (out / name).write_bytes(b"old")
    (out / "traces").mkdir()
    (out / "notes.txt").write_text("the user's own file")
    with pytest.raises(CaptureError, match=r"holds another run .*--force"):
        rundir.claim_run_dir(out, 0)
    _, lock = rundir.claim_run_dir(out, 0, force=True)
    lock.release()
    assert sorted(os.listdir(out)) == ["notes.txt", "rank0.lock"]


def test_files_without_any_lock_are_another_run(tmp_path, plain_process):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "record.rank1.json.gz").write_bytes(b"old")
    with pytest.raises(CaptureError, match="holds another run"):
        rundir.claim_run_dir(tmp_path / "out", 0)


def test_ranks_of_one_torchrun_job_share_the_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    out = tmp_path / "out"
    _, lock0 = rundir.claim_run_dir(out, 0)
    (out / "samples.rank0.jsonl.gz").write_bytes(b"rank 0 is sampling")
    _, lock1 = rundir.claim_run_dir(out, 1)
    assert (out / "samples.rank0.jsonl.gz").read_bytes() == b"rank 0 is sampling"
    lock0.release()
    lock1.release()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job8")
    with pytest.raises(CaptureError, match="holds another run"):
        rundir.claim_run_dir(out, 0)


def test_ranks_claiming_at_the_same_moment_both_get_the_directory(tmp_path, monkeypatch):
    """Both ranks hold their own lock before either looks at the other's: each must already say
    which job it belongs to, or each takes the other for a foreign run in use."""
    import threading

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    both_locked = threading.Barrier(2, timeout=10)
    look = rundir._foreign_entries

    def after_both_locked(*args):
        both_locked.wait()
        return look(*args)

    monkeypatch.setattr(rundir, "_foreign_entries", after_both_locked)
    results: dict[int, object] = {}

    def claim(rank: int) -> None:
        try:
            results[rank] = rundir.claim_run_dir(tmp_path / "out", rank)[1]
        except CaptureError as exc:
            results[rank] = exc

    threads = [threading.Thread(target=claim, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(result, rundir.RunDirLock) for result in results.values()), results
    for result in results.values():
        result.release()


def test_a_ranks_files_from_an_earlier_attempt_of_the_same_job_are_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    out = tmp_path / "out"
    _, lock = rundir.claim_run_dir(out, 0)
    lock.release()
    for name in ("samples.rank0.jsonl.gz", "worker_batches.rank0.txt"):
        (out / name).write_bytes(b"first attempt")
    _, lock = rundir.claim_run_dir(out, 0)
    lock.release()
    assert not (out / "samples.rank0.jsonl.gz").exists() and not (out / "worker_batches.rank0.txt").exists()


def test_a_derived_name_that_is_a_symlink_is_refused(tmp_path, plain_process):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "planted")
    with pytest.raises(CaptureError, match="symbolic link"):
        rundir.claim_run_dir(tmp_path / "planted", 0, derived=True)
