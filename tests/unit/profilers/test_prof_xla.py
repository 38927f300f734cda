"""XLAProfiler: construction checks, and the calls it makes to torch_xla (faked: no TPU here)."""

from __future__ import annotations

import copy
import sys
import types

import pytest

from stepscope.errors import UsageError
from stepscope.profilers import XLAProfiler


class FakeXlaProfilerModule(types.ModuleType):
    """Exactly the ``torch_xla.debug.profiler`` functions XLAProfiler calls, recording them."""

    def __init__(self) -> None:
        super().__init__("torch_xla.debug.profiler")
        self.calls: list[tuple] = []

    def start_server(self, port):
        self.calls.append(("start_server", port))
        return f"server:{port}"

    def Trace(self, name):  # noqa: N802 - torch_xla's name
        return self._context("Trace", name)

    def StepTrace(self, name, step_num):  # noqa: N802 - torch_xla's name
        return self._context("StepTrace", name, step_num)

    def _context(self, *call):
        calls = self.calls

        class Context:
            def __enter__(self):
                calls.append(("enter", *call))

            def __exit__(self, *exc):
                calls.append(("exit", *call))

        return Context()


@pytest.fixture
def fake_xla(monkeypatch):
    module = FakeXlaProfilerModule()
    monkeypatch.setitem(sys.modules, "torch_xla", types.ModuleType("torch_xla"))
    monkeypatch.setitem(sys.modules, "torch_xla.debug", types.ModuleType("torch_xla.debug"))
    monkeypatch.setitem(sys.modules, "torch_xla.debug.profiler", module)
    return module


def test_without_torch_xla_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_xla", None)
    with pytest.raises(UsageError, match=r"XLAProfiler needs torch_xla .*pip install torch_xla"):
        XLAProfiler()


@pytest.mark.parametrize("port", [0, 70000, "9012", True, -1])
def test_port_is_validated(port, fake_xla):
    with pytest.raises(UsageError, match="port must be an int in 1..65535"):
        XLAProfiler(port=port)


def test_traces_step_actions_only(fake_xla, tmp_path):
    profiler = XLAProfiler(port=9100)
    profiler.setup("fit", None, str(tmp_path))
    assert profiler.dirpath is None  # nothing is written to files
    for _ in range(2):
        for action in ("[Strategy]S.training_step", "[Strategy]S.backward", "run_training_batch", "[Strategy]S.validation_step"):
            with profiler.profile(action):
                pass
    assert fake_xla.calls[0] == ("start_server", 9100)
    assert [call for call in fake_xla.calls if call[0] == "start_server"] == [("start_server", 9100)]
    entered = [call[1:] for call in fake_xla.calls if call[0] == "enter"]
    assert entered == [
        ("Trace", "[Strategy]S.training_step"),
        ("Trace", "[Strategy]S.backward"),
        ("StepTrace", "[Strategy]S.validation_step", 1),
        ("Trace", "[Strategy]S.training_step"),
        ("Trace", "[Strategy]S.backward"),
        ("StepTrace", "[Strategy]S.validation_step", 2),
    ]
    assert len([call for call in fake_xla.calls if call[0] == "exit"]) == 6
    assert profiler.summary() == ""


def test_plain_step_action_is_a_step_trace(fake_xla):
    profiler = XLAProfiler()
    profiler.start("step")
    profiler.teardown(None)  # closes open traces
    assert fake_xla.calls[1:] == [("enter", "StepTrace", "step", 1), ("exit", "StepTrace", "step", 1)]


def test_deepcopy_while_tracing(fake_xla):
    profiler = XLAProfiler()
    profiler.start("x.training_step")
    clone = copy.deepcopy(profiler)
    assert clone.port == 9012 and clone._recording_map == {} and clone.server is None
    profiler.stop("x.training_step")
