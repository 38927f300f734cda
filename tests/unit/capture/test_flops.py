"""FLOP and operator counting of one step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stepscope.capture.flops import FlopProbe, OpCounter  # noqa: E402
from stepscope.capture.warn import WarningSink  # noqa: E402


def test_op_counter_counts_aten_ops():
    with OpCounter() as counter:
        torch.ones(3).add(1).mul(2)
    assert counter.count >= 3


def test_probe_counts_exactly_one_step():
    probe = FlopProbe(WarningSink(emit=False), step=2)
    model = torch.nn.Linear(64, 32)
    for index in range(5):
        model(torch.randn(8, 64)).sum().backward()
        probe.on_commit(index)
    assert probe.result.step_index == 2
    assert probe.result.flops == 2 * (2 * 8 * 64 * 32)  # forward + weight gradient (input needs none)
    assert probe.result.ops > 3
    assert probe.result.matmul_flops_by_dtype == {"fp32": probe.result.flops}
    assert probe.result.compute_dtype == "fp32" and probe.result.autocast is None


def test_probe_sees_the_dtype_autocast_runs():
    probe = FlopProbe(WarningSink(emit=False), step=1)
    model = torch.nn.Linear(64, 32)
    for index in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(torch.randn(8, 64))
        out.float().sum().backward()
        probe.on_commit(index)
    assert probe.result.compute_dtype == "bf16"
    assert probe.result.autocast == "cpu:bf16"
    assert set(probe.result.matmul_flops_by_dtype) == {"bf16"}


def test_ops_inside_data_loading_are_counted_apart():
    loading = [False]
    probe = FlopProbe(WarningSink(emit=False), in_data_wait=lambda: loading[0], step=1)
    for index in range(3):
        loading[0] = True
        batch = torch.randn(4, 4).mul(2).add(1)  # a transform run by next(loader)
        loading[0] = False
        batch.sum()
        probe.on_commit(index)
    assert probe.result.data_ops >= 3
    assert 1 <= probe.result.ops < probe.result.data_ops


def test_probe_closed_mid_step_discards_the_count():
    probe = FlopProbe(WarningSink(emit=False), step=1)
    probe.on_commit(0)
    probe.close()
    assert probe.result is None
    torch.ones(2).add(1)  # no mode left active
