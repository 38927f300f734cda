"""CUDA event timing logic with fake events (this machine has no GPU)."""

from __future__ import annotations

from stepscope.capture.cuda_timing import MAX_PENDING_STEPS, DeviceTimer
from stepscope.capture.recorder import BACKWARD, DATA_WAIT, FORWARD, StepRecorder


class FakeDevice:
    """A device clock advanced by the test; events complete when the test says so."""

    def __init__(self):
        self.now_ms = 0.0
        self.completed_until = float("inf")
        self.synchronized = 0

    def make_event(self):
        device = self

        class Event:
            def record(self):
                self.t = device.now_ms

            def query(self):
                return self.t <= device.completed_until

            def elapsed_time(self, other):
                return other.t - self.t

        return Event()

    def synchronize(self):
        self.synchronized += 1
        self.completed_until = float("inf")


def drive(rec, device, clock, steps=3, complete=True):
    for _ in range(steps):
        rec.batch_requested()
        rec.enter(DATA_WAIT)
        clock.advance(10)
        rec.leave(DATA_WAIT)
        rec.batch_received(2)
        for phase, device_ms in ((FORWARD, 2.0), (BACKWARD, 3.0)):
            rec.enter(phase)
            clock.advance(5)
            device.now_ms += device_ms
            rec.leave(phase)
        rec.optimizer_started(1)
        device.now_ms += 1.0
        rec.optimizer_finished(1)


def test_device_time_per_phase_fills_columns(fake_clock):
    device = FakeDevice()
    rec = StepRecorder(clock=fake_clock)
    rec.device = DeviceTimer(rec.columns, device.make_event, device.synchronize)
    drive(rec, device, fake_clock)
    rec.finish()
    rec.device.drain()
    steps = rec.steps()
    assert steps.device_forward_ns.tolist()[1:] == [2_000_000, 2_000_000]
    assert steps.device_backward_ns.tolist()[1:] == [3_000_000, 3_000_000]
    assert steps.device_optimizer_ns.tolist()[1:] == [1_000_000, 1_000_000]
    assert all(value >= 6_000_000 for value in steps.device_ns.tolist()[1:])


def test_incomplete_events_are_not_waited_for_in_the_hot_path(fake_clock):
    device = FakeDevice()
    device.completed_until = -1.0  # nothing finishes
    rec = StepRecorder(clock=fake_clock)
    rec.device = DeviceTimer(rec.columns, device.make_event, device.synchronize)
    drive(rec, device, fake_clock)
    assert device.synchronized == 0
    assert set(rec.columns["device_ns"].tolist()) == {-1}
    rec.finish()
    rec.device.drain()  # end of run: one synchronize, then everything is read back
    assert device.synchronized == 1
    assert -1 not in rec.columns["device_forward_ns"].tolist()


def test_pending_queue_is_bounded(fake_clock):
    device = FakeDevice()
    device.completed_until = -1.0
    rec = StepRecorder(clock=fake_clock)
    rec.device = DeviceTimer(rec.columns, device.make_event, device.synchronize)
    drive(rec, device, fake_clock, steps=MAX_PENDING_STEPS + 20)
    assert len(rec.device.pending) <= MAX_PENDING_STEPS
    assert rec.device.dropped > 0
