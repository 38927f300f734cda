"""`stepscope tune-loader`: a real factory with real worker processes, and bad input in one line."""

from __future__ import annotations

import re

import pytest
from support import run_cli, write_script

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
"""


def test_tunes_a_waiting_loader_to_several_workers(tmp_path):
    write_script(tmp_path, "loaders.py", FACTORY)
    result = run_cli(["tune-loader", "loaders:make_loader", "--budget-s", "30", "--batches", "10",
                      "--max-workers", "4"], cwd=tmp_path, timeout=120)
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
    result = run_cli(["tune-loader", "loaders.py:make_loader", "--budget-s", "4", "--batches", "4",
                      "--max-workers", "1"], cwd=tmp_path, timeout=120, entry=entry)
    assert result.returncode == 0, result.stderr
    assert "best:" in result.stdout


def test_bad_input_from_the_console_script(tmp_path, entry):
    result = run_cli(["tune-loader", "no_such_module:make"], cwd=tmp_path, timeout=120, entry=entry)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("stepscope: error: cannot import module 'no_such_module'")
    assert result.stderr.count("\n") == 1
