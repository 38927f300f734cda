"""The GPU check script runs in CPU mode here, so it keeps working for the machines that have one."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from support import cli_env, run_command

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"

#: The script's checks in groups, one test case each (``--only``), so they spread over the workers;
#: the checks that read the same run are in one group (the script runs it once for them all).
GROUPS = {
    "train": ("cuda-event-timing", "nvml-sampling", "mfu-dtype"),
    "copies": ("sync-and-pinned-memory", "pageable-copy-without-trace"),
    "trace": ("trace-window",),
    "input": ("input-bound-on-device",),
}
#: Checks that must PASS on the CPU (the others may SKIP there, with the reason).
MUST_PASS = {"trace-window", "input-bound-on-device"}


def test_the_groups_hold_every_check_once():
    names = [name for name, _ in runpy.run_path(str(SCRIPT), run_name="gpu_check")["CHECKS"]]  # stdlib imports only
    grouped = [name for group in GROUPS.values() for name in group]
    assert len(names) == 7 and sorted(grouped) == sorted(names), (names, grouped)


@pytest.mark.slow
@pytest.mark.parametrize("group", list(GROUPS))
def test_gpu_check_in_cpu_mode(group):
    checks = GROUPS[group]
    proc = run_command([sys.executable, str(SCRIPT), "--device", "cpu", "--only", *checks], None, cli_env(),
                       timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert [line.split()[1] for line in lines] == list(checks), lines
    assert not any(line.startswith("FAIL") for line in lines), lines
    passed = {line.split()[1] for line in lines if line.startswith("PASS")}
    assert MUST_PASS & set(checks) <= passed, lines
    if "pageable-copy-without-trace" in checks:
        copy = next(line for line in lines if line.split()[1] == "pageable-copy-without-trace")
        assert "the copy's record checked (cpu→meta at pageable.py:" in copy, copy  # its CPU part ran


@pytest.mark.parametrize("script, args", [
    ("gpu_check.py", ["--keep", "FILE"]),
    ("bench_gpu_overhead.py", ["--keep", "FILE"]),
    ("bench_gpu_overhead.py", ["--scripts", "tiny_ops,nope"]),
    ("bench_gpu_overhead.py", ["--rounds", "0"]),
    ("bench_bytecode.py", ["--rounds", "0"]),
    ("bench_venv.py", ["--rounds", "0"]),
    ("bench_gc_pause.py", ["--rounds", "0"]),
    ("bench_gc_pause.py", ["--trace", "NOPE"]),
    ("bench_demo_exit.py", ["--rounds", "0"]),
    ("bench_demo_exit.py", ["--scenario", "nope"]),
    ("bench_warm_tests.py", ["--rounds", "0"]),
    ("bench_warm_tests.py", ["tests/nope.py"]),
    ("bench_process_memory.py", ["FILE", "--rounds", "0"]),
    ("bench_process_memory.py", ["NOPE.json"]),
    ("bench_process_memory.py", ["FILE", "--setting", "nope"]),
    ("bench_jobs.py", ["--work-dir", "no/such/dir"]),
])
def test_bad_arguments_get_one_line_and_exit_2(tmp_path, script, args):
    (tmp_path / "FILE").write_text("x")
    proc = subprocess.run([sys.executable, str(SCRIPT.parent / script), *[str(tmp_path / a) if a == "FILE" else a
                                                                         for a in args]],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith(f"{script}: error:")
