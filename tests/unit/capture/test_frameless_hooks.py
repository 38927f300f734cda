"""The C core's frame-less hooks: backward() timed by PhaseCall, the optimizer's global hooks by
OptimizerHook — the same phases as the Python wrappers, exceptions passed through untouched."""

from __future__ import annotations

import threading
import traceback

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
