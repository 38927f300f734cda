"""The console script's entry: the Ctrl-C boundary, in place before any other stepscope module loads.

A Ctrl-C that reaches here came before the script started (stepscope importing itself, parsing,
starting the sampler) or in a command of stepscope's own: one line, and the process ends by SIGINT
as Python's would, without a traceback of stepscope's internals — also when a second Ctrl-C
follows the first (SIGINT is ignored from the first line of the handler on, the process is ending
by it anyway). The script's own Ctrl-C is the script's: :mod:`stepscope.capture.launcher` reports
it as Python does.

Until the script starts, SIGINT's handler is :func:`_note_ctrl_c`: Python's own behaviour (raise
``KeyboardInterrupt``) that also notes the Ctrl-C, because the exception does not always arrive
as itself. A C extension's initialisation can turn it into another exception (numpy's
``_distributor_init`` import gave ``TypeError: expected a message argument``, once in ~100 double
Ctrl-Cs at start-up) or a library's import can swallow it. Noted, any exception that ends the
command is reported as the Ctrl-C it was, and ``stepscope run`` does not start the script after a
Ctrl-C it lost on the way (:func:`script_starts`, which also gives SIGINT back to Python's handler).
"""

from __future__ import annotations

# only modules the interpreter has loaded already (``_signal`` is the built-in behind ``signal``, which
# imports enum and collections: ~10 ms more before the try below could catch a Ctrl-C)
import _signal
import os
import sys

_ctrl_c_noted = False  # a Ctrl-C arrived while stepscope started (before the script's first line)


def _note_ctrl_c(signum: int, frame: object) -> None:  # frame: not typed, ``types`` is not loaded yet
    global _ctrl_c_noted
    _ctrl_c_noted = True
    raise KeyboardInterrupt


_unraisable_before = sys.unraisablehook  # the hook :func:`_quiet_noted_ctrl_c` hands the rest to
_ctrl_c_swallowed = False  # a Ctrl-C of :func:`_note_ctrl_c` raised where Python could only ignore it


def _quiet_noted_ctrl_c(unraisable: sys.UnraisableHookArgs) -> None:
    """``sys.unraisablehook`` until the script starts. A Ctrl-C that :func:`_note_ctrl_c` raises
    inside a callback Python cannot raise from (a weakref callback of importlib's module locks, a
    finalizer) would be printed as "Exception ignored" with a traceback of the handler (seen once
    in a test run's 26 double Ctrl-Cs at start-up) and lost: it is not printed, and the command
    ends by it once it can (:func:`script_starts`, or the end of a command of stepscope's own)."""
    global _ctrl_c_swallowed
    tb = unraisable.exc_traceback
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None and tb.tb_frame.f_code is _note_ctrl_c.__code__:
        _ctrl_c_swallowed = True
        return
    _unraisable_before(unraisable)


def console_main() -> None:
    global _unraisable_before
    code = 128 + _signal.SIGINT
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, _note_ctrl_c)
        _unraisable_before, sys.unraisablehook = sys.unraisablehook, _quiet_noted_ctrl_c
    try:
        _import_orjson_uninterrupted()
        from stepscope.cli import main as cli

        code = cli.main()
        if _ctrl_c_swallowed:  # a Ctrl-C no code of stepscope's saw: the command ends by it now
            raise KeyboardInterrupt
        if cli.exits_quickly():
            quick_exit(code)
    except KeyboardInterrupt:
        interrupted()
    except Exception as exc:  # noqa: BLE001 - SystemExit passes through
        if not (_ctrl_c_noted or interrupted_by_ctrl_c(exc)):
            raise
        interrupted()
    sys.exit(code)


def script_starts() -> None:
    """The user's script is about to run in this process: SIGINT goes back to Python's own handler
    (the script's Ctrl-C is the script's, and capture's guard takes over only that handler), and a
    Ctrl-C noted during start-up but lost on the way (a library's import caught it) ends the
    command now, before the script starts, instead of being forgotten."""
    if _signal.getsignal(_signal.SIGINT) is _note_ctrl_c:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    if sys.unraisablehook is _quiet_noted_ctrl_c:
        sys.unraisablehook = _unraisable_before
    if _ctrl_c_noted:
        raise KeyboardInterrupt


def interrupted_by_ctrl_c(exc: BaseException) -> bool:
    """Whether ``exc`` wraps a Ctrl-C: Python 3.11 turns an exception raised while a class is being
    created (a descriptor's ``__set_name__``, e.g. ``functools.cached_property`` in ``ipaddress``)
    into ``RuntimeError("Error calling __set_name__ ...")`` with the ``KeyboardInterrupt`` as its
    cause, so a Ctrl-C landing while such a module imports arrives as that (seen once in ~50 double
    Ctrl-Cs during start-up)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, KeyboardInterrupt):
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return False


def _import_orjson_uninterrupted() -> None:
    """Import orjson with SIGINT blocked. orjson's module initialisation imports ``uuid`` and others
    and uses the result unchecked: a Ctrl-C landing while those import makes it dereference NULL
    and the interpreter dies by SIGSEGV (measured: 30 of 100 ``python -c "import orjson"``
    interrupted during the import; 1 in ~100 ``stepscope run`` started with two Ctrl-Cs). Blocked,
    the signal waits in the kernel and arrives as the mask is restored, as a ``KeyboardInterrupt``
    the caller handles."""
    block = getattr(_signal, "pthread_sigmask", None)
    if block is None:  # no POSIX signal masks (Windows): nothing to block
        return
    previous = block(_signal.SIG_BLOCK, {_signal.SIGINT})
    try:
        import orjson  # noqa: F401 - loaded here so that every later import finds it initialised
    except ImportError:
        pass
    finally:
        block(_signal.SIG_SETMASK, previous)


def quick_exit(code: int) -> None:
    """End now with ``code``, the output flushed, without the interpreter's teardown (see
    ``stepscope.cli.main.QUICK_EXIT_COMMANDS``); returns (the caller exits as usual) where another
    thread runs or the output cannot be flushed."""
    import threading

    if threading.active_count() != 1:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        return
    os._exit(code)


def interrupted() -> None:
    """Say so in one line and end the process by SIGINT (does not return)."""
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    try:
        sys.stderr.write("stepscope: interrupted (Ctrl-C)\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    os.kill(os.getpid(), _signal.SIGINT)
    os._exit(128 + _signal.SIGINT)  # pragma: no cover - only if the signal did not end us
