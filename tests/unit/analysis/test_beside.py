"""The operator views of a large trace computed in a forked child beside the other views: the very
analysis of one process; and a child that fails, dies or cannot pickle its value, or a process that
runs another thread, leaves the work to this process with the same result."""

from __future__ import annotations

import os
import threading

import pytest

from stepscope.analysis.trace import beside as beside_module
from stepscope.analysis.trace import rank_analysis
from stepscope.analysis.trace.rank_analysis import analyze_rank
from stepscope.traces.load import load_trace
from tests.unit.analysis.reference_traces import _root

TRACE = "hta/trace_diff/control/control.json.gz"

pytestmark = pytest.mark.skipif(not (_root(TRACE) / TRACE).is_file(),
                                reason="the shared reference set is not beside the repository")


@pytest.fixture(scope="module")
def trace():
    return load_trace(_root(TRACE) / TRACE)


@pytest.fixture(scope="module")
def alone(trace):
    return analyze_rank(trace).to_dict()


@pytest.fixture
def delivered(monkeypatch):
    """Every trace forks its child; returns the list of what the children delivered (None: nothing)."""
    monkeypatch.setattr(rank_analysis, "BESIDE_MIN_EVENTS", 0)
    got: list = []
    real = beside_module.Beside.result

    def result(self):
        value = real(self)
        got.append(value)
        return value

    monkeypatch.setattr(beside_module.Beside, "result", result)
    return got


def test_the_child_computes_the_operator_views_and_the_analysis_is_the_same(trace, alone, delivered):
    assert analyze_rank(trace, workers=2).to_dict() == alone
    assert len(delivered) == 1 and delivered[0] is not None


def test_a_small_trace_or_one_worker_forks_nothing(trace, alone, monkeypatch):
    monkeypatch.setattr(beside_module, "Beside", _never)
    assert analyze_rank(trace, workers=2).to_dict() == alone  # under BESIDE_MIN_EVENTS
    monkeypatch.setattr(rank_analysis, "BESIDE_MIN_EVENTS", 0)
    assert analyze_rank(trace, workers=1).to_dict() == alone


def _never(*_args):
    raise AssertionError("forked where it should not")


@pytest.mark.parametrize("how", ["raises", "dies"])
def test_a_child_that_fails_or_dies_leaves_the_work_here(trace, alone, delivered, monkeypatch, how):
    parent = os.getpid()
    real = rank_analysis._operator_views

    def views(*args):
        if os.getpid() != parent:
            if how == "dies":
                os._exit(3)
            raise MemoryError("the child ran out of memory")
        return real(*args)

    monkeypatch.setattr(rank_analysis, "_operator_views", views)
    assert analyze_rank(trace, workers=2).to_dict() == alone
    assert delivered == [None]


def test_another_thread_means_no_fork(trace, alone, delivered):
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert analyze_rank(trace, workers=2).to_dict() == alone
    finally:
        stop.set()
        other.join()
    assert delivered == []


@pytest.mark.parametrize("where", ["machine or cgroup", "nothing readable"])
def test_a_machine_without_memory_to_spare_keeps_to_one_process(where, trace, alone, delivered, monkeypatch):
    from stepscope.traces import spill

    # the machine's available memory, or a memory cgroup's room, below what this process holds; or
    # neither readable (a room that cannot be read is not room to spare)
    monkeypatch.setattr(spill, "headroom", lambda: 1024 if where == "machine or cgroup" else None)
    assert analyze_rank(trace, workers=2).to_dict() == alone
    assert delivered == []


def test_a_value_that_does_not_pickle_comes_back_as_none():
    child = beside_module.beside(lambda: (lambda: 1))
    assert child is not None and child.result() is None
    child = beside_module.beside(lambda: {"rows": [1, 2, 3]})
    assert child is not None and child.result() == {"rows": [1, 2, 3]}
