"""Fixtures for the profiler tests: captured console output and a controllable clock."""

from __future__ import annotations

import io

import pytest
from fakes.clock import FakeClock

from stepscope.profilers import Profiler


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Everything profilers print to the console, instead of standard error."""
    stream = io.StringIO()
    monkeypatch.setattr(Profiler, "console_stream", stream)
    return stream


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock(100.0)
    monkeypatch.setattr("stepscope.profilers.simple._perf_counter", clock)
    return clock
