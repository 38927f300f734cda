"""A generated blind-evaluation workload runs (benchmarks/blind/): one script planting every
single-process factor, small, with every switch on and with every switch off, writes its step
times; the plain script's steps are the planted one's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from blind.factors import FACTORS, Base  # noqa: E402
from blind.generate import Planted, Workload, write  # noqa: E402

pytestmark = pytest.mark.slow

SMALL = {"costly_samples": {"rounds": 5}, "slow_reads": {"latency_s": 0.0002}, "worker_restarts": {"init_rounds": 1000},
         "gil_thread": {"busy_s": 0.001, "duty": 0.2}, "tiny_ops": {"layers": 5},
         "periodic_saves": {"every": 3, "extra_mib": 1}, "memory_growth": {"mib": 1},
         "gc_pressure": {"nodes": 100, "live": 1000}, "neighbour": {"duty": 0.2}}


def test_every_single_process_factor_runs_and_switches_off(tmp_path: Path):
    assert set(SMALL) == set(FACTORS) - {"slow_rank"}  # a new factor gets a small size here
    base = Base(batch=8, features=32, hidden=16, depth=2, num_workers=1, steps_per_epoch=3, epochs=3, ranks=1,
                data_seed=7)
    workload = Workload(1, 0, base, tuple(Planted(name, params) for name, params in SMALL.items()))
    write(workload, tmp_path)
    results = {}
    for label, off in (("on", ""), ("off", ",".join(SMALL))):
        env = {**os.environ, "BLIND_OFF": off, "BLIND_RESULT": str(tmp_path / f"{label}.json")}
        done = subprocess.run([sys.executable, "launch.py", sys.executable, "train.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        results[label] = json.loads((tmp_path / f"{label}.json").read_text())
    assert results["on"]["steps"] == results["off"]["steps"] == 9
    assert (tmp_path / "checkpoint-0.pt").exists()  # the periodic save ran
    assert all(value > 0 for value in results["on"]["step_s"])
