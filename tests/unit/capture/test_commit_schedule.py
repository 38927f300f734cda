"""Commit callbacks run only at the steps that need them: discovery, the FLOP step, the trace
window, the periodic CUDA and root-module checks; a steady step makes no Python call."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from stepscope.capture.session import DEVICE_CHECK_EVERY, CaptureSession


def test_steady_steps_call_back_only_at_the_periodic_checks(tmp_path):
    session = CaptureSession(tmp_path / "run", sample_interval_s=None, count_flops=False, emit_warnings=False,
                             stacks_hz=0, trace=True).start()
    try:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        chained = session.recorder.on_commit
        calls = []

        def spy(index):
            calls.append(index)
            chained(index)

        session.recorder.on_commit = spy
        for (x,) in DataLoader(TensorDataset(torch.zeros(60 * 2, 4)), batch_size=2):
            model(x).sum().backward()
            opt.step()
    finally:
        record = session.stop()
    # discovery (0, 1), the trace window (4..8), then one call per DEVICE_CHECK_EVERY steps, besides
    # the thread account's: the commit before each accounted step and the accounted step's own
    accounted = set(record.facts.thread_account.steps) if record.facts.thread_account else set()
    account_calls = accounted | {step - 1 for step in accounted}
    assert calls[:2] == [0, 1] and [4, 5, 6, 7, 8] == [index for index in calls if 4 <= index <= 8]
    steady = [index for index in calls if index > 8 and index not in account_calls]
    # (the thread account may ask for the last commit, made when capture ends)
    checks = [index for index in steady if index != len(record.steps) - 1]
    assert checks and all(later - earlier >= DEVICE_CHECK_EVERY for earlier, later in zip(checks, checks[1:]))
    assert len(calls) < 2 + 5 + 59 // DEVICE_CHECK_EVERY + 2 + len(account_calls)
    assert record is not None and len(record.profiler_windows) == 1 and len(record.steps) >= 59


def test_device_timing_starts_once_the_script_initialises_cuda(tmp_path, monkeypatch):
    """The periodic check reads torch.cuda.is_initialized() (a flag) and asks for the CUDA event
    backend only once it is true; then the recorder times phases on the device."""
    from stepscope.capture import cuda_timing
    from tests.unit.capture.test_cuda_timing import FakeDevice

    initialized = {"now": False}
    asked = []
    device = FakeDevice()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized["now"])

    def backend():
        asked.append(initialized["now"])
        return device.make_event, device.synchronize

    monkeypatch.setattr(cuda_timing, "torch_cuda_backend", backend)
    session = CaptureSession(tmp_path / "run", sample_interval_s=None, count_flops=False, emit_warnings=False,
                             stacks_hz=0).start()
    try:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, (x,) in enumerate(DataLoader(TensorDataset(torch.zeros(40 * 2, 4)), batch_size=2)):
            if step == 20:
                initialized["now"] = True
                flipped_at = session.recorder.count
            model(x).sum().backward()
            opt.step()
            if session.recorder.device is not None and "timed_from" not in locals():
                timed_from = session.recorder.count
    finally:
        session.stop()
    assert asked == [True]  # never asked while CUDA was not initialised; once after
    assert flipped_at <= timed_from <= flipped_at + DEVICE_CHECK_EVERY + 1


def test_a_script_that_initialised_cuda_before_its_loop_is_timed_on_the_device_from_its_second_step(
        tmp_path, monkeypatch):
    """The first check is at the first commit, not after DEVICE_CHECK_EVERY steps (on an H200 the
    steps before the first periodic check had no device time)."""
    from stepscope.capture import cuda_timing
    from tests.unit.capture.test_cuda_timing import FakeDevice

    device = FakeDevice()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda_timing, "torch_cuda_backend", lambda: (device.make_event, device.synchronize))
    session = CaptureSession(tmp_path / "run", sample_interval_s=None, count_flops=False, emit_warnings=False,
                             stacks_hz=0).start()
    try:
        model = torch.nn.Linear(4, 1)
        for (x,) in DataLoader(TensorDataset(torch.zeros(12 * 2, 4)), batch_size=2):
            model(x).sum().backward()
    finally:
        record = session.stop()
    timed = [index for index, value in enumerate(record.steps.device_ns) if value >= 0]
    assert timed and timed[0] <= 1 and timed == list(range(timed[0], len(record.steps))), timed
