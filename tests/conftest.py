"""Shared fixtures: child processes, a fake clock, both CLI entry points (helpers: ``support.py``)."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest
from fakes.clock import FakeClock
from support import CONSOLE_SCRIPT

# Runs made by tests (and their subprocesses, which inherit this) go to a throw-away run index,
# never to the user's history.
os.environ["STEPSCOPE_INDEX"] = os.path.join(tempfile.mkdtemp(prefix="stepscope-index-"), "runs.sqlite")


@pytest.fixture
def children():
    """Processes a test starts; killed by pid afterwards."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock(1_000_000)


@pytest.fixture(params=["module", "console"])
def entry(request) -> str:
    """Run CLI tests through both ``python -m stepscope`` and the ``stepscope`` console script."""
    if request.param == "console" and not CONSOLE_SCRIPT.exists():
        pytest.skip("the stepscope console script is not installed in this environment")
    return request.param


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """End-to-end (``slow``) tests first, each group in its own order: the parallel part then ends
    on short tests that spread over the workers, not on one long run that leaves a core idle."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
