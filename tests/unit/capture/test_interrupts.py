"""A Ctrl-C that lands inside capture's GC callback still reaches the script; one before the script
starts is one line, and the process ends by SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from stepscope.capture.interrupts import SigintGuard


# Each scenario runs in a fresh interpreter: signal dispositions, masks and gc callbacks left by
# other tests of the same worker process must not decide the outcome.
SCENARIO = """
import gc, signal, sys, threading, time
from stepscope.capture.interrupts import SigintGuard, defer_in

lost, fired, armed = [], [], []
sys.unraisablehook = lambda info: lost.append(info.exc_type.__name__)
gc.disable()  # only the collection below runs the callbacks

def callback(phase, info):
    if phase == "start" and armed and not fired:
        fired.append(True)
        signal.raise_signal(signal.SIGINT)  # Python raises it at the next boundary: inside here
        sum(range(100))

if sys.argv[1] == "guarded":
    guard = SigintGuard()
    guard.install()
    defer_in(callback.__code__)
gc.callbacks.append(callback)
outcome = "nothing"
try:
    armed.append(True)
    gc.collect()
    deadline = time.monotonic() + (10 if sys.argv[1] == "guarded" else 0.5)
    while time.monotonic() < deadline:  # the script's own code: where it must arrive
        sum(range(1000))
except KeyboardInterrupt:
    outcome = "KeyboardInterrupt"
gc.callbacks.remove(callback)
if sys.argv[1] == "guarded":
    guard.uninstall()
print(outcome, fired == [True], lost, signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def _scenario(mode: str) -> str:
    result = subprocess.run([sys.executable, "-c", SCENARIO, mode], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_an_interrupt_inside_a_gc_callback_is_delivered_after_it():
    assert _scenario("guarded") == "KeyboardInterrupt True [] True"


def test_without_the_guard_python_drops_it():
    # the bug the guard fixes: an exception raised in a gc callback is "ignored", the loop runs on
    assert _scenario("bare") == "nothing True ['KeyboardInterrupt'] True"


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
            "cli.main = interrupted\nfrom stepscope.cli.entry import console_main\nconsole_main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGINT
    assert result.stderr == "stepscope: interrupted (Ctrl-C)\n"


def test_ctrl_c_while_a_class_is_created_is_one_line_and_a_sigint_death():
    """Python 3.11 wraps a Ctrl-C raised in a descriptor's ``__set_name__`` (a class being created
    as a module imports: ``ipaddress``'s ``cached_property``) in a RuntimeError: still a Ctrl-C."""
    code = ("import stepscope.cli.main as cli\n"
            "class Interrupts:\n    def __set_name__(self, owner, name):\n        raise KeyboardInterrupt\n"
            "def interrupted():\n    class Module:\n        attribute = Interrupts()\n"
            "cli.main = interrupted\nfrom stepscope.cli.entry import console_main\nconsole_main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGINT, result.stderr
    assert result.stderr == "stepscope: interrupted (Ctrl-C)\n"
    other = code.replace("raise KeyboardInterrupt", "raise ValueError")  # any other error keeps its traceback
    result = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Error calling __set_name__" in result.stderr


def test_a_ctrl_c_a_callback_swallowed_is_not_printed_and_still_ends_the_command():
    """A Ctrl-C landing in a callback Python cannot raise from (importlib's module-lock weakref
    callbacks, while stepscope imports itself) is "ignored" with the handler's traceback: not
    shown, and the command ends by it: one line and a SIGINT death."""
    code = ("import signal, weakref\nimport stepscope.cli.main as cli\n"
            "class Thing:\n    pass\n"
            "def swallowed():\n    thing = Thing()\n"
            "    ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))\n"
            "    del thing\n    print('went on', flush=True)\n    return 0\n"
            "cli.main = swallowed\nfrom stepscope.cli.entry import console_main\nconsole_main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (
        -signal.SIGINT, "went on\n", "stepscope: interrupted (Ctrl-C)\n"), result.stderr
    # any other error a callback cannot raise is still printed as Python prints it
    other = code.replace("signal.raise_signal(signal.SIGINT)", "1 / 0")
    result = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "Exception ignored" in result.stderr and "ZeroDivisionError" in result.stderr


def test_the_session_guards_sigint_before_its_gc_callback_is_in_and_until_it_is_out(tmp_path, monkeypatch):
    """A Ctrl-C at the session's start (imports collect often) must never land in an unguarded callback."""
    from stepscope.capture.gc_pauses import GcPauseRecorder
    from stepscope.capture.session import CaptureSession

    seen = []
    start, stop = GcPauseRecorder.start, GcPauseRecorder.stop

    def guarded() -> bool:
        return signal.getsignal(signal.SIGINT) is not signal.default_int_handler

    def spying_start(self):
        seen.append(("start", guarded()))
        return start(self)

    def spying_stop(self):
        seen.append(("stop", guarded()))
        return stop(self)

    monkeypatch.setattr(GcPauseRecorder, "start", spying_start)
    monkeypatch.setattr(GcPauseRecorder, "stop", spying_stop)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    session = CaptureSession(tmp_path / "run", sample_interval_s=None, count_flops=False, emit_warnings=False,
                             stacks_hz=97).start()
    session.stop()
    assert seen[0] == ("start", True) and seen[1] == ("stop", True)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
