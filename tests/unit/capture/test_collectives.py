"""The communication phase: exclusive accounting, DDP bucket split, Python collective wrappers,
CUDA event pairs read without synchronising (fakes)."""

from __future__ import annotations

import pytest

from stepscope.capture.collectives import CollectiveTimer, DeviceSpans, TimedWork, split_buckets
from stepscope.capture.recorder import BACKWARD, COMMUNICATION, FORWARD, StepRecorder


class Clock:
    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def tick(self, ns: int) -> None:
        self.now += ns


def _phases_sum(steps) -> list[int]:
    return list(steps.data_wait_ns + steps.forward_ns + steps.backward_ns + steps.optimizer_ns
                + steps.communication_ns + steps.other_ns)


def test_split_buckets_exposed_after_the_last_launch():
    # buckets launched at 10 and 40 (backward computes until 40), done at 30 and 90; backward ends at 100
    exposed, overlapped = split_buckets([(10, 30), (40, 90)], 100)
    assert exposed == 50  # 40 -> 90
    assert overlapped == 20  # 10 -> 30
    assert split_buckets([], 100) == (0, 0)
    assert split_buckets([(10, 200)], 100) == (90, 0)  # clipped at the end of backward


def test_exposed_bucket_time_moves_from_backward_to_communication():
    clock = Clock()
    rec = StepRecorder(clock=clock)
    timer = CollectiveTimer(rec, clock)
    rec.comm = timer
    rec.mark_step()
    rec.enter(FORWARD); clock.tick(100); rec.leave(FORWARD)
    rec.enter(BACKWARD)
    clock.tick(20)
    slot = timer.bucket_started()
    clock.tick(30)
    last = timer.bucket_started()
    clock.tick(10)
    timer.bucket_finished(slot)
    clock.tick(40)
    timer.bucket_finished(last)
    clock.tick(5)
    rec.leave(BACKWARD)
    clock.tick(5)
    rec.mark_step()
    steps = rec.steps()
    assert steps.communication_ns[0] == 50  # last launch (t=150) to last completion (t=200)
    assert steps.backward_ns[0] == 105 - 50
    assert steps.communication_overlap_ns[0] == 30  # first bucket 120..160 minus the exposed overlap
    assert _phases_sum(steps) == list(steps.duration_ns)


def test_python_collective_is_its_own_phase_and_async_wait_counts():
    clock = Clock()
    rec = StepRecorder(clock=clock)
    timer = CollectiveTimer(rec, clock)
    rec.mark_step()

    def collective():
        clock.tick(70)
        return "work"

    assert timer.timed(collective, (), {}) == "work"

    class Work:
        def wait(self):
            clock.tick(30)
            return True

        def is_completed(self):
            return True

    work = TimedWork(Work(), timer)
    assert work.wait() is True and work.is_completed()
    rec.enter(FORWARD); clock.tick(10); rec.leave(FORWARD)
    rec.mark_step()
    steps = rec.steps()
    assert steps.communication_ns[0] == 100 and steps.forward_ns[0] == 10
    assert _phases_sum(steps) == list(steps.duration_ns)


def test_collective_inside_forward_is_attributed_to_communication():
    clock = Clock()
    rec = StepRecorder(clock=clock)
    rec.mark_step()
    rec.enter(FORWARD); clock.tick(10)
    rec.enter(COMMUNICATION); clock.tick(25); rec.leave(COMMUNICATION)
    clock.tick(5); rec.leave(FORWARD)
    rec.mark_step()
    steps = rec.steps()
    assert (steps.forward_ns[0], steps.communication_ns[0]) == (15, 25)


class FakeEvent:
    """A CUDA event: ``done`` says whether the stream reached it; times in ms."""

    clock = 0.0

    def __init__(self):
        self.t = None
        self.done = False

    def record(self):
        self.t = FakeEvent.clock

    def query(self):
        return self.done

    def elapsed_time(self, end):
        assert end.done, "elapsed_time on a pending event would synchronise"
        return end.t - self.t


def test_device_spans_are_read_only_when_complete():
    FakeEvent.clock = 0.0
    spans = DeviceSpans(FakeEvent)
    start = spans.begin()
    FakeEvent.clock = 2.5
    spans.end(start)
    assert spans.poll() == 0 and len(spans.pending) == 1  # not reached yet: nothing read, nothing waited
    spans.pending[0][1].done = True
    assert spans.poll() == 2_500_000
    assert spans.pending == []


def test_device_time_goes_to_the_overlap_column():
    clock = Clock()
    rec = StepRecorder(clock=clock)
    timer = CollectiveTimer(rec, clock)
    timer.device = DeviceSpans(FakeEvent)
    rec.comm = timer
    FakeEvent.clock = 0.0
    start = timer.device.begin()
    FakeEvent.clock = 1.0
    timer.device.end(start)
    timer.device.pending[0][1].done = True
    rec.mark_step()
    rec.enter(BACKWARD); clock.tick(50); rec.leave(BACKWARD)
    rec.mark_step()
    steps = rec.steps()
    assert steps.communication_overlap_ns[0] == 1_000_000
    assert steps.backward_ns[0] == 50 and steps.communication_ns[0] == 0


def test_old_records_load_with_zero_communication():
    from stepscope.record.run import StepTable

    steps = StepTable.from_columns({"start_ns": [0, 10], "duration_ns": [10, 10], "other_ns": [10, 10]})
    assert list(steps.communication_ns) == [0, 0] and list(steps.communication_overlap_ns) == [0, 0]


@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "barrier", "all_gather_into_tensor"])
def test_wrappers_keep_the_torch_function_names(name):
    torch = pytest.importorskip("torch")
    from stepscope.capture.collectives import CollectiveHooks
    from stepscope.capture.warn import WarningSink

    hooks = CollectiveHooks(StepRecorder(), WarningSink())
    original = getattr(torch.distributed, name)
    hooks.install(torch)
    try:
        wrapped = getattr(torch.distributed, name)
        assert wrapped is not original and wrapped.__name__ == original.__name__
        assert wrapped.__wrapped__ is original
    finally:
        hooks.uninstall()
    assert getattr(torch.distributed, name) is original


@pytest.mark.parametrize(("setting", "hooked"), [(None, True), ("1", True), ("0", False), ("off", False)])
def test_ddp_s_reduction_is_left_alone_when_the_hook_is_switched_off(monkeypatch, setting, hooked):
    torch = pytest.importorskip("torch")
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stepscope.capture.collectives import CollectiveHooks
    from stepscope.capture.warn import WarningSink

    if setting is None:
        monkeypatch.delenv("STEPSCOPE_DDP_HOOK", raising=False)
    else:
        monkeypatch.setenv("STEPSCOPE_DDP_HOOK", setting)
    warnings = WarningSink(emit=False)
    hooks = CollectiveHooks(StepRecorder(), warnings)
    original = DDP.forward
    hooks.install(torch)
    try:
        assert (DDP.forward is not original) is hooked
        said = [text for text in warnings.messages if "STEPSCOPE_DDP_HOOK is off" in text]
        assert len(said) == (0 if hooked else 1), warnings.messages
    finally:
        hooks.uninstall()
    assert DDP.forward is original
