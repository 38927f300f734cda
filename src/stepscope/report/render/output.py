"""Where a renderer writes, and how (:class:`Output`): the one argument every renderer takes
besides the report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO


@dataclass(frozen=True)
class Output:
    """Where a renderer writes, and how.

    Args:
        stream: the text stream of ``text``, ``json`` and ``flame`` (or ``path`` for ``json``).
        path: the file of ``html``, ``perfetto`` and ``json``; the directory of ``tensorboard``.
        width: terminal columns; None: the stream's own when it is a terminal, else as wide as the
            content needs (a file or a pipe gets whole table cells, never cut to 80 columns).
        top: rows of the operator and kernel tables (``text``).
        run_dir: how the summary names the run directory.
    """

    stream: IO[str] | None = None
    path: Path | None = None
    width: int | None = None
    top: int = 10
    run_dir: str | None = None
