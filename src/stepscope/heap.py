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

import functools
import sys
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: only a trace's analysis trims

    try:  # glibc's soname first: ctypes.util.find_library runs `ldconfig -p` in a child (~10 ms a process)
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so")
        except OSError:
            return None
    return getattr(libc, "malloc_trim", None)  # glibc only (musl has none)


def trim() -> bool:
    """Return the C heap's free pages to the system; True when the allocator could do it."""
    function = _malloc_trim()
    return False if function is None else bool(function(0))
