"""Fixtures for rule tests."""

from __future__ import annotations

import pytest

from stepscope.analysis.evidence import MacroSignals, TraceEvidence
from stepscope.diagnosis.context import build_context


@pytest.fixture
def ctx_of():
    def build(record=None, signals: dict | MacroSignals | None = None, trace: dict | None = None, ranks=()):
        if isinstance(signals, dict):
            signals = MacroSignals(**signals)
        if isinstance(trace, dict):
            trace = TraceEvidence(**trace)
        return build_context(record, signals, trace, ranks)
    return build
