"""`stepscope tune-loader`: a real factory with real worker processes, and bad input in one line."""

from __future__ import annotations

import re
import time

import pytest
from support import run_cli, write_script

from stepscope.children import group_members
from stepscope.cli.main import main

FACTORY = """
    import time

    import torch
    from torch.utils.data import DataLoader, Dataset


    class Waiting(Dataset):
        # each sample waits 2 ms (a remote read): workers overlap the waits even on few cores
        def __len__(self):
            return 100_000

        def __getitem__(self, index):
            time.sleep(0.002)
            return torch.tensor([float(index)])


    def make_loader(num_workers=0, batch_size=8, **overrides):
        return DataLoader(Waiting(), batch_size=batch_size, num_workers=num_workers, **overrides)


    NOT_A_FACTORY = 3


    def broken():
        raise RuntimeError("dataset path not set")


    def wrong_type():
        return [1, 2, 3]


    def hangs(num_workers=0, batch_size=8, **overrides):
        import os
        with open("factory.txt", "w") as out:
            out.write(f"{os.getpid()} {os.getpgid(0)}")
        while True:
            time.sleep(1)


    class StuckInWorkers(Waiting):
        def __getitem__(self, index):
            import os
            from torch.utils.data import get_worker_info
            if get_worker_info() is not None:  # a worker: say where it is, then hang
                with open("workers.txt", "a") as out:
                    out.write(f"{os.getpid()} {os.getpgid(0)}\\n")
                while True:
                    time.sleep(1)
            return super().__getitem__(index)


    def stuck_in_workers(num_workers=0, batch_size=8, **overrides):
        return DataLoader(StuckInWorkers(), batch_size=batch_size, num_workers=num_workers, **overrides)
"""


def test_tunes_a_waiting_loader_to_several_workers(tmp_path):
    write_script(tmp_path, "loaders.py", FACTORY)
    # up to 3 workers (3x the samples/s of none here): every trial forks its workers twice (the pass and
    # the restart), so each worker more costs CPU in most of the ~10 trials
    result = run_cli(["tune-loader", "loaders:make_loader", "--budget-s", "30", "--batches", "10",
                      "--max-workers", "3"], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "samples/s" in out and "◀ best" in out and "current: num_workers=0" in out
    best_workers = int(re.search(r"best:\s+num_workers=(\d+)", out).group(1))
    speedup = float(re.search(r"speed-up ([\d.]+)×", out).group(1))
    assert best_workers >= 2 and speedup > 1.3, out
    assert "│ workers" in out and "│ repeat" in out  # the climb and the noise check ran


@pytest.mark.parametrize(("target", "message"), [
    ("no_such_module:make", "cannot import module 'no_such_module'"),
    ("loaders:missing", "has no attribute 'missing'"),
    ("loaders:NOT_A_FACTORY", "is a int, not a function"),
    ("loaders:broken", "raised RuntimeError: dataset path not set"),
    ("loaders:wrong_type", "returned a list, not a DataLoader"),
    ("loaders", "expected MODULE:FACTORY"),
    ("missing.py:make", "no such file: missing.py"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, target, message):
    write_script(tmp_path, "loaders.py", FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["tune-loader", target, "--budget-s", "5"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("stepscope: error: ") and message in err and err.count("\n") == 1, err


def test_a_file_path_works_as_module_through_both_entry_points(tmp_path, entry):
    write_script(tmp_path, "loaders.py", FACTORY)
    result = run_cli(["tune-loader", "loaders.py:make_loader", "--budget-s", "3", "--batches", "4",
                      "--max-workers", "1"], cwd=tmp_path, timeout=120, entry=entry)
    assert result.returncode == 0, result.stderr
    assert "best:" in result.stdout


def test_bad_input_from_the_console_script(tmp_path, entry):
    result = run_cli(["tune-loader", "no_such_module:make"], cwd=tmp_path, timeout=120, entry=entry)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("stepscope: error: cannot import module 'no_such_module'")
    assert result.stderr.count("\n") == 1


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def test_a_factory_that_hangs_is_stopped_at_the_budget_in_one_line(tmp_path):
    write_script(tmp_path, "loaders.py", FACTORY)
    started = time.monotonic()
    result = run_cli(["tune-loader", "loaders:hangs", "--budget-s", "3"], cwd=tmp_path, timeout=90)
    took = time.monotonic() - started
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("stepscope: error: the factory's own DataLoader setting did not finish a trial "
                                    "within the budget of 3 s: timed out after 3.0 s (stopped with its process group)")
    assert took < 3 + 3 + 15, took  # the budget, the grace period, starting python and torch
    pid, group = map(int, (tmp_path / "factory.txt").read_text().split())
    time.sleep(0.2)
    assert _gone(pid) and group_members(group) == []


def test_workers_that_hang_are_stopped_with_their_trial_and_reported_as_timed_out(tmp_path):
    write_script(tmp_path, "loaders.py", FACTORY)
    result = run_cli(["tune-loader", "loaders:stuck_in_workers", "--budget-s", "4", "--batches", "4",
                      "--max-workers", "1"], cwd=tmp_path, timeout=90)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "current: num_workers=0" in out and "best: num_workers=0" in out  # the one measured setting
    assert "timed out after" in result.stderr and "1 trial(s) timed out and were stopped with their workers" in out
    rows = [line.split() for line in (tmp_path / "workers.txt").read_text().splitlines()]
    time.sleep(0.2)
    assert rows and all(_gone(int(pid)) and group_members(int(group)) == [] for pid, group in rows)


def test_sigterm_stops_the_trial_with_its_workers_and_shows_what_was_measured(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from support import cli_env, popen

    write_script(tmp_path, "loaders.py", FACTORY)
    process = popen([sys.executable, "-m", "stepscope", "tune-loader", "loaders:stuck_in_workers", "--budget-s", "60",
                     "--batches", "4", "--max-workers", "1"], tmp_path, cli_env(),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = tmp_path / "workers.txt"
    try:
        end = time.monotonic() + 60
        while not (workers.exists() and workers.read_text()) and time.monotonic() < end and process.poll() is None:
            time.sleep(0.1)
        assert workers.exists(), process.communicate(timeout=30)
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        out, err = process.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGTERM and took < 3 + 5, (took, err)
    assert "stopped by SIGTERM after 1 trials: what was measured is kept" in " ".join(out.split())
    assert "current: num_workers=0" in out
    time.sleep(0.2)
    for line in workers.read_text().splitlines():
        pid, group = map(int, line.split())
        assert _gone(pid) and group_members(group) == [] and group != os.getpgid(0)
