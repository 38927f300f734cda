"""Memory around a trace's analysis: freed pages handed back to the operating system, and no
cycle-collector scans while tables are built.

A trace's analysis allocates and frees arrays of millions of rows. glibc's ``malloc`` serves an
allocation above its mmap threshold with its own mapping, returned on ``free``, but the threshold
rises to the size of the largest block freed (up to 32 MiB), so most later columns of a big trace
come from the heap, and a freed block there stays in the process until the heap is trimmed. On
the 2 GB synthetic trace the analysis held ~230 MB more resident memory than its live arrays
because of that. :func:`trim` returns every free page (``malloc_trim(0)``: a few milliseconds);
on other C libraries it does nothing.

Decoding a trace allocates millions of short-lived objects without cycles; each automatic
collection they set off scans every object the process holds. In a process that imported torch,
Lightning and Hugging Face (~360k objects: a notebook, a test worker) the dict decode of the 87 MB
reference trace took 3.6 s with the collector on and 1.0 s with those objects out of its scans
(`benchmarks/bench_gc_pause.py`). :func:`no_cycle_scans` pauses it meanwhile.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
from collections.abc import Iterator
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


#: glibc's ``mallopt`` parameter for the mmap threshold (``malloc.h``).
_M_MMAP_THRESHOLD = -3


def map_large_blocks(threshold: int = 1 << 20) -> bool:
    """From now on every block of at least ``threshold`` bytes gets a mapping of its own, returned
    to the system when freed (glibc's ``mallopt(M_MMAP_THRESHOLD)``, which also stops the threshold
    from rising); True when the allocator took it. For a process whose memory is tight: arrays of a
    chunk's size freed between longer-lived ones otherwise stay in the heap, fragmented, where
    ``trim`` cannot return them — the 10 GB trace's step breakdown held ~400 MB more resident
    memory than its live arrays that way. Each new block then costs fresh pages."""
    function = _mallopt()
    return False if function is None else bool(function(_M_MMAP_THRESHOLD, threshold))


@functools.cache
def _mallopt() -> Any:
    trim_function = _malloc_trim()  # glibc's libc, where there is one
    if trim_function is None:
        return None
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def trim() -> bool:
    """Return the C heap's free pages to the system; True when the allocator could do it."""
    function = _malloc_trim()
    return False if function is None else bool(function(0))


@contextlib.contextmanager
def no_cycle_scans(collect_young: bool = False) -> Iterator[None]:
    """The cycle collector paused inside the block and restored after (nested blocks leave it to the
    outermost). ``collect_young``: then one collection of the youngest generation, which holds every
    object made meanwhile, so the cycles among them are freed at once (a few ms, where a full
    collection also scans every imported module's objects)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
            if collect_young:
                gc.collect(0)
