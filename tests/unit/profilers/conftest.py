"""Fixtures for the profiler tests: captured console output and a controllable clock."""

from __future__ import annotations

import io

import pytest

from stepscope.profilers import Profiler


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Everything profilers print to the console, instead of standard error."""
    stream = io.StringIO()
    monkeypatch.setattr(Profiler, "console_stream", stream)
    return stream


class FakeClock:
    """A ``perf_counter`` replacement that advances only when told to."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock(100.0)
    monkeypatch.setattr("stepscope.profilers.simple._perf_counter", clock)
    return clock
