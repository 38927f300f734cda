"""The analysis commands switch numpy's transparent huge-page advice off in their own processes
(``stepscope.cli.main._no_huge_page_advice``): never where the user's code runs, never over the
environment's own setting, never in a process that loaded numpy before (a library caller's)."""

from __future__ import annotations

import os
import sys

import pytest

from stepscope.cli import main as cli_main
from support import cli_env, run_command

#: Calls the switch for the command named in argv[1], then loads numpy and prints: whether the switch
#: was made, the environment's value, and numpy's advice as loaded (its setter returns the old value).
PROBE = """
import os, sys
from stepscope.cli.main import _no_huge_page_advice
made = _no_huge_page_advice(sys.argv[1] if len(sys.argv) > 1 else None)
import numpy
try:
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _set_madvise_hugepage
print(made, os.environ.get("NUMPY_MADVISE_HUGEPAGE"), _set_madvise_hugepage(True))
"""


def _probe(tmp_path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    base = {key: value for key, value in cli_env(env).items() if key != "NUMPY_MADVISE_HUGEPAGE" or env}
    result = run_command([sys.executable, "-c", PROBE, *args], tmp_path, base, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_an_analysis_command_loads_numpy_without_the_advice_and_its_workers_inherit_it(tmp_path):
    default = _probe(tmp_path)[2]  # numpy's own choice here (True where the kernel has huge pages)
    for command in sorted(cli_main.NO_HUGE_PAGE_ADVICE):
        assert _probe(tmp_path, command) == ["True", "0", "False"], command
    # the commands that run the user's code or time a loop leave numpy as it is
    for command in ("run", "demo", "try", "tune-loader", "monitor", "gpu-procs"):
        assert _probe(tmp_path, command) == ["False", "None", default], command


def test_the_environment_s_own_setting_is_kept(tmp_path):
    assert _probe(tmp_path, "analyze", env={"NUMPY_MADVISE_HUGEPAGE": "1"})[:2] == ["False", "1"]


def test_a_process_that_loaded_numpy_before_is_left_alone(monkeypatch):
    import numpy  # noqa: F401 - loaded in this process, as a library caller's has it

    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    assert not cli_main._no_huge_page_advice("analyze")
    assert "NUMPY_MADVISE_HUGEPAGE" not in os.environ


@pytest.mark.parametrize("command", [None, "nope"])
def test_no_command_or_an_unknown_one_changes_nothing(monkeypatch, command):
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    monkeypatch.delitem(sys.modules, "numpy", raising=False)  # as if not loaded: still nothing for these
    assert not cli_main._no_huge_page_advice(command)
    assert "NUMPY_MADVISE_HUGEPAGE" not in os.environ
