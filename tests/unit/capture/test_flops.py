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
    assert probe.result["step_index"] == 2
    assert probe.result["flops"] == 2 * (2 * 8 * 64 * 32)  # forward + weight gradient (input needs none)
    assert probe.result["ops"] > 3


def test_probe_closed_mid_step_discards_the_count():
    probe = FlopProbe(WarningSink(emit=False), step=1)
    probe.on_commit(0)
    probe.close()
    assert probe.result is None
    torch.ones(2).add(1)  # no mode left active
