"""`stepscope run --stacks-hz`: on by default, 0 turns stack sampling and GC timing off."""

from __future__ import annotations

from stepscope.record.store import load_record
from support import run_cli, write_script

SCRIPT = """
    import time
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:
        sum(range(1000))
    print("done")
"""


def test_default_samples_and_zero_disables(tmp_path):
    script = write_script(tmp_path, "busy.py", SCRIPT)
    on = run_cli(["run", "--no-monitor", "--no-summary", "-o", str(tmp_path / "on"), str(script)], cwd=tmp_path)
    off = run_cli(["run", "--no-monitor", "--no-summary", "--stacks-hz", "0", "-o", str(tmp_path / "off"), str(script)],
                  cwd=tmp_path)
    assert on.returncode == off.returncode == 0, on.stderr + off.stderr
    assert on.stdout == off.stdout == "done\n"
    sampled = load_record(tmp_path / "on")
    assert sampled.stack_samples.rate_hz == 100.0 and len(sampled.stack_samples) > 5
    assert sampled.gc_pauses.enabled
    assert any(frame.file.endswith("busy.py") for frame in sampled.stack_samples.frames)
    unsampled = load_record(tmp_path / "off")
    assert len(unsampled.stack_samples) == 0 and not unsampled.gc_pauses.enabled


def test_negative_rate_is_a_usage_error(tmp_path):
    script = write_script(tmp_path, "busy.py", SCRIPT)
    proc = run_cli(["run", "--stacks-hz", "-5", str(script)], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "stepscope: error: --stacks-hz must be >= 0 (0 disables), got -5.0"
