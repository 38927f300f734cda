"""The two recorder cores (C extension and Python) are one state machine: random call sequences
give the same rows, counters and errors; the C core is the one a source install runs."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.clock import FakeClock
from stepscope.capture import recorder
from stepscope.switches import switch
from stepscope.capture.recorder import (BACKWARD, COMMUNICATION, COMPILE, DATA_WAIT, FORWARD, OPTIMIZER, OTHER,
                                        PyStepRecorder)

needs_c = pytest.mark.skipif(recorder.CStepRecorder is None, reason=f"C core not in use: {recorder.PYTHON_CORE_REASON}")

PHASES = st.sampled_from([OTHER, DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COMMUNICATION, COMPILE])
KEYS = st.sampled_from([0, 11, 22])
OPTIMIZERS = st.sampled_from([1, 2])
#: single calls, in any order (unbalanced ones included: the cores must ignore them alike)
CALL = st.one_of(
    st.tuples(st.just("enter"), PHASES),
    st.tuples(st.just("leave"), PHASES),
    st.tuples(st.just("fetch_begin")),
    st.tuples(st.just("fetch_end"), st.sampled_from([-1, 0, 250]), st.sampled_from([-1, 0, 8])),
    st.tuples(st.just("forward_begin"), KEYS, st.booleans()),
    st.tuples(st.just("forward_end"), KEYS),
    st.tuples(st.just("optimizer_started"), OPTIMIZERS),
    st.tuples(st.just("optimizer_finished"), OPTIMIZERS),
    st.tuples(st.just("batch_requested")),
    st.tuples(st.just("batch_received"), st.sampled_from([-1, 4])),
    st.tuples(st.just("model_forward_started"), KEYS, st.booleans()),
    st.tuples(st.just("model_forward_finished"), KEYS),
    st.tuples(st.just("loader_init"), st.sampled_from([0, 30])),
    st.tuples(st.just("loader_cpu"), st.sampled_from([0, 40])),
    st.tuples(st.just("add_overlap"), st.sampled_from([-5, 7])),
    st.tuples(st.just("mark_step")),
)
#: ... and balanced blocks as the hooks make them (a fetch, a forward, an optimizer step, a phase),
#: nested, so training, inference and hand-written loops all occur
BLOCKS = st.recursive(
    st.one_of(CALL, st.tuples(st.just("fetch"), st.sampled_from([-1, 250]), st.sampled_from([-1, 8]))),
    lambda inner: st.one_of(
        st.tuples(st.just("forward"), KEYS, st.booleans(), st.lists(inner, max_size=3)),
        st.tuples(st.just("optimizer"), OPTIMIZERS, st.lists(inner, max_size=3)),
        st.tuples(st.just("nest"), PHASES, st.lists(inner, max_size=3)),
    ),
    max_leaves=12,
)


def flatten(blocks, out):
    for block in blocks:
        kind = block[0]
        if kind == "fetch":
            out += [("fetch_begin",), ("fetch_end", block[1], block[2])]
        elif kind == "forward":
            out.append(("forward_begin", block[1], block[2]))
            flatten(block[3], out)
            out.append(("forward_end", block[1]))
        elif kind == "optimizer":
            out.append(("optimizer_started", block[1]))
            flatten(block[2], out)
            out.append(("optimizer_finished", block[1]))
        elif kind == "nest":
            out.append(("enter", block[1]))
            flatten(block[2], out)
            out.append(("leave", block[1]))
        else:
            out.append(block)
    return out


class Listener:
    def __init__(self):
        self.calls = []

    def start(self, action):
        self.calls.append(("start", action))

    def stop(self, action):
        self.calls.append(("stop", action))


class Stop(Exception):
    pass


def replay(cls, calls, gaps, listener, stride=1):
    clock = FakeClock(1_000)
    rec = cls(clock=clock, phase_listener=Listener() if listener else None)
    commits = []

    def on_commit(index):
        commits.append(index)
        rec.next_commit_call = index + stride  # called back only from there on

    rec.on_commit = on_commit
    for call, gap in zip(calls, gaps):
        clock.advance(gap)
        getattr(rec, call[0])(*call[1:])
    clock.advance(3)
    rec.finish()
    state = {name: getattr(rec, name) for name in ("count", "mode", "trailing_ns", "backwards", "model_forwards",
                                                   "model_forwards_no_grad", "optimizer_steps", "foreign_thread_calls")}
    return rec.row_bytes(), state, commits, rec.listener.calls if listener else None


@needs_c
@settings(max_examples=400, deadline=None)
@given(blocks=st.lists(BLOCKS, max_size=12), gaps=st.lists(st.integers(0, 1000), min_size=1, max_size=50),
       listener=st.booleans(), stride=st.integers(1, 3))
def test_both_cores_record_the_same_steps(blocks, gaps, listener, stride):
    calls = flatten(blocks, [])
    gaps = (gaps * (len(calls) // len(gaps) + 1))[:len(calls)]
    assert replay(recorder.CStepRecorder, calls, gaps, listener, stride) == \
        replay(PyStepRecorder, calls, gaps, listener, stride)


@needs_c
@pytest.mark.parametrize("cls", [PyStepRecorder, recorder.CStepRecorder], ids=["python", "c"])
def test_an_exception_from_a_callback_leaves_the_same_state(cls):
    clock = FakeClock(0)
    rec = cls(clock=clock)
    armed = []

    def stop():
        if armed:
            raise Stop

    rec.at_boundary = stop
    for _ in range(2):
        rec.fetch_begin(); clock.advance(5); rec.fetch_end(-1, 2)
        rec.optimizer_started(1); clock.advance(7); rec.optimizer_finished(1)
    armed.append(True)
    with pytest.raises(Stop):
        rec.fetch_begin()
    assert rec.count == 2 and not rec.has_pending and rec.current_phase() == OTHER
    rec.finish()
    assert rec.steps().duration_ns.tolist() == [12, 12]


@pytest.mark.parametrize("cls", [PyStepRecorder, recorder.CStepRecorder or PyStepRecorder], ids=["python", "c"])
def test_calls_from_another_thread_are_ignored_and_counted(cls):
    rec = cls()
    rec.enter(FORWARD)
    worker = threading.Thread(target=lambda: (rec.leave(FORWARD), rec.fetch_begin(), rec.optimizer_started(3)))
    worker.start()
    worker.join()
    assert rec.foreign_thread_calls == 3 and rec.current_phase() == FORWARD
    rec.leave(FORWARD)
    assert rec.current_phase() == OTHER


@needs_c
def test_the_native_clock_is_perf_counter_ns():
    rec = recorder.CStepRecorder()
    before = time.perf_counter_ns()
    now = rec.enter(FORWARD)
    after = time.perf_counter_ns()
    assert before <= now <= after


def test_a_source_checkout_runs_the_c_core():
    if switch("STEPSCOPE_PURE_PYTHON", False):
        pytest.skip("STEPSCOPE_PURE_PYTHON is set")
    assert recorder.CORE == "c", recorder.PYTHON_CORE_REASON


@needs_c
def test_a_core_built_from_older_source_is_not_used(monkeypatch):
    from stepscope.capture import _fastrec

    monkeypatch.setattr(_fastrec, "SOURCE_SHA", "0" * 16)
    core, reason = recorder._c_core()
    assert core is None and "older _fastrec.c" in reason
    monkeypatch.setenv("STEPSCOPE_PURE_PYTHON", "1")
    assert recorder._c_core() == (None, "STEPSCOPE_PURE_PYTHON is set")
