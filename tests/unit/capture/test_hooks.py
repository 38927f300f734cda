"""Torch hooks in-process: restored after capture, robust to failures, cheap on nested modules."""

from __future__ import annotations

import copy
import io
import pickle

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.dataloader import _BaseDataLoaderIter  # noqa: E402

from stepscope.capture.hooks import DISCOVERY_STEPS, TorchHooks, batch_length  # noqa: E402
from stepscope.capture.recorder import StepRecorder  # noqa: E402
from stepscope.capture.warn import WarningSink  # noqa: E402


def originals():
    return (torch.nn.Module.__call__, torch.nn.Sequential.__dict__.get("__call__"), DataLoader.__iter__,
            _BaseDataLoaderIter.__next__, torch.autograd.backward, torch.Tensor.backward)


def train(steps: int = 6):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(steps * 2, 4), torch.randn(steps * 2, 1)), batch_size=2)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


@pytest.fixture
def capture():
    recorder = StepRecorder()
    sink = WarningSink(emit=False)
    hooks = TorchHooks(recorder, sink)
    before = originals()
    hooks.install()
    yield recorder, hooks, sink
    hooks.uninstall()
    assert originals() == before, "capture must restore every patched attribute"


def test_loop_is_captured_and_everything_is_restored(capture):
    recorder, hooks, sink = capture
    train(6)
    recorder.finish()
    steps = recorder.steps()
    assert len(steps) == 6
    assert (steps.forward_ns > 0).all() and (steps.backward_ns > 0).all() and (steps.data_wait_ns > 0).all()
    assert not sink.messages


def test_after_discovery_only_root_classes_are_wrapped(capture):
    recorder, hooks, _ = capture
    model = train(DISCOVERY_STEPS + 3)
    assert not hooks._discovering
    assert torch.nn.Sequential in hooks._root_classes
    assert torch.nn.Linear not in hooks._root_classes  # nested: never a root
    assert getattr(torch.nn.Sequential.__call__, "_stepscope_wrapped", False)
    assert not getattr(torch.nn.Linear.__call__, "_stepscope_wrapped", False)
    buffer = io.BytesIO()
    torch.save(model, buffer)  # nothing of ours is attached to instances
    pickle.dumps(copy.deepcopy(model))


def test_failing_hook_installation_degrades_to_a_warning(monkeypatch):
    import torch.optim.optimizer as optimizer_module

    def broken(hook):
        raise RuntimeError("no hooks today")

    monkeypatch.setattr(optimizer_module, "register_optimizer_step_pre_hook", broken)
    recorder, sink = StepRecorder(), WarningSink(emit=False)
    hooks = TorchHooks(recorder, sink)
    hooks.install()
    try:
        train(3)
    finally:
        hooks.uninstall()
    assert any("could not hook optimizer" in message for message in sink.messages)
    assert recorder.mode == "backward"  # no optimizer boundaries: backward() calls delimit steps instead


def test_hooks_do_nothing_in_a_forked_child(capture):
    recorder, hooks, _ = capture
    hooks.live = False  # what os.register_at_fork sets in DataLoader workers
    train(3)
    recorder.finish()
    assert len(recorder.steps()) == 0


@pytest.mark.parametrize("batch, expected", [
    (torch.zeros(5, 3), 5),
    ((torch.zeros(7, 2), torch.zeros(7)), 7),
    ({"input_ids": torch.zeros(3, 9)}, 3),
    ([[torch.zeros(2, 1)]], 2),
    (torch.tensor(1.0), -1),
    ("text", -1),
    ({}, -1),
])
def test_batch_length(batch, expected):
    assert batch_length(batch) == expected


def test_warning_sink_warns_once_per_cause():
    sink = WarningSink(emit=True)
    from stepscope.errors import CaptureWarning

    with pytest.warns(CaptureWarning, match="first"):
        sink.once("cause", "first")
    sink.once("cause", "second")
    assert sink.messages == ["first"]


def test_a_commit_after_uninstall_neither_raises_nor_patches():
    # Exactly DISCOVERY_STEPS optimizer steps: the last one is committed by finish(), which used to
    # run after uninstall() and end discovery on an empty undo list (ValueError: list.remove).
    recorder = StepRecorder()
    hooks = TorchHooks(recorder, WarningSink(emit=False))
    before = originals()
    hooks.install()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(DISCOVERY_STEPS):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    hooks.uninstall()
    recorder.finish()
    assert recorder.count == DISCOVERY_STEPS
    assert originals() == before
    assert "__call__" not in vars(torch.nn.Linear)


def test_forward_steps_aside_while_torch_compiles(capture):
    """Under torch.compile / torch.export tracing (torch.compiler's flag held), a forward is not timed."""
    recorder, hooks, _ = capture
    assert hooks._compiler is torch.compiler  # this torch keeps the flag: read directly, no call
    model = torch.nn.Linear(2, 1)
    x = torch.zeros(1, 2)
    held = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        for _ in range(3):
            model(x)
    finally:
        torch.compiler._is_compiling_flag = held
    assert not hooks._root_classes  # the wrapper stepped aside: not even discovered
    model(x)
    assert type(model) in hooks._root_classes


def test_a_torch_without_the_compiling_flag_is_asked():
    from types import SimpleNamespace

    from stepscope.capture.hooks import _compiler_state

    answers = iter([False, True])
    state = _compiler_state(SimpleNamespace(compiler=SimpleNamespace(is_compiling=lambda: next(answers))))
    assert state._is_compiling_flag is False and state._is_compiling_flag is True
    assert _compiler_state(SimpleNamespace())._is_compiling_flag is False  # torch < 2.3: no torch.compiler
