"""The analysis commands switch numpy's transparent huge-page advice off in their own processes
(``stepscope.cli.main._no_huge_page_advice``) and have the C heap reuse freed arrays
(``_reuse_freed_memory``): never where the user's code runs, never over the environment's own
setting, never in a process that loaded numpy before (a library caller's)."""

from __future__ import annotations

import os
import sys

import pytest

from stepscope.cli import main as cli_main
from support import cli_env, run_cli, run_command

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
    for command in sorted(cli_main.ANALYSIS_COMMANDS):
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


#: Calls the heap switch for argv[1] and a small trace's load decision, then allocates, writes and
#: frees 64 MiB twice and prints whether the heap reuses freed blocks and the page faults of the
#: second allocation (huge pages off: 4 KiB a fault).
REUSE_PROBE = """
import os, resource, sys
os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"
from stepscope.cli.main import _reuse_freed_memory
allowed = _reuse_freed_memory(sys.argv[1] if len(sys.argv) > 1 else None)
from stepscope.traces.spill import reuse_freed_memory
made = reuse_freed_memory(sys.executable, 1 << 20)  # as for a 1 MiB trace (any readable file)
assert allowed or not made  # never where the command does not allow it
import numpy as np
block = np.ones(8 << 20)
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = np.ones(8 << 20)
print(made, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _reuse_probe(tmp_path, *args: str, env: dict[str, str] | None = None) -> tuple[str, int]:
    result = run_command([sys.executable, "-c", REUSE_PROBE, *args], tmp_path, cli_env(env), timeout=60)
    assert result.returncode == 0, result.stderr
    made, faults = result.stdout.split()
    return made, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_an_analysis_command_s_new_arrays_reuse_freed_ones_and_a_user_s_run_is_left_alone(tmp_path):
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    made, faults = _reuse_probe(tmp_path, "analyze")
    if made != "True":
        pytest.skip("this C library has no mallopt (not glibc)")
    assert faults < pages // 20, faults
    for command in ("run", "demo", "try", "tune-loader"):  # the user's code keeps its allocator as it is
        assert _reuse_probe(tmp_path, command) == ("False", pytest.approx(pages, rel=0.1)), command
    for env in ({"MALLOC_MMAP_MAX_": "65536"}, {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=65536"},
                {"STEPSCOPE_REUSE_MEMORY": "off"}):
        made, faults = _reuse_probe(tmp_path, "analyze", env=env)  # the environment's own setting wins
        assert made == "False" and faults > pages // 2, env


def test_a_reuse_setting_that_is_neither_on_nor_off_is_one_error_line_and_exit_2(tmp_path, monkeypatch):
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    result = run_cli(["analyze", str(trace)], tmp_path, env={"STEPSCOPE_REUSE_MEMORY": "disable"}, cold=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "stepscope: error: STEPSCOPE_REUSE_MEMORY='disable' is not a setting: use on or off "
        "(off keeps glibc's malloc defaults)"]
    monkeypatch.setenv("STEPSCOPE_REUSE_MEMORY", "disable")
    monkeypatch.delitem(sys.modules, "numpy", raising=False)  # as if typed: only the analysis commands read it
    assert not cli_main._reuse_freed_memory("run")
