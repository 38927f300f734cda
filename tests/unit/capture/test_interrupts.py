"""A Ctrl-C that lands inside capture's GC callback still reaches the script; one before the script
starts is one line, and the process ends by SIGINT."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import threading
import time

import pytest

from stepscope.capture.interrupts import SigintGuard, defer_in


@pytest.fixture
def default_sigint():
    """Python's default SIGINT handler, and no automatic collection (another thread's collection
    would run the callbacks there): only the test's own ``gc.collect()`` calls them."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are the main thread's")
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    enabled = gc.isenabled()
    gc.disable()
    yield
    if enabled:
        gc.enable()
    signal.signal(signal.SIGINT, previous)


def test_an_interrupt_inside_a_gc_callback_is_delivered_after_it(default_sigint, monkeypatch):
    lost = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: lost.append(info))
    fired, armed = [], []

    def callback(phase, info):
        if phase == "start" and armed and not fired and threading.current_thread() is threading.main_thread():
            fired.append(True)
            signal.raise_signal(signal.SIGINT)  # Python raises it at the next boundary: inside here
            sum(range(100))

    guard = SigintGuard()
    guard.install()
    defer_in(callback.__code__)
    gc.callbacks.append(callback)
    try:
        with pytest.raises(KeyboardInterrupt):
            armed.append(True)
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

    armed = []

    def callback(phase, info):
        if phase == "start" and armed and not lost and threading.current_thread() is threading.main_thread():
            signal.raise_signal(signal.SIGINT)
            sum(range(100))

    gc.callbacks.append(callback)
    try:
        armed.append(True)
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
