"""The error hierarchy.

Every error a *user* can cause (a bad option, a missing file, a damaged record or trace) is a
`StepscopeError`. The CLI (`stepscope.cli.main`) is the single boundary that turns one into the
line ``stepscope: error: <message>`` and exit code 2. Anything else reaching that boundary is a bug
and keeps its traceback.

Messages say what went wrong, where, and what to do about it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "StepscopeError",
    "UsageError",
    "InputError",
    "CaptureError",
    "CaptureWarning",
    "EXIT_USAGE",
]

#: Exit code for every user mistake (argparse uses the same).
EXIT_USAGE = 2


class StepscopeError(Exception):
    """Base class of every error caused by user input or environment."""


class UsageError(StepscopeError):
    """A command-line option or API argument is invalid."""


class InputError(StepscopeError):
    """A file given to stepscope cannot be used (missing, damaged, wrong kind, too new).

    Args:
        path: the offending file or directory.
        message: what is wrong and what to do.
        position: optional byte offset or event index inside the file.
    """

    def __init__(self, path: str | Path, message: str, position: int | str | None = None):
        self.path = str(path)
        self.position = position
        where = self.path if position is None else f"{self.path} (at {position})"
        super().__init__(f"{where}: {message}")


class CaptureError(StepscopeError):
    """Capture could not be set up (e.g. the output directory is not writable)."""


class CaptureWarning(UserWarning):
    """Capture degraded (a hook failed, a metric is unavailable); the user's run continues."""
