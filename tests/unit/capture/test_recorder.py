"""The step state machine, driven with a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.capture.recorder import BACKWARD, DATA_WAIT, FORWARD, StepRecorder
from stepscope.record.run import PHASES


class Loop:
    """Drives a recorder the way the hooks do."""

    def __init__(self, clock):
        self.clock = clock
        self.rec = StepRecorder(clock=clock)

    def fetch(self, wait: int, samples: int = 4) -> None:
        self.rec.batch_requested()
        self.rec.enter(DATA_WAIT)
        self.clock.advance(wait)
        self.rec.leave(DATA_WAIT)
        self.rec.batch_received(samples)

    def phase(self, phase: int, duration: int) -> None:
        self.rec.enter(phase)
        self.clock.advance(duration)
        self.rec.leave(phase)

    def optimizer(self, duration: int, optimizer_id: int = 1) -> None:
        self.rec.optimizer_started(optimizer_id)
        self.clock.advance(duration)
        self.rec.optimizer_finished(optimizer_id)

    def train_step(self, wait=100, fwd=200, bwd=300, opt=50, gap=10, optimizer_id=1):
        self.fetch(wait)
        self.phase(FORWARD, fwd)
        self.phase(BACKWARD, bwd)
        self.clock.advance(gap)
        self.optimizer(opt, optimizer_id)


def assert_additive(steps) -> None:
    total = sum(steps.phase(name) for name in PHASES)
    assert np.array_equal(total, steps.duration_ns)


def test_training_steps_are_delimited_by_optimizer_and_add_up(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(3):
        loop.train_step()
    loop.rec.finish()
    steps = loop.rec.steps()
    assert len(steps) == 3
    assert_additive(steps)
    assert loop.rec.mode == "optimizer"
    assert steps.data_wait_ns.tolist() == [100, 100, 100]
    assert steps.forward_ns.tolist() == [200, 200, 200]
    assert steps.backward_ns.tolist() == [300, 300, 300]
    assert steps.optimizer_ns.tolist() == [50, 50, 50]
    assert steps.other_ns.tolist() == [10, 10, 10]
    assert steps.samples.tolist() == [4, 4, 4]


def test_gradient_accumulation_counts_micro_batches_in_one_step(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(2):
        for _ in range(4):
            loop.fetch(100)
            loop.phase(FORWARD, 10)
            loop.phase(BACKWARD, 10)
        loop.optimizer(5)
    loop.rec.finish()
    steps = loop.rec.steps()
    assert steps.batches.tolist() == [4, 4]
    assert steps.data_wait_ns.tolist() == [400, 400]
    assert steps.samples.tolist() == [16, 16]
    assert_additive(steps)


def test_two_optimizers_in_one_iteration_make_one_step(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(3):  # GAN: D step then G step per batch
        loop.fetch(100)
        loop.phase(FORWARD, 10)
        loop.phase(BACKWARD, 10)
        loop.optimizer(5, optimizer_id=1)
        loop.phase(FORWARD, 10)
        loop.phase(BACKWARD, 10)
        loop.optimizer(5, optimizer_id=2)
    loop.rec.finish()
    steps = loop.rec.steps()
    assert len(steps) == 3
    assert steps.optimizer_steps.tolist() == [2, 2, 2]
    assert steps.forward_ns.tolist() == [20, 20, 20]
    assert_additive(steps)


def test_same_optimizer_without_loader_starts_a_new_step(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(3):  # synthetic data: no DataLoader at all
        loop.phase(FORWARD, 10)
        loop.phase(BACKWARD, 20)
        loop.optimizer(5)
    loop.rec.finish()
    steps = loop.rec.steps()
    assert len(steps) == 3
    assert steps.batches.tolist() == [0, 0, 0]
    assert steps.samples.tolist() == [-1, -1, -1]


def test_batches_delimit_steps_when_no_optimizer_runs(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(5):
        loop.fetch(100)
        loop.phase(FORWARD, 50)
    loop.rec.finish()
    steps = loop.rec.steps()
    assert loop.rec.mode == "batch"
    assert len(steps) == 5
    assert steps.data_wait_ns.tolist() == [100] * 5
    assert steps.forward_ns.tolist() == [50] * 5
    assert_additive(steps)


def test_batch_mode_steps_before_training_fold_into_the_first_step(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(2):  # a sanity-check evaluation before training
        loop.fetch(100)
        loop.phase(FORWARD, 50)
    for _ in range(3):
        loop.train_step()
    loop.rec.finish()
    steps = loop.rec.steps()
    assert len(steps) == 3
    assert steps.batches.tolist() == [3, 1, 1]
    assert steps.forward_ns.tolist()[0] == 300
    assert_additive(steps)


def test_nested_and_reentrant_phases_are_not_double_counted(fake_clock):
    loop = Loop(fake_clock)
    rec = loop.rec
    loop.fetch(10)
    rec.enter(BACKWARD)
    fake_clock.advance(5)
    rec.enter(BACKWARD)  # Tensor.backward -> torch.autograd.backward
    fake_clock.advance(5)
    rec.leave(BACKWARD)
    rec.leave(BACKWARD)
    rec.optimizer_started(1)  # LBFGS: forward and backward inside the optimizer step
    fake_clock.advance(3)
    loop.phase(FORWARD, 7)
    rec.optimizer_finished(1)
    rec.finish()
    steps = rec.steps()
    assert steps.backward_ns.tolist() == [10]
    assert steps.optimizer_ns.tolist() == [3]
    assert steps.forward_ns.tolist() == [7]
    assert_additive(steps)


def test_unbalanced_leave_is_ignored(fake_clock):
    loop = Loop(fake_clock)
    loop.rec.leave(FORWARD)
    loop.train_step()
    loop.rec.finish()
    assert_additive(loop.rec.steps())


def test_explicit_steps(fake_clock):
    loop = Loop(fake_clock)
    rec = loop.rec
    rec.mark_step()
    for _ in range(3):
        loop.fetch(10)
        loop.optimizer(5)  # ignored as a boundary in explicit mode
        fake_clock.advance(1)
        rec.mark_step()
    rec.finish()
    steps = rec.steps()
    assert rec.mode == "explicit"
    assert steps.duration_ns.tolist() == [16, 16, 16]


def test_unfinished_tail_is_counted_not_recorded(fake_clock):
    loop = Loop(fake_clock)
    loop.train_step()
    loop.fetch(100)
    loop.phase(FORWARD, 50)
    loop.rec.finish()
    assert len(loop.rec.steps()) == 1
    assert loop.rec.trailing_ns == 150


class Listener:
    def __init__(self):
        self.calls = []

    def start(self, action):
        self.calls.append(("start", action))

    def stop(self, action):
        self.calls.append(("stop", action))


def test_phase_listener_sees_balanced_actions(fake_clock):
    listener = Listener()
    rec = StepRecorder(clock=fake_clock, phase_listener=listener)
    loop = Loop(fake_clock)
    loop.rec = rec
    for _ in range(2):
        loop.train_step()
    rec.finish()
    names = [action for _, action in listener.calls]
    assert {"data_wait", "forward", "backward", "optimizer", "step"} <= set(names)
    depth = {}
    for kind, action in listener.calls:
        depth[action] = depth.get(action, 0) + (1 if kind == "start" else -1)
        assert depth[action] in (0, 1, -1)


@pytest.mark.parametrize("count", [0, 1, 100])
def test_steps_columns_have_equal_length(fake_clock, count):
    loop = Loop(fake_clock)
    for _ in range(count):
        loop.train_step()
    loop.rec.finish()
    steps = loop.rec.steps()
    assert {len(column) for column in steps.columns().values()} == {count}
