"""Handing freed memory back to the operating system between the stages of a trace's analysis.

A trace's analysis allocates and frees arrays of millions of rows. glibc's ``malloc`` serves an
allocation above its mmap threshold with its own mapping, returned on ``free``, but the threshold
rises to the size of the largest block freed (up to 32 MiB), so most later columns of a big trace
come from the heap, and a freed block there stays in the process until the heap is trimmed. On
the 2 GB synthetic trace the analysis held ~230 MB more resident memory than its live arrays
because of that. :func:`trim` returns every free page (``malloc_trim(0)``: a few milliseconds);
on other C libraries it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

_TRIM: Any = None
_LOOKED_UP = False


def _lookup() -> Any:
    global _TRIM, _LOOKED_UP
    if not _LOOKED_UP:
        _LOOKED_UP = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _TRIM = getattr(libc, "malloc_trim", None)  # glibc only (musl has none)
            except OSError:
                _TRIM = None
    return _TRIM


def trim() -> bool:
    """Return the C heap's free pages to the system; True when the allocator could do it."""
    function = _lookup()
    if function is None:
        return False
    return bool(function(0))
