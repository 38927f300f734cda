"""Every test here runs real training end to end (torch, worker processes, Lightning, torchrun):
marked ``slow``, so ``make test-fast`` (``pytest -m "not slow"``) leaves them to ``make test``."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.slow)
