"""A full disk under a command's own output is one line, never a traceback, and leaves no empty or
half-written file: stdout redirected to ``/dev/full`` (ENOSPC on every write, no root needed), and
a TensorBoard log directory on a full tmpfs (root only: skipped without)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import cli_env

DATA = Path(__file__).resolve().parents[1] / "data"
RUN = DATA / "runs" / "small-batch-minor-input-wait"
TRACE = DATA / "traces" / "cpu_plain.pt.trace.json"


def _to_dev_full(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "stepscope", *args], cwd=cwd, env=cli_env({"STEPSCOPE_INDEX": "off"}),
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("args", [
    ["report", str(RUN)],
    ["report", str(RUN), "--format", "json"],
    ["analyze", str(TRACE)],
    ["diff", str(RUN), str(RUN)],
], ids=["report", "report-json", "analyze", "diff"])
def test_stdout_on_a_full_disk_is_one_line_and_exit_1(tmp_path, args):
    result = _to_dev_full(args, tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr == "stepscope: error: cannot write the output: No space left on device\n", result.stderr


@pytest.mark.parametrize("export", ["tensorboard", "perfetto", "html"])
def test_an_export_on_a_full_disk_names_its_file_and_leaves_none(tmp_path, export):
    if export == "tensorboard":
        pytest.importorskip("tensorboard")
    if shutil.which("mount") is None:
        pytest.skip("no mount here")
    mount = tmp_path / "full"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("no tmpfs can be mounted here (it needs root)")
    try:
        (mount / "fill").write_bytes(b"\0" * 4096)
        target = {"tensorboard": ["--tensorboard", str(mount / "tb")], "perfetto": ["--perfetto", str(mount / "p.json")],
                  "html": ["--html", "-o", str(mount / "r.html")]}[export]
        result = subprocess.run([sys.executable, "-m", "stepscope", "report", str(RUN), *target], cwd=tmp_path,
                                env=cli_env({"STEPSCOPE_INDEX": "off"}), capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "No space left on device" in lines[0], result.stderr
        named = {"tensorboard": f"{mount}/tb/events.out.tfevents.", "perfetto": f"{mount}/p.json",
                 "html": f"{mount}/r.html"}[export]
        assert named in lines[0]  # the file, not "output" nor a temporary
        assert sorted(path.name for path in mount.rglob("*") if path.is_file()) == ["fill"]  # no empty or half file
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
