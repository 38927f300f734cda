"""On a GPU the model's time is split between forward, backward and optimizer as the device spent it
(CUDA events), not as the host did: the host runs ahead and blocks wherever the launch queue fills."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.unit.diagnosis.diagnosis_records import make_record
from stepscope.analysis.run.steady import model_split_by_device, steady_state
from stepscope.record.run import StepTable

# the H200's matmul-bound bf16 step, in ms: host blocked in the optimizer's launches
HOST = {"forward": 0.50, "backward": 1.25, "optimizer": 9.87}
DEVICE = {"forward": 3.20, "backward": 5.67, "optimizer": 3.00}


def _gpu_record(steps: int = 20, untimed: int = 0):
    step_s = 12.2e-3
    record = make_record(steps=steps, step_s=step_s, shares={name: ms * 1e-3 / step_s for name, ms in HOST.items()},
                         warmup_factor=1.0)
    columns = record.steps.columns()
    for name, ms in DEVICE.items():
        columns[f"device_{name}_ns"] = np.full(steps, int(ms * 1e6))
        columns[f"device_{name}_ns"][:untimed] = -1
    columns["device_ns"] = np.full(steps, int(12.2e6))
    columns["device_ns"][:untimed] = -1
    return replace(record, steps=StepTable.from_columns(columns))


def test_the_model_time_of_a_gpu_bound_step_is_split_as_the_device_spent_it():
    record = _gpu_record()
    host = steady_state(replace(record, steps=StepTable.from_columns(
        {**record.steps.columns(), **{f"device_{name}_ns": np.full(20, -1) for name in DEVICE},
         "device_ns": np.full(20, -1)})))
    device = steady_state(record)
    assert host.shares["optimizer"] == pytest.approx(9.87 / 12.2, abs=0.01)  # the host's view: 81 %
    model = sum(HOST.values()) / 12.2
    for name, ms in DEVICE.items():
        assert device.shares[name] == pytest.approx(model * ms / sum(DEVICE.values()), abs=0.005)
    assert device.compute_share == pytest.approx(host.compute_share, abs=1e-6)  # the model's share stays
    assert device.shares["other"] == pytest.approx(host.shares["other"])


def test_steps_without_device_times_keep_the_host_split():
    record = _gpu_record(untimed=5)
    split = model_split_by_device(record.steps)
    assert (split.optimizer_ns[:5] == record.steps.optimizer_ns[:5]).all()
    assert (split.optimizer_ns[5:] < record.steps.optimizer_ns[5:]).all()
    cpu = make_record()
    assert model_split_by_device(cpu.steps) is cpu.steps


def test_a_gpu_mfu_is_bounded_by_the_device_step_times_not_the_host_jitter():
    """The host's step boundaries move with the launch queue (on the H200: host steps of 1.8 ms
    beside 12.2 ms ones, the device 12.2 ms each): the host's p10 put the MFU's upper bound at 100 %."""
    from stepscope.analysis.bundle import build_evidence
    from tests.unit.diagnosis.diagnosis_records import gpu

    record = _gpu_record(steps=40)
    record = replace(record, meta=replace(record.meta, devices=gpu("NVIDIA H200")))
    columns = record.steps.columns()
    jitter = np.where(np.arange(40) % 3 == 0, 0.15, 1.45)  # a third of the host's steps are short
    for name in ("duration", "forward", "backward", "optimizer", "other"):
        columns[f"{name}_ns"] = np.rint(columns[f"{name}_ns"] * jitter).astype(np.int64)
    record = replace(record, steps=StepTable.from_columns(columns))
    from stepscope.record.run import ComputeFacts

    compute = ComputeFacts(step_index=3, flops=int(5.5e12), ops=60, matmul_flops_by_dtype={"bf16": int(5.5e12)})
    record = replace(record, facts=replace(record.facts, compute=compute))
    mfu = build_evidence(record).mfu
    assert mfu is not None and mfu.on_gpu and mfu.dtype == "bf16"
    assert mfu.low <= mfu.value <= mfu.high < 1.5 * mfu.value, mfu
