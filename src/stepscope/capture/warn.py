"""Warnings of capture itself: shown once per cause, and kept for the record."""

from __future__ import annotations

import warnings

from stepscope.errors import CaptureWarning


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
            warnings.warn(f"stepscope: {message}", CaptureWarning, stacklevel=3)

    def note(self, message: str) -> None:
        """Record without emitting a Python warning (informational)."""
        self.messages.append(message)
