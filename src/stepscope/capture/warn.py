"""Warnings of capture itself: shown once per cause, and kept for the record.

They are issued as :class:`~stepscope.errors.CaptureWarning` (so ``-W error`` and warning filters
work), attributed to ``stepscope`` rather than to a line of our code or of the script: Python
would otherwise print that source line under the message. Issuing one never raises, even when the
script closed ``sys.stderr``. The message shown is escaped by :func:`stepscope.text.printable` (a
path or an exception text with control characters reaches the terminal as visible escapes).
"""

from __future__ import annotations

import warnings

from stepscope.errors import CaptureWarning
from stepscope.text import printable


def emit(message: str) -> None:
    """Issue one CaptureWarning without a source line; never raises (unless filters say error)."""
    try:
        warnings.warn_explicit(printable(message), CaptureWarning, filename="stepscope", lineno=0,
                               module="stepscope", registry={})
    except (OSError, ValueError, AttributeError):  # stderr closed or gone
        pass


class WarningSink:
    """Collects capture warnings; each cause warns once (cf. Lightning's WarningCache)."""

    def __init__(self, emit: bool = True):
        self.messages: list[str] = []
        self._seen: set[str] = set()
        self.emit = emit

    def once(self, cause: str, message: str) -> None:
        if cause in self._seen:
            return
        self._seen.add(cause)
        self.messages.append(message)
        if self.emit:
            emit(message)

    def note(self, message: str) -> None:
        """Record without emitting a Python warning (informational)."""
        self.messages.append(message)
