from __future__ import annotations

import pytest

from diagnosis_records import ctx_of, gpu, make_record
from stepscope.diagnosis.engine import run_rules
from stepscope.diagnosis.rules.compute import low_mfu

PEAK = 1e11  # measured CPU peak, FLOP/s
COMPUTE = {"forward": 0.5, "backward": 0.4, "optimizer": 0.05}


@pytest.mark.parametrize("extra, shares, devices, fires", [
    ({"flops": {"step_index": 3, "flops": 2e6}, "cpu_matmul_peak_flops": PEAK}, COMPUTE, (), True),  # MFU 0.2%
    ({"flops": {"step_index": 3, "flops": 5e8}, "cpu_matmul_peak_flops": PEAK}, COMPUTE, (), False),  # MFU 50%
    ({"flops": {"step_index": 3, "flops": 2e6}}, COMPUTE, (), False),  # no peak: no claim
    ({"flops": {"step_index": 3, "flops": 2e6}, "cpu_matmul_peak_flops": PEAK},
     {"data_wait": 0.6, "forward": 0.3}, (), False),  # not compute-bound
    ({"flops": {"step_index": 3, "flops": 1e10}}, COMPUTE, gpu("NVIDIA H200"), True),  # 1.5% of fp32 peak
])
def test_low_mfu(extra, shares, devices, fires):
    record = make_record(step_s=0.01, shares=shares, extra=extra, devices=devices)
    finding = low_mfu(ctx_of(record))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "compute"
        assert 0 < finding.impact <= 1


def test_tiny_operators_supersede_low_mfu():
    extra = {"flops": {"step_index": 3, "flops": 2e6, "ops": 3000}, "cpu_matmul_peak_flops": PEAK}
    diagnosis = run_rules(ctx_of(make_record(step_s=0.01, shares=COMPUTE, extra=extra)))
    assert diagnosis.findings[0].family == "launch_overhead"
    assert "compute" not in {item.family for item in diagnosis.findings}
    assert [(item.family, by) for item, by in diagnosis.superseded] == [("compute", "launch_overhead.tiny_ops")]


@pytest.mark.parametrize("dtype, peak_tflops", [("bf16", 989.4), ("fp32", 67.0)])
def test_mfu_against_the_gpu_peak_of_the_dtype_that_ran(dtype, peak_tflops):
    record = make_record(step_s=0.01, shares=COMPUTE, devices=gpu("NVIDIA H200"),
                         extra={"flops": {"step_index": 3, "flops": 4e11}, "compute_dtype": dtype})
    measured = ctx_of(record).mfu
    assert measured.value == pytest.approx(4e11 / 0.01 / (peak_tflops * 1e12), rel=1e-3)
    assert measured.dtype == dtype and "H200" in measured.peak_source
    assert measured.low <= measured.value <= measured.high <= 1.0


def test_autocast_run_is_not_told_to_use_autocast():
    bf16 = make_record(step_s=0.01, shares=COMPUTE, devices=gpu("NVIDIA H200"),
                       extra={"flops": {"step_index": 3, "flops": 1e9}, "compute_dtype": "bf16"})
    fp32 = make_record(step_s=0.01, shares=COMPUTE, devices=gpu("NVIDIA H200"),
                       extra={"flops": {"step_index": 3, "flops": 1e9}, "compute_dtype": "fp32"})
    actions = {name: " ".join(p.action for p in low_mfu(ctx_of(record)).prescriptions)
               for name, record in (("bf16", bf16), ("fp32", fp32))}
    assert "autocast" not in actions["bf16"] and "autocast" in actions["fp32"]


def test_no_mfu_above_the_peak():
    record = make_record(step_s=0.01, shares=COMPUTE, extra={"flops": {"step_index": 3, "flops": 5e9},
                                                             "cpu_matmul_peak_flops": PEAK})
    ev = ctx_of(record)  # 5e9 FLOP in 10 ms is 5x the measured peak
    assert ev.mfu is None and "exceed" in ev.mfu_note


def test_cpu_bf16_run_is_measured_against_the_bf16_peak():
    from dataclasses import replace

    from stepscope.record.run import CpuPeak

    record = make_record(step_s=0.01, shares=COMPUTE, extra={"flops": {"step_index": 3, "flops": 1e8},
                                                             "compute_dtype": "bf16", "cpu_matmul_peak_flops": PEAK})
    record = replace(record, facts=replace(record.facts, cpu_peak_bf16=CpuPeak(PEAK / 2, PEAK / 2, dtype="bf16")))
    ev = ctx_of(record)
    assert ev.mfu.dtype == "bf16" and ev.mfu.peak_flops == PEAK / 2 and "bf16" in ev.mfu.peak_source


def test_cpu_run_in_bf16_has_no_mfu_against_the_fp32_peak():
    record = make_record(step_s=0.01, shares=COMPUTE, extra={"flops": {"step_index": 3, "flops": 1e8},
                                                             "compute_dtype": "bf16", "cpu_matmul_peak_flops": PEAK})
    ev = ctx_of(record)
    assert ev.mfu is None and "bf16" in ev.mfu_note


def test_flops_step_is_excluded_from_steady_state():
    record = make_record(step_s=0.01, shares=COMPUTE, added={5: {"forward": 1.0}},
                         extra={"flops": {"step_index": 5, "flops": 5e8}, "cpu_matmul_peak_flops": PEAK})
    assert ctx_of(record).mfu.value == pytest.approx(0.5, rel=1e-3)


@pytest.mark.parametrize("main_util, fires, confidence", [
    (1.8, True, 0.7),  # this run uses the cores
    (1.2, True, 0.5),  # others use ~35% of them: reported, with less confidence
    (0.6, False, None),  # others use ~65%: the steps saw a different machine than the peak (no MFU)
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
