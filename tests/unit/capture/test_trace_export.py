"""The torch.profiler trace export on a full disk (a real tmpfs; it needs root to mount)."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest
import torch
from torch.profiler import profile

from stepscope.capture.torch_windows import _export_whole


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("no tmpfs can be mounted here (it needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_failed_export_gives_its_space_back_while_the_profiler_is_still_referenced(small_disk):
    """torch keeps its half-written temporary open after the write fails; removing the file alone
    frees nothing until the profiler is collected, so the record written next found the disk full."""
    with profile() as profiler:
        for _ in range(30):
            torch.randn(64, 64) @ torch.randn(64, 64)
    with pytest.raises(OSError) as raised:
        _export_whole(profiler, small_disk / "rank0.trace.json")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(small_disk / "rank0.trace.json")
    assert os.listdir(small_disk) == []
    stats = os.statvfs(small_disk)
    assert stats.f_bfree == stats.f_blocks, "the removed temporary still holds its space"
    assert profiler is not None  # still referenced: the space came back without the garbage collector
