"""``test_run_cmd.py`` and ``test_run_robustness.py`` run real scripts under ``stepscope run`` end to
end (torch imports, demos, signals): marked ``slow``, so ``make test-fast`` leaves them to ``make
test``. The other CLI tests stay fast."""

from __future__ import annotations

from pathlib import Path

import pytest

END_TO_END = {Path(__file__).resolve().parent / name for name in ("test_run_cmd.py", "test_run_robustness.py")}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.path)).resolve() in END_TO_END:
            item.add_marker(pytest.mark.slow)
