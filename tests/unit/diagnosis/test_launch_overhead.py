from __future__ import annotations

import pytest

from stepscope.analysis.evidence import GpuIdle, HostTime, KernelLaunches

from diagnosis_records import ctx_of, make_record
from stepscope.diagnosis.rules.launch_overhead import tiny_ops_dominate

COMPUTE = {"forward": 0.5, "backward": 0.4, "optimizer": 0.05}


@pytest.mark.parametrize("ops, trace, fires", [
    (3600, None, True),  # 3600 ops in 17 ms: 4.7 µs per op
    (64, None, False),  # 64 big ops
    (None, None, False),  # no evidence
    (None, dict(device="NVIDIA H100", idle=GpuIdle(share=0.4, launch=0.4),
                launches=KernelLaunches(small_kernel_share=0.8)), True),
    (None, dict(device="NVIDIA H100", idle=GpuIdle(share=0.4, launch=0.4),
                launches=KernelLaunches(small_kernel_share=0.1)), False),
    (None, dict(host=HostTime(python=0.5)), True),
])
def test_tiny_ops_dominate(ops, trace, fires):
    flops = {"step_index": 2, "flops": 1e6}
    if ops is not None:
        flops["ops"] = ops
    record = make_record(step_s=0.017, shares=COMPUTE, extra={"flops": flops})
    finding = tiny_ops_dominate(ctx_of(record, trace=trace))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "launch_overhead"
        assert finding.impact >= 0.15
        assert any("torch.compile" in item.action for item in finding.prescriptions)


def test_python_time_spent_loading_data_is_not_launch_overhead():
    # num_workers=0 with Python-heavy __getitem__: Python share is high, but it is data wait
    shares = {"data_wait": 0.6, "forward": 0.2, "backward": 0.15}
    record = make_record(step_s=0.017, shares=shares, extra={"flops": {"step_index": 2, "flops": 1e6}})
    assert tiny_ops_dominate(ctx_of(record, trace=dict(host=HostTime(python=0.65)))) is None
