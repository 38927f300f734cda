"""`stepscope report RUN_DIR --flame PHASE`: collapsed stacks of one phase."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from records import make_record
from stepscope.record import layout
from stepscope.record.run import PHASES, STACK_ROLES, StackFrame, StackSamples
from stepscope.record.store import save_record
from support import run_cli


@pytest.fixture
def run_dir(tmp_path):
    samples = StackSamples(
        rate_hz=100.0, mechanism="test",
        frames=(StackFrame("/home/me/train.py", 10, "main"), StackFrame("/home/me/train.py", 20, "log")),
        stacks=((0,), (0, 1)), ts_ns=np.arange(3), step=np.array([1, 1, 3]),
        phase=np.full(3, PHASES.index("other")), role=np.full(3, STACK_ROLES.index("main")),
        pid=np.full(3, 1), stack=np.array([1, 1, 0]))
    save_record(replace(make_record(), stack_samples=samples), layout.record_path(tmp_path, 0))
    return tmp_path


def test_flame_prints_collapsed_stacks(run_dir):
    proc = run_cli(["report", str(run_dir), "--flame", "other"], cwd=run_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "main (train.py:10);log (train.py:20) 2\nmain (train.py:10) 1\n"


def test_flame_of_an_unknown_phase_is_a_usage_error(run_dir):
    proc = run_cli(["report", str(run_dir), "--flame", "fwd"], cwd=run_dir)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepscope: error: --flame: unknown phase 'fwd'")
