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
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: only a trace's analysis and the spill's writes call into the C library

    try:  # glibc's soname first: ctypes.util.find_library runs `ldconfig -p` in a child (~10 ms a process)
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        import ctypes.util

        try:
            return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so", use_errno=True)
        except OSError:
            return None


@functools.cache
def libc_function(name: str) -> Any:
    """The C library's function ``name`` (Linux; one handle for the process), None where there is
    none (``malloc_trim``: glibc only, musl has none)."""
    libc = _libc()
    return None if libc is None else getattr(libc, name, None)


#: glibc's ``mallopt`` parameters (``malloc.h``) and their defaults: the free bytes at the heap's
#: top past which ``free`` trims it (128 KiB), the bytes added to each growth of the heap (0), the
#: mmap threshold, and how many blocks may have a mapping of their own at once (65,536).
_M_TRIM_THRESHOLD, _GLIBC_TRIM_THRESHOLD = -1, 128 * 1024
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX, _GLIBC_MMAP_MAX = -4, 65536
_KEPT_TOP = (1 << 31) - 1  # the largest trim threshold mallopt takes (an int): never trimmed by free
_HEAP_GROWTH = 64 << 20  # the heap grows by at least this much: fewer brk calls for arrays of millions


#: Whether this process may keep freed blocks for the next (:func:`reuse_large_blocks`): set by the
#: analysis commands as typed, processes of stepscope's own that run no user code.
may_reuse = False
_reusing = False


def map_large_blocks(threshold: int = 1 << 20) -> bool:
    """From now on every block of at least ``threshold`` bytes gets a mapping of its own, returned
    to the system when freed (glibc's ``mallopt(M_MMAP_THRESHOLD)``, which also stops the threshold
    from rising; undoes :func:`reuse_large_blocks`); True when the allocator took it. For a process
    whose memory is tight: arrays of a chunk's size freed between longer-lived ones otherwise stay
    in the heap, fragmented, where ``trim`` cannot return them — the 10 GB trace's step breakdown
    held ~400 MB more resident memory than its live arrays that way. Each new block then costs
    fresh pages."""
    global _reusing
    function = libc_function("mallopt")
    if function is None:
        return False
    _reusing = False
    return all([function(_M_MMAP_MAX, _GLIBC_MMAP_MAX), function(_M_TRIM_THRESHOLD, _GLIBC_TRIM_THRESHOLD),
                function(_M_TOP_PAD, 0), function(_M_MMAP_THRESHOLD, threshold)])


def reuse_large_blocks() -> bool:
    """From now on every block comes from the heap, a large one too (glibc's ``mallopt(M_MMAP_MAX,
    0)``), and ``free`` never trims the heap's top (:func:`trim` returns its free pages where it is
    called): a freed array's pages serve the next array instead of going back to the system, so
    the next one does not fault in fresh pages for the kernel to zero — 29 % of the 10 GB trace's
    CPU time on a 2-core VM, where each fresh page is backed anew by the host. The price is memory:
    each process keeps its high-water mark, and a growing column copied into a new block (where a
    mapping of its own would grow in place) leaves its old one as a hole. True when the allocator
    took it."""
    global _reusing
    function = libc_function("mallopt")
    if function is None:
        return False
    _reusing = all([function(_M_MMAP_MAX, 0), function(_M_TRIM_THRESHOLD, _KEPT_TOP),
                    function(_M_TOP_PAD, _HEAP_GROWTH)])
    return _reusing


def reusing() -> bool:
    """Whether :func:`reuse_large_blocks` is in effect in this process (forked children inherit it)."""
    return _reusing


def trim() -> bool:
    """Return the C heap's free pages to the system; True when the allocator could do it."""
    function = libc_function("malloc_trim")
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
