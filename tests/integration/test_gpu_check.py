"""The GPU check script runs in CPU mode here, so it keeps working for the machines that have one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_gpu_check_in_cpu_mode():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu"], capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert len(lines) == 7 and not any(line.startswith("FAIL") for line in lines), lines
    passed = {line.split()[1] for line in lines if line.startswith("PASS")}
    assert {"trace-window", "input-bound-on-device"} <= passed, lines
    copy = next(line for line in lines if line.split()[1] == "pageable-copy-without-trace")
    assert "the copy's record checked (cpu→meta at pageable.py:" in copy, copy  # its CPU part ran


@pytest.mark.parametrize("script, args", [
    ("gpu_check.py", ["--keep", "FILE"]),
    ("bench_gpu_overhead.py", ["--keep", "FILE"]),
    ("bench_gpu_overhead.py", ["--scripts", "tiny_ops,nope"]),
    ("bench_gpu_overhead.py", ["--rounds", "0"]),
])
def test_bad_arguments_get_one_line_and_exit_2(tmp_path, script, args):
    (tmp_path / "FILE").write_text("x")
    proc = subprocess.run([sys.executable, str(SCRIPT.parent / script), *[str(tmp_path / a) if a == "FILE" else a
                                                                         for a in args]],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith(f"{script}: error:")
