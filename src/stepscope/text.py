"""Text from scripts and files, made safe to print on a terminal.

Contract: :func:`printable` returns its input with every control character shown as a visible
escape — C0 controls (newline and tab included), DEL, C1 controls and the Unicode bidirectional
overrides become ``\\x1b``, ``\\n``, ``\\x9b``, ``\\u202e`` — and everything else, ordinary Unicode
included, unchanged. Operator and kernel names, class names, script names, command lines and
warnings come from files and scripts a user may not have written: printed raw, an ESC sequence in
one could retitle the window, hide lines, fake output or write to the clipboard (OSC 52).

Renderers apply it where such a string is formatted for the terminal; JSON output keeps the raw
string (JSON escapes controls itself). stepscope's own message lines — ``stepscope: error: …``,
``stepscope: wrote …``, warnings and notices, which name paths, scripts and exception texts — are
printed through :func:`say`, which passes the whole line through :func:`printable`: a directory
named with an ESC sequence shows as ``\x1b…`` instead of recolouring or retitling the terminal.
"""

from __future__ import annotations

import sys
from typing import IO, Any

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C]
_TABLE = {code: _NAMED.get(chr(code), f"\\x{code:02x}") for code in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))}
_TABLE.update({code: f"\\u{code:04x}" for code in _BIDI})


def printable(text: Any) -> str:
    """``str(text)`` with control characters escaped (see the module docstring); ``None`` stays ``""``."""
    if text is None:
        return ""
    text = text if isinstance(text, str) else str(text)
    return text.translate(_TABLE) if not text.isprintable() else text


def say(line: Any, file: IO[str] | None = None, *, flush: bool = False) -> None:
    """Print one message line of stepscope (stderr unless ``file``), escaped by :func:`printable`:
    the way every message that names a path, a script or an exception reaches the terminal."""
    print(printable(line), file=file if file is not None else sys.stderr, flush=flush)


def progress(line: Any) -> None:
    """``stepscope: line`` on stderr, escaped and flushed, as long-running commands report their
    steps; a closed or broken stderr loses the line, never the command."""
    try:
        say(f"stepscope: {line}", flush=True)
    except (OSError, ValueError):
        pass
