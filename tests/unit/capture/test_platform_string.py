"""The run record's platform string is read before the script starts: it must not start a child
process (``platform.platform()`` runs ``uname -p`` on Linux, 10-100 ms of start-up) and must read
as ``platform.platform()`` does."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from stepscope.capture import environment


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child process is Linux's")
def test_platform_string_starts_no_process_and_reads_as_platform(monkeypatch):
    expected = platform.platform()
    if platform.processor() not in ("", platform.machine()):
        pytest.skip("this machine's `uname -p` names a processor other than the machine")

    def no_child(*args, **kwargs):
        raise AssertionError(f"a child process was started: {args}")

    monkeypatch.setattr(platform, "_uname_cache", None)  # uname() computed afresh, the processor included
    monkeypatch.setattr(subprocess, "check_output", no_child)
    monkeypatch.setattr(subprocess, "Popen", no_child)
    assert environment.platform_string() == expected
    assert environment.static_meta()["platform"] == expected
