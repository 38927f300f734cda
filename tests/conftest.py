"""Shared fixtures: child processes, a fake clock, both CLI entry points (helpers: ``support.py``)."""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from fakes.clock import FakeClock
import zygote
from support import CONSOLE_SCRIPT, cli_env, scenario_env

# Runs made by tests (and their subprocesses, which inherit this) go to a throw-away run index,
# never to the user's history; it is removed when this test process ends.
_INDEX_DIR = tempfile.mkdtemp(prefix="stepscope-index-")
os.environ["STEPSCOPE_INDEX"] = os.path.join(_INDEX_DIR, "runs.sqlite")
atexit.register(shutil.rmtree, _INDEX_DIR, ignore_errors=True)

# The tests send Ctrl-C to the scripts they start, which inherit an ignored SIGINT: a shell without
# job control starts a background job (`make test &`) with SIGINT ignored, and python then installs
# no handler of its own (seen: eleven interrupt tests failed in a suite started that way). A
# handler here is reset to the default action in every child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: The signals the tests send to the scripts they start: children inherit an ignored one.
_SENT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Each test leaves the worker's handlers as it found them: a handler left ignored by code run
    in-process would make every later test's child ignore the Ctrl-C it is sent."""
    before = {signum: signal.getsignal(signum) for signum in _SENT}
    yield
    for signum, handler in before.items():
        if handler is not None and signal.getsignal(signum) != handler:
            signal.signal(signum, handler)


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
    if items and items[0].get_closest_marker("slow") is not None and not config.getoption("collectonly", False):
        # the end-to-end tests' warm interpreters, started now: their first requests are forked too.
        # A pytest-xdist worker lets them warm up beside its first tests; a process alone (the serial
        # tests: the zoo's scenarios run with the machine's default threads) waits for them, so that
        # nothing warms up while a test measures.
        worker = "PYTEST_XDIST_WORKER" in os.environ
        serial = any(item.get_closest_marker("serial") is not None for item in items)
        zygote.prestart(cli_env(), *([scenario_env()] if serial and not worker else []), wait=not worker)


# -- the workers' long-lived objects out of the cycle collector's scans --------------------------
# A worker holds every test module, torch and, once a test imported them, Lightning and Hugging
# Face (~360k objects): each full collection scans them all, and a test that builds a trace's tables
# in-process triggers dozens (the 87 MB reference trace's dict decode took 3.6 s beside those modules,
# 1.0 s with them frozen). Frozen after collection, and again once tests imported many more modules;
# a collection first, so that no garbage is frozen with them.

#: how many modules a worker had when its objects were last frozen
_frozen_at: list[int] = []
#: imports since then that call for freezing again
_FREEZE_AFTER_MODULES = 200


def _freeze_long_lived() -> None:
    gc.collect()
    gc.freeze()
    _frozen_at[:] = [len(sys.modules)]


def pytest_collection_finish(session):
    _freeze_long_lived()


def pytest_runtest_logfinish(nodeid, location):
    if _frozen_at and len(sys.modules) - _frozen_at[0] >= _FREEZE_AFTER_MODULES:
        _freeze_long_lived()
