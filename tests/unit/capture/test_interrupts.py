"""A Ctrl-C that lands inside capture's GC callback still reaches the script; one before the script
starts is one line, and the process ends by SIGINT."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import time

import pytest

from stepscope.capture.interrupts import SigintGuard, defer_in


@pytest.fixture
def default_sigint():
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupt_inside_a_gc_callback_is_delivered_after_it(default_sigint, monkeypatch):
    lost = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: lost.append(info))
    fired = []

    def callback(phase, info):
        if phase == "start" and not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGINT)  # Python raises it at the next boundary: inside here
            sum(range(100))

    guard = SigintGuard()
    guard.install()
    defer_in(callback.__code__)
    gc.callbacks.append(callback)
    try:
        with pytest.raises(KeyboardInterrupt):
            gc.collect()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the script's own code: where it must arrive
                sum(range(1000))
    finally:
        gc.callbacks.remove(callback)
        guard.uninstall()
    assert fired and lost == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_the_guard_python_drops_it(default_sigint, monkeypatch):
    # the bug the guard fixes: an exception raised in a gc callback is "ignored"
    lost = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: lost.append(info.exc_type))

    def callback(phase, info):
        if phase == "start" and not lost:
            signal.raise_signal(signal.SIGINT)
            sum(range(100))

    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
    assert lost == [KeyboardInterrupt]


def test_a_script_s_own_handler_is_left_alone():
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGINT, mine)
    try:
        guard = SigintGuard()
        guard.install()
        assert not guard.installed and signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_before_the_script_is_one_line_and_a_sigint_death():
    code = ("import stepscope.cli.main as cli\n"
            "def interrupted():\n    raise KeyboardInterrupt\n"
            "cli.main = interrupted\ncli.console_main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGINT
    assert result.stderr == "stepscope: interrupted (Ctrl-C)\n"
