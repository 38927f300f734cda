"""The C core's frame-less hooks: backward() timed by PhaseCall, the optimizer's global hooks by
OptimizerHook — the same phases as the Python wrappers, exceptions passed through untouched."""

from __future__ import annotations

import threading
import traceback
import weakref

import pytest

from fakes.clock import FakeClock
from stepscope.capture import recorder
from stepscope.capture.recorder import BACKWARD, OPTIMIZER

_fastrec = pytest.importorskip("stepscope.capture._fastrec", reason="the C core is not built")


class Gate:
    live = True


def _recorder():
    clock = FakeClock()
    return recorder.CStepRecorder(clock=clock), clock


def test_phase_call_times_the_call_and_passes_results_and_exceptions():
    rec, clock = _recorder()
    seen = []

    def work(x, *, y=0):
        seen.append(rec.current_phase())
        clock.advance(1000)
        if x < 0:
            raise ValueError("negative")
        return x + y

    wrapped = _fastrec.PhaseCall(work, rec, Gate(), BACKWARD)
    assert wrapped(1, y=2) == 3 and seen == [BACKWARD] and rec.current_phase() != BACKWARD
    with pytest.raises(ValueError, match="negative") as caught:
        wrapped(-1)
    assert rec.current_phase() != BACKWARD  # left also when the call raised
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-1] == "work" and len(frames) == 2  # this test, then the callee: no frame in between


def test_phase_call_is_a_plain_call_when_capture_is_off_or_on_another_thread():
    rec, _ = _recorder()
    gate = Gate()
    phases = []
    wrapped = _fastrec.PhaseCall(lambda: phases.append(rec.current_phase()), rec, gate, BACKWARD)
    gate.live = False
    wrapped()
    gate.live = True
    thread = threading.Thread(target=wrapped)
    thread.start()
    thread.join()
    assert BACKWARD not in phases and rec.foreign_thread_calls == 1


def test_optimizer_hooks_mark_the_step_and_report_a_new_optimizer_once():
    rec, clock = _recorder()
    new = []
    pre = _fastrec.OptimizerHook(rec, Gate(), True, new.append)
    post = _fastrec.OptimizerHook(rec, Gate(), False)
    optimizer = object()
    for _ in range(3):
        pre(optimizer, (), {})
        assert rec.current_phase() == OPTIMIZER
        clock.advance(500)
        post(optimizer, (), {})
        clock.advance(500)
    assert new == [optimizer] and rec.optimizer_steps == 3 and rec.count == 2
    other = object()
    pre(other, (), {})
    assert new == [optimizer, other]


class _Compiler:
    _is_compiling_flag = False


def _forward_class(rec, keys, compiler=None, roots=None, log=None):
    """A module-like class whose __call__ is a ForwardCall around its own call."""
    from stepscope.capture.recorder import FORWARD

    log = [] if log is None else log

    class Net:
        def __init__(self, params=True):
            self.params = params

        def __call__(self, x, *, scale=1):
            log.append(rec.current_phase() == FORWARD)
            if x < 0:
                raise ValueError("negative")
            if x > 10:
                return self(x - 10)  # an inner call of the same class: part of this forward
            return x * scale

    import torch

    Net.__call__ = _fastrec.ForwardCall(Net.__call__, rec, Gate(), keys, compiler or _Compiler(),
                                        torch.is_grad_enabled, lambda m: m.params, roots)
    return Net


def test_forward_call_times_root_forwards_binds_like_a_method_and_passes_exceptions():
    rec, clock = _recorder()
    keys: dict = {}
    log: list = []
    roots: set = set()
    Net = _forward_class(rec, keys, roots=roots, log=log)
    net, loss = Net(), Net(params=False)
    assert net(2, scale=3) == 6 and net.__call__(1) == 1 and log == [True, True]
    assert rec.current_phase() != recorder.FORWARD and rec.model_forwards == 2
    assert keys[id(net)][0]() is net and keys[id(net)][1] == id(net)
    assert loss(1) == 1 and keys[id(loss)][1] == 0 and rec.model_forwards == 2  # no parameters: not the model
    assert roots == {Net}
    assert net(25) == 5 and rec.model_forwards == 3 and rec.forward_depth == 0  # inner calls: one forward
    with pytest.raises(ValueError, match="negative") as caught:
        net(-1)
    assert rec.current_phase() != recorder.FORWARD and rec.forward_depth == 0
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-1] == "__call__" and len(frames) == 2  # this test, then the callee
    assert all(isinstance(ref, weakref.ref) for ref, _ in keys.values())  # keeps no module alive


def test_forward_call_steps_aside_when_off_compiling_or_nested():
    rec, _ = _recorder()
    compiler = _Compiler()
    log: list = []
    Net = _forward_class(rec, {}, compiler=compiler, log=log)
    net = Net()
    compiler._is_compiling_flag = True
    assert net(1) == 1 and log == [False] and rec.model_forwards == 0
    compiler._is_compiling_flag = False
    rec.forward_depth = 1  # inside another root forward (e.g. the Python discovery wrapper's)
    assert net(1) == 1 and rec.model_forwards == 0
    rec.forward_depth = 0
    thread = threading.Thread(target=net, args=(1,))
    thread.start()
    thread.join()
    assert rec.foreign_thread_calls >= 1 and rec.model_forwards == 0


def _next_class(rec, items, cpu_every=1):
    import torch

    from stepscope.capture.hooks import batch_length

    class Iterator:
        def __init__(self, info=None):
            self.items = list(items)
            if info is not None:
                self._stepscope_loader = info

        def __next__(self):
            if not self.items:
                raise StopIteration
            item = self.items.pop(0)
            if isinstance(item, Exception):
                raise item
            return item

    Iterator.__next__ = _fastrec.NextCall(Iterator.__next__, rec, Gate(), batch_length, torch.Tensor, cpu_every)
    return Iterator


def test_next_call_times_the_data_wait_counts_batches_and_passes_stop_iteration():
    import torch

    rec, clock = _recorder()
    batches = [torch.zeros(4, 2), (torch.zeros(3), torch.zeros(3)), {"x": torch.zeros(5)}, [torch.tensor(1.0), torch.zeros(6)],
               "text", RuntimeError("worker died")]
    info = {"in_process": True, "batches": 0, "wait_ns": 0}
    iterator = _next_class(rec, batches)(info)
    got = [next(iterator) for _ in range(5)]
    assert got[4] == "text" and info["batches"] == 5 and info["wait_ns"] >= 0
    with pytest.raises(RuntimeError, match="worker died") as caught:
        next(iterator)
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-1] == "__next__" and len(frames) == 2
    with pytest.raises(StopIteration):
        next(iterator)
    assert rec.current_phase() != recorder.DATA_WAIT and info["batches"] == 5
    # each fetch ends the step before it: the batch lengths, from the C fast path (a tensor, a
    # tuple of tensors) and from the Python rules (a dict; a 0-d first leaf; text: unknown)
    assert list(rec.steps().samples[:4]) == [4, 3, 5, 6]


def test_next_call_without_loader_info_or_when_off():
    rec, _ = _recorder()
    iterator = _next_class(rec, [1, 2])()  # an iterator capture did not see start: timed, not counted
    assert next(iterator) == 1 and rec.current_phase() != recorder.DATA_WAIT
    gate = Gate()
    gate.live = False
    plain = _fastrec.NextCall(lambda it: 5, rec, gate, lambda b: 1, object, 1)
    before = rec.count

    class Quiet:
        __next__ = plain

    assert next(Quiet()) == 5 and rec.count == before and rec.current_phase() != recorder.DATA_WAIT
