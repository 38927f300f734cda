"""The console script's entry: the Ctrl-C boundary, in place before any other stepscope module loads.

A Ctrl-C that reaches here came before the script started (stepscope importing itself, parsing,
starting the sampler) or in a command of stepscope's own: one line, and the process ends by SIGINT
as Python's would, without a traceback of stepscope's internals — also when a second Ctrl-C
follows the first (SIGINT is ignored from the first line of the handler on, the process is ending
by it anyway). The script's own Ctrl-C is the script's: :mod:`stepscope.capture.launcher` reports
it as Python does.
"""

from __future__ import annotations

# only modules the interpreter has loaded already (``_signal`` is the built-in behind ``signal``, which
# imports enum and collections: ~10 ms more before the try below could catch a Ctrl-C)
import _signal
import os
import sys


def console_main() -> None:
    code = 128 + _signal.SIGINT
    try:
        from stepscope.cli import main as cli

        code = cli.main()
    except KeyboardInterrupt:
        interrupted()
    sys.exit(code)


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
