from __future__ import annotations

import pytest

from diagnosis_records import ctx_of, gpu, make_record
from stepscope.diagnosis.rules.compute import low_mfu, measured_mfu

PEAK = 1e11  # measured CPU peak, FLOP/s
COMPUTE = {"forward": 0.5, "backward": 0.4, "optimizer": 0.05}


@pytest.mark.parametrize("extra, shares, devices, fires", [
    ({"flops": {"step_index": 3, "flops": 2e6}, "cpu_matmul_peak_flops": PEAK}, COMPUTE, (), True),  # MFU 0.2%
    ({"flops": {"step_index": 3, "flops": 5e8}, "cpu_matmul_peak_flops": PEAK}, COMPUTE, (), False),  # MFU 50%
    ({"flops": {"step_index": 3, "flops": 2e6}}, COMPUTE, (), False),  # no peak: no claim
    ({"flops": {"step_index": 3, "flops": 2e6}, "cpu_matmul_peak_flops": PEAK},
     {"data_wait": 0.6, "forward": 0.3}, (), False),  # not compute-bound
    ({"flops": {"step_index": 3, "flops": 1e10}}, COMPUTE, gpu("NVIDIA H200"), True),  # 1.5% of fp32 peak
    ({"flops": {"step_index": 3, "flops": 2e6, "ops": 3000}, "cpu_matmul_peak_flops": PEAK}, COMPUTE, (),
     False),  # tiny operators: launch_overhead explains it
])
def test_low_mfu(extra, shares, devices, fires):
    record = make_record(step_s=0.01, shares=shares, extra=extra, devices=devices)
    finding = low_mfu(ctx_of(record))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "compute"
        assert 0 < finding.impact <= 1


def test_mfu_against_gpu_peak():
    record = make_record(step_s=0.01, shares=COMPUTE, devices=gpu("NVIDIA H200"),
                         extra={"flops": {"step_index": 3, "flops": 4e11}, "compute_dtype": "bf16"})
    measured = measured_mfu(ctx_of(record))
    assert measured["mfu"] == pytest.approx(4e11 / 0.01 / 989.4e12, rel=1e-3)
    assert "H200" in measured["source"]


def test_flops_step_is_excluded_from_steady_state():
    record = make_record(step_s=0.01, shares=COMPUTE, added={5: {"forward": 1.0}},
                         extra={"flops": {"step_index": 5, "flops": 5e8}, "cpu_matmul_peak_flops": PEAK})
    assert measured_mfu(ctx_of(record))["mfu"] == pytest.approx(0.5, rel=1e-3)


@pytest.mark.parametrize("main_util, fires, confidence", [
    (1.8, True, 0.7),  # this run uses the cores
    (1.2, True, 0.5),  # others use ~35% of them: reported, with less confidence
    (0.6, False, None),  # others use ~65%: the steps saw a different machine than the peak
])
def test_cpu_mfu_and_other_processes(main_util, fires, confidence):
    from stepscope.analysis.evidence import WorkerLoad

    extra = {"flops": {"step_index": 3, "flops": 2e6}, "cpu_matmul_peak_flops": PEAK}
    record = make_record(step_s=0.01, shares=COMPUTE, extra=extra)
    signals = dict(cpu_count=2, cpu_util_mean=0.95, workers=(WorkerLoad(1, "main", main_util),))
    finding = low_mfu(ctx_of(record, signals))
    assert (finding is not None) == fires
    if fires:
        assert finding.confidence == confidence
