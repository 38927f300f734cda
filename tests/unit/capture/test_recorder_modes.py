"""Step boundaries without an optimizer: backward mode, forward (inference) mode, and how they
give way to optimizer steps and explicit steps (see the recorder's module docstring)."""

from __future__ import annotations

import numpy as np

from stepscope.capture.recorder import BACKWARD, DATA_WAIT, FORWARD, OPTIMIZER, StepRecorder
from stepscope.record.run import PHASES

MODEL, OTHER_MODEL = 11, 22


class Loop:
    def __init__(self, clock):
        self.clock = clock
        self.rec = StepRecorder(clock=clock)

    def forward(self, duration: int, key: int = MODEL, grad: bool = True) -> None:
        self.rec.model_forward_started(key, grad)
        self.rec.enter(FORWARD)
        self.clock.advance(duration)
        self.rec.leave(FORWARD)
        self.rec.model_forward_finished(key)

    def phase(self, phase: int, duration: int) -> None:
        self.rec.enter(phase)
        self.clock.advance(duration)
        self.rec.leave(phase)

    def fetch(self, wait: int, samples: int = 4) -> None:
        self.rec.batch_requested()
        self.phase(DATA_WAIT, wait)
        self.rec.batch_received(samples)

    def manual_sgd_step(self, fwd=200, bwd=300, update=40, loss=5) -> None:
        self.forward(fwd)
        self.clock.advance(loss)  # a criterion without parameters: not a model forward
        self.phase(BACKWARD, bwd)
        self.clock.advance(update)  # p.data.add_(p.grad, alpha=-lr)

    def optimizer(self, duration: int, optimizer_id: int = 1) -> None:
        self.rec.optimizer_started(optimizer_id)
        self.clock.advance(duration)
        self.rec.optimizer_finished(optimizer_id)


def additive(steps) -> bool:
    return bool(np.array_equal(sum(steps.phase(name) for name in PHASES), steps.duration_ns))


def test_manual_updates_one_backward_is_one_step_and_the_update_stays_in_it(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(5):
        loop.manual_sgd_step()
    loop.rec.finish()
    steps = loop.rec.steps()
    assert loop.rec.mode == "backward"
    assert len(steps) == 5
    assert steps.forward_ns.tolist() == [200] * 5
    assert steps.backward_ns.tolist() == [300] * 5
    assert steps.other_ns.tolist() == [45] * 5
    assert steps.optimizer_ns.tolist() == [0] * 5
    assert steps.samples.tolist() == [-1] * 5  # no DataLoader: samples unknown
    assert additive(steps)
    assert not loop.rec.inference


def test_evaluation_forwards_in_backward_mode_land_in_the_next_step(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(3):
        loop.manual_sgd_step()
    for _ in range(4):
        loop.forward(50, grad=False)  # evaluation after the epoch
    for _ in range(3):
        loop.manual_sgd_step()
    loop.rec.finish()
    steps = loop.rec.steps()
    assert len(steps) == 6
    assert steps.forward_ns.tolist() == [200, 200, 200, 400, 200, 200]


def test_manual_updates_over_a_dataloader_commit_at_the_next_batch(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(4):
        loop.fetch(100, samples=8)
        loop.manual_sgd_step()
    loop.rec.finish()
    steps = loop.rec.steps()
    assert len(steps) == 4
    assert steps.data_wait_ns.tolist() == [100] * 4
    assert steps.samples.tolist() == [8] * 4
    assert additive(steps)


def test_inference_each_model_forward_is_a_step(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(6):
        fake_clock.advance(30)  # preparing the input
        loop.forward(100, grad=False)
        loop.forward(20, key=OTHER_MODEL, grad=False)  # a second model in the same iteration
    loop.rec.finish()
    steps = loop.rec.steps()
    assert loop.rec.mode == "forward"
    assert len(steps) == 6
    assert steps.forward_ns.tolist() == [120] * 6
    assert steps.backward_ns.tolist() == [0] * 6
    assert additive(steps)
    assert loop.rec.inference
    assert loop.rec.model_forwards_no_grad == loop.rec.model_forwards == 12


def test_inference_over_a_dataloader_one_batch_is_a_step(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(5):
        loop.fetch(10, samples=16)
        loop.forward(100)
        loop.forward(100)  # e.g. test-time augmentation: still one step per batch
    loop.rec.finish()
    steps = loop.rec.steps()
    assert loop.rec.mode == "batch"
    assert len(steps) == 5
    assert steps.samples.tolist() == [16] * 5
    assert loop.rec.inference


def test_a_single_inference_forward_is_one_step(fake_clock):
    loop = Loop(fake_clock)
    loop.forward(100, grad=False)
    loop.rec.finish()
    assert loop.rec.count == 1
    assert loop.rec.mode == "forward"


def test_optimizer_takes_over_and_folds_earlier_fallback_steps(fake_clock):
    loop = Loop(fake_clock)
    for _ in range(3):
        loop.forward(50, grad=False)  # a sanity-check evaluation before training
    for _ in range(4):
        loop.forward(200)
        loop.phase(BACKWARD, 300)
        loop.optimizer(50)
    loop.rec.finish()
    steps = loop.rec.steps()
    assert loop.rec.mode == "optimizer"
    assert len(steps) == 4  # the three evaluation steps are folded into the first training step
    assert steps.forward_ns.tolist() == [150 + 200, 200, 200, 200]
    assert steps.optimizer_ns.tolist() == [50, 50, 50, 50]
    assert additive(steps)
    assert not loop.rec.inference


def test_a_backward_inside_the_optimizer_never_splits_a_step(fake_clock):
    """LBFGS runs forward and backward in a closure inside optimizer.step()."""
    loop = Loop(fake_clock)
    for _ in range(3):
        loop.rec.optimizer_started(1)
        for _ in range(3):
            loop.forward(10)
            loop.phase(BACKWARD, 10)
        loop.rec.optimizer_finished(1)
    loop.rec.finish()
    steps = loop.rec.steps()
    assert len(steps) == 3  # one per optimizer step, however many closures ran inside
    assert steps.forward_ns.tolist() == [30, 30, 30]
    assert steps.backward_ns.tolist() == [30, 30, 30]


def test_explicit_steps_win_over_backward_boundaries(fake_clock):
    loop = Loop(fake_clock)
    loop.rec.mark_step()
    for _ in range(4):
        loop.manual_sgd_step()
        loop.manual_sgd_step()
        loop.rec.mark_step()
    loop.rec.finish()
    assert loop.rec.mode == "explicit"
    assert loop.rec.count == 4


def test_nothing_delimits_a_loop_of_plain_tensor_ops(fake_clock):
    loop = Loop(fake_clock)
    fake_clock.advance(1000)
    loop.phase(OPTIMIZER, 0)
    loop.rec.finish()
    assert loop.rec.count == 0


def test_batch_length_reads_mappings_dataclasses_and_nested_containers():
    import dataclasses
    from collections import UserDict

    import torch

    from stepscope.capture.hooks import batch_length

    class Encoding(UserDict):  # what transformers' BatchEncoding is: a Mapping, not a dict
        pass

    @dataclasses.dataclass
    class Batch:
        meta: str
        images: torch.Tensor

    assert batch_length(Encoding(input_ids=torch.zeros(8, 16), labels=torch.zeros(8, 16))) == 8
    assert batch_length(Batch("x", torch.zeros(5, 3))) == 5
    assert batch_length(({"ids": [torch.zeros(6, 2)]}, torch.zeros(6))) == 6
    assert batch_length((["a", "b"], torch.zeros(4, 2))) == 4  # the first leaf with a dimension
    assert batch_length({"n": 3}) == -1
    assert batch_length(torch.tensor(1.0)) == -1


def test_loader_batch_size_falls_back_to_the_batch_sampler():
    import torch
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

    from stepscope.capture.hooks import loader_batch_size

    data = TensorDataset(torch.zeros(10, 2))
    assert loader_batch_size(DataLoader(data, batch_size=4)) == 4
    batches = BatchSampler(SequentialSampler(data), batch_size=3, drop_last=False)
    assert loader_batch_size(DataLoader(data, batch_sampler=batches)) == 3
    assert loader_batch_size(DataLoader(data, batch_size=None, sampler=batches)) == 3
    assert loader_batch_size(DataLoader(data, batch_size=None)) is None
