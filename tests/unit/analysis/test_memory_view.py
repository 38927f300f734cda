"""Memory view and Python overhead on the recorded CPU trace; 2021-format memory events."""

from __future__ import annotations

from pathlib import Path

import pytest
from reference_traces import SKIP, analysis

from stepscope.analysis.trace.rank_analysis import analyze_rank
from stepscope.traces.load import load_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


@pytest.fixture(scope="module")
def cpu_train():
    return analyze_rank(load_trace(DATA / "cpu_train.pt.trace.json.gz"))


def test_memory_curve_and_peak(cpu_train):
    (cpu,) = cpu_train.memory.devices
    assert cpu.device == "CPU" and cpu.events > 0
    assert cpu.peak_allocated_bytes == max(cpu.curve_allocated_bytes)  # the peak survives down-sampling
    assert len(cpu.curve_ts_us) <= 1000
    assert cpu_train.memory.top_operators and cpu_train.memory.top_operators[0].allocated_bytes > 0


def test_python_overhead(cpu_train):
    python = cpu_train.python
    assert python is not None and python.threads == 1
    total = sum(python.share(p) for p in ("python", "aten", "runtime", "other"))
    assert total == pytest.approx(1.0, abs=1e-6)
    assert python.share("python") > 0 and python.share("aten") > 0


@SKIP
def test_memory_from_2021_trace_without_running_totals():
    item = analysis("kineto_tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    cuda = next(d for d in item.memory.devices if d.device == "CUDA:0")
    assert cuda.peak_allocated_bytes > 1e9  # ResNet50 activations on a V100
    assert item.memory.peak_bytes("CUDA") == cuda.peak_allocated_bytes
