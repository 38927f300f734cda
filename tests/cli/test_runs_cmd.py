"""`stepscope runs` on a history it may read but not write: a read-only index file, a read-only
directory (as on a read-only mount). Root writes through file modes, so the subprocess drops the
capabilities that let it (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) when the tests run as root."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from support import run_cli

from stepscope.record.run_index import add_run

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def _as_plain_user() -> None:
    """In the child before exec: file modes apply to root too (dropped from the bounding set, the
    capabilities are not regained at exec)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _history(folder: Path) -> Path:
    path = folder / "runs.sqlite"
    for index, name in enumerate(("first", "second")):
        add_run({"run_dir": str(folder / name), "started_at": 1_700_000_000.0 + index, "script": "train.py",
                 "argv": "train.py", "tags": json.dumps(["nightly"]), "steps": 10, "step_time_s": 0.01}, path)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def read_only(tmp_path):
    made: list[Path] = []

    def make(path: Path, directory: bool) -> None:
        path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        if directory:
            path.parent.chmod(0o555)
            made.append(path.parent)

    yield make
    for folder in made:
        folder.chmod(0o755)


@pytest.mark.parametrize("directory", [False, True], ids=["read-only file", "read-only directory"])
def test_a_history_that_cannot_be_written_is_listed(tmp_path, read_only, directory):
    index = _history(tmp_path / "history")
    before = _digest(index)
    read_only(index, directory)
    probe = run_cli(["runs", "--index", str(index), "--format", "json"], tmp_path, preexec_fn=_as_plain_user,
                    timeout=120)
    assert probe.returncode == 0, probe.stderr
    document = json.loads(probe.stdout)
    assert [Path(row["run_dir"]).name for row in document["runs"]] == ["first", "second"]
    text = run_cli(["runs", "--index", str(index), "--tag", "nightly"], tmp_path, preexec_fn=_as_plain_user,
                   timeout=120)
    assert text.returncode == 0 and "2 run(s)" in text.stdout, text.stderr
    assert _digest(index) == before  # reading wrote nothing
    if directory:
        assert sorted(item.name for item in index.parent.iterdir()) == ["runs.sqlite"]


def test_writing_a_read_only_history_is_one_line(tmp_path, read_only):
    index = _history(tmp_path / "history")
    read_only(index, False)
    (tmp_path / "runs").mkdir()
    result = run_cli(["runs", "--index", str(index), "--reindex", str(tmp_path / "runs")], tmp_path,
                     preexec_fn=_as_plain_user, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"stepscope: error: {index}: the run index cannot be written")
    assert "Traceback" not in result.stderr
