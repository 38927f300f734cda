from __future__ import annotations

import pytest

from diagnosis_records import ctx_of, gpu, make_record
from stepscope.diagnosis.rules.healthy import verdict


@pytest.mark.parametrize("devices, dtype, expects_autocast", [
    ((), None, False),
    (gpu("NVIDIA H200"), None, True),
    (gpu("NVIDIA H200"), "bf16", False),
])
def test_verdict_levers(devices, dtype, expects_autocast):
    extra = {"flops": {"step_index": 3, "flops": 4e8}, "cpu_matmul_peak_flops": 1e11}
    if dtype:
        extra["compute_dtype"] = dtype
    finding = verdict(ctx_of(make_record(devices=devices, extra=extra)))
    assert finding.family == "healthy" and finding.impact == 0
    actions = " ".join(item.action for item in finding.prescriptions)
    assert ("autocast" in actions) == expects_autocast
    assert "torch.compile" in actions
    assert "MFU" in finding.title


def test_no_verdict_without_steps():
    assert verdict(ctx_of(None)) is None
