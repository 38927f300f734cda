"""``test_run_cmd.py`` runs real scripts under ``stepscope run`` end to end (torch imports, demos):
marked ``slow``, so ``make test-fast`` leaves it to ``make test``. The other CLI tests stay fast."""

from __future__ import annotations

from pathlib import Path

import pytest

END_TO_END = {Path(__file__).resolve().parent / "test_run_cmd.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.path)).resolve() in END_TO_END:
            item.add_marker(pytest.mark.slow)
