"""A large trace's columns kept in files the kernel may page out, not in the process's own memory.

Contract: :func:`spiller` decides once per table whether its columns go to disk, and returns a
:class:`Spill` or ``None``. By default a table spills when its analysis would not fit in the memory
left to the process: :data:`FOOTPRINT` times its columns' bytes (the linked table and the views come
on top of the table) above what the machine has available (``MemAvailable``) or, in a container,
what its memory cgroup has left (v1 or v2: the limit less what it holds, its page cache excepted).
``STEPSCOPE_SPILL`` overrides that: a size (``256M``: every table of at least that many bytes of
columns), ``0`` (every table) or ``off`` (none). Either way the temporary directory (``TMPDIR``) must
be on a disk with room for the table twice. ``spill(values)`` writes an array to a file there, maps
the file read-only, removes its name at once (the mapping keeps the data; nothing is left behind if
the process dies) and returns a plain read-only ``ndarray`` over the mapping: the same values, the
same dtype and shape. Whatever fails (a full disk, a directory that cannot be written), it returns
the array it was given: spilling changes where a column lives, never the analysis.

While a trace is decoded, :class:`~stepscope.traces.events.TableBuilder` asks :func:`sink_for` the
same question every :data:`~stepscope.traces.events.FLUSH_ROWS` rows; from a yes on, its event columns
are appended to a :class:`ColumnSink`'s files as they are decoded and the table maps them whole when
it is built, so the decode never holds the table in memory either (a split decode's workers always
write theirs that way, and the parent streams them into its own files). A write that fails there
brings the rows written so far back into memory and the decode goes on without the sink.

Why. The views of a 10 GB trace read its ~26 M-row table and linked table again and again, ~106
bytes a row, all of it in anonymous memory: ~2.7 GB that the kernel can only keep, so the whole
analysis needs that much RAM to run at all. In a file mapping those pages are the page cache's: while
memory is plentiful they stay resident and the views read them as fast as before; under pressure
(a memory limit, a smaller machine) the kernel drops the ones not in use and reads them back when a
view needs them, instead of killing the process. Writing them costs time (~0.2 s a GB on a quiet
disk's page cache; ~8 s a GB on a virtual machine whose balloon takes freed pages back, where every
page written is one the host must back again), so a table that fits stays in memory. Where
``TMPDIR`` is a ``tmpfs`` the file would live in memory anyway, so nothing is spilled there.
"""

from __future__ import annotations

import functools
import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from stepscope import heap, limits
from stepscope.errors import UsageError

ENV_VAR = "STEPSCOPE_SPILL"
#: The analysis of a table holds about this many times its columns' bytes at its peak (measured:
#: 2.5x on the 2 GB synthetic trace, 2.4x on the 10 GB one), with a margin.
FOOTPRINT = 3
#: Below this an array stays in memory even in a spilled table (a file and a mapping per column).
MIN_ARRAY_BYTES = 1024**2
_MEMORY_FILESYSTEMS = frozenset(("tmpfs", "ramfs", "hugetlbfs"))


def min_bytes() -> int | None:
    """``STEPSCOPE_SPILL`` as a threshold in bytes (``0``: every table), ``None`` for ``off``, ``-1``
    when unset (spill what would not fit in memory)."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return -1
    if value.lower() in ("off", "no", "never"):
        return None
    if value == "0":
        return 0
    try:
        return limits.parse_size(value)
    except UsageError as exc:
        raise UsageError(f"{ENV_VAR}: {exc}; or 0 (every table) or off (none)") from None


class Spill:
    """Arrays written to files under ``directory`` and mapped back read-only (see the module docstring)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.bytes = 0  # what was spilled, for the benchmarks and the tests
        self.failed = False

    def __call__(self, values: np.ndarray) -> np.ndarray:
        if self.failed or values.nbytes < MIN_ARRAY_BYTES or not values.flags.c_contiguous:
            return values
        try:
            mapped = _write_and_map(self.directory, values)
        except (OSError, ValueError):
            self.failed = True  # a full disk fails the next one too: keep the rest in memory
            return values
        self.bytes += values.nbytes
        return mapped


def spiller(table_bytes: int) -> Spill | None:
    """A :class:`Spill` for a table of ``table_bytes`` bytes of columns, or None to keep it in memory."""
    threshold = min_bytes()
    if threshold is None or table_bytes < max(threshold, 1) or table_bytes < MIN_ARRAY_BYTES:
        return None
    short = threshold < 0  # spilling because memory is short (not because the setting says so)
    if short:
        room = headroom()
        if room is None or (FOOTPRINT - 1) * table_bytes <= room:  # the table itself is held already
            return None
    import tempfile  # here: only a large table spills (~4 ms to import)

    directory = tempfile.gettempdir()
    if _filesystem(directory) in _MEMORY_FILESYSTEMS:
        return None
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None
    if stats.f_bavail * stats.f_frsize < 2 * table_bytes:
        return None
    if short:  # a freed array goes back at once, not into a fragmented heap (each new one costs fresh pages)
        heap.map_large_blocks()
    return Spill(directory)


#: A trace's load lets the heap reuse freed arrays (:func:`stepscope.heap.reuse_large_blocks`) only
#: where the memory left is at least this many times its JSON's bytes: its analysis in memory peaks
#: at ~0.45x (summed over its processes: 0.9 GB at 2 GB, 4.5 GB at 10 GB) and keeping freed blocks
#: adds to each process's share; below that, freed arrays go back to the system as they did.
REUSE_ROOM = 2
#: A gzip file's JSON taken as this many times its size when deciding that (the reference traces
#: compress 19-30x).
GZIP_RATIO = 30


def reuse_freed_memory(path: str, size: int) -> bool:
    """Where this process may (:data:`stepscope.heap.may_reuse`: an analysis command as typed) and
    the memory left is at least :data:`REUSE_ROOM` times the JSON of the trace at ``path`` (``size``
    bytes): its heap reuses freed arrays from now on. Whether it does."""
    if not heap.may_reuse or heap.reusing():
        return heap.reusing()
    try:
        compressed = limits.is_gzip(path)
    except OSError:
        return False
    room = headroom()
    if room is None or room < REUSE_ROOM * size * (GZIP_RATIO if compressed else 1):
        return False
    return heap.reuse_large_blocks()


def headroom() -> int | None:
    """The bytes of memory this process may still use: the machine's ``MemAvailable``, or less where
    a memory cgroup (v1 or v2) has less left; None where neither can be read."""
    room = _meminfo_available()
    for left in _cgroup_room():
        room = left if room is None else min(room, left)
    return room


def _meminfo_available() -> int | None:
    import psutil  # its MemAvailable (the trace layer does not read the capture layer's /proc parsers)

    try:
        return int(psutil.virtual_memory().available)
    except (psutil.Error, OSError, ValueError):
        return None


def _cgroup_room() -> list[int]:
    """What each memory cgroup above this process has left: its limit less what it holds, its page
    cache (which the kernel reclaims first) not counted; nothing where a cgroup sets no limit."""
    found: list[int] = []
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return found
    for line in lines:
        ident, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if ident == "0" and not controllers:  # v2: memory.max, memory.current, memory.stat's file
            root, files = "/sys/fs/cgroup", ("memory.max", "memory.current", "file")
        elif "memory" in controllers.split(","):  # v1
            root, files = "/sys/fs/cgroup/memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "cache")
        else:
            continue
        directory = os.path.join(root, path.lstrip("/"))
        while directory.startswith(root):
            left = _room_in(directory, *files)
            if left is not None:
                found.append(left)
            if directory == root:
                break
            directory = os.path.dirname(directory)
    return found


def _room_in(directory: str, limit_file: str, usage_file: str, cache_key: str) -> int | None:
    try:
        with open(os.path.join(directory, limit_file), encoding="ascii") as fh:
            text = fh.read().strip()
        if text == "max" or int(text) >= 1 << 60:
            return None
        limit = int(text)
        with open(os.path.join(directory, usage_file), encoding="ascii") as fh:
            usage = int(fh.read().strip())
        cache = 0
        with open(os.path.join(directory, "memory.stat"), encoding="ascii") as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == cache_key:
                    cache = int(value)
                    break
    except (OSError, ValueError):
        return None
    return max(0, limit - max(0, usage - cache))


class ColumnSink:
    """Event columns written to files as a table is decoded (see :meth:`TableBuilder.maybe_flush
    <stepscope.traces.events.TableBuilder.maybe_flush>`), then mapped whole. ``prefix``: each column
    in the file ``prefix.<column>``, kept for another process to read (a worker's part of a split
    decode); else in a file of the directory's whose name is removed at once."""

    def __init__(self, directory: str, prefix: str | None = None) -> None:
        self.directory, self.prefix = directory, prefix
        self._files: dict[str, int] = {}

    def write(self, key: str, values: Any) -> None:
        """Append ``values`` (a buffer: an ``array.array`` or a contiguous ``ndarray``) to the column's file."""
        fd = self._files.get(key)
        if fd is None:
            fd = self._files[key] = self._open(key)
        view = memoryview(values).cast("B")
        written = 0
        while written < len(view):
            count = os.write(fd, view[written:written + (64 << 20)])
            _start_writeback(fd, count)
            written += count

    def column(self, key: str, dtype: Any, count: int) -> np.ndarray:
        """The ``count`` values written to column ``key``, mapped read-only."""
        if not count:
            return np.zeros(0, dtype=dtype)
        mapping = mmap.mmap(self._files[key], count * np.dtype(dtype).itemsize, flags=mmap.MAP_SHARED,
                            prot=mmap.PROT_READ)
        return np.frombuffer(mapping, dtype=dtype, count=count)

    def narrowed(self, key: str, count: int) -> np.ndarray:
        """Column ``key`` (int64) as int32 when every value fits, written a few million rows at a time."""
        wide = self.column(key, np.int64, count)
        if not count or int(wide.min()) < -(1 << 31) or int(wide.max()) >= 1 << 31:
            return wide
        narrow_key = key + ".32"
        step = 1 << 22
        for start in range(0, count, step):
            self.write(narrow_key, wide[start:start + step].astype(np.int32))
        del wide
        return self.column(narrow_key, np.int32, count)

    def close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def _open(self, key: str) -> int:
        if self.prefix is not None:
            return os.open(f"{self.prefix}.{key}", os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        import tempfile

        fd, path = tempfile.mkstemp(prefix="stepscope-column-", dir=self.directory)
        os.unlink(path)
        return fd


def _start_writeback(fd: int, count: int) -> None:
    """Ask the kernel to start writing the ``count`` bytes just written to ``fd`` to disk, without
    waiting (``sync_file_range(SYNC_FILE_RANGE_WRITE)``; Linux, else nothing). Written pages stay
    cached but soon clean, so a memory limit can reclaim them: a memory cgroup (v1 above all) has
    no dirty-page throttling of its own, and the 10 GB trace's decode, ~700 MB of its columns
    dirty at once in a 1000 MiB limit, was sometimes killed before the kernel wrote them."""
    function = _sync_file_range()
    if function is not None:
        end = os.lseek(fd, 0, os.SEEK_CUR)
        function(fd, end - count, count, 2)  # SYNC_FILE_RANGE_WRITE


@functools.cache
def _sync_file_range() -> Any:
    function = heap.libc_function("sync_file_range")
    if function is None:
        return None
    import ctypes

    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


def sink_for(table_bytes: int) -> ColumnSink | None:
    """A :class:`ColumnSink` when a table of ``table_bytes`` so far should go on to disk (the rule
    of :func:`spiller`), else None."""
    found = spiller(table_bytes)
    return None if found is None else ColumnSink(found.directory)


def follow(column: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """What a table derived from a table with ``column`` does with its own large arrays: a
    :class:`Spill` where that column was spilled (the linked table of a spilled table spills too),
    else keep them as they are."""
    if not is_spilled(column):
        return _kept
    import tempfile

    return Spill(tempfile.gettempdir())


def _kept(values: np.ndarray) -> np.ndarray:
    return values


def is_spilled(values: np.ndarray) -> bool:
    """Whether ``values`` (or the array it views) is a spilled column."""
    base: Any = values
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)


def _write_and_map(directory: str, values: np.ndarray) -> np.ndarray:
    sink = ColumnSink(directory)
    try:
        sink.write("values", values.reshape(-1))
        return sink.column("values", values.dtype, values.size).reshape(values.shape)
    finally:
        sink.close()


def _filesystem(directory: str) -> str:
    """The type of the filesystem holding ``directory`` (``/proc/self/mountinfo``), '' if unknown."""
    try:
        target = os.path.realpath(directory)
        best, kind = "", ""
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields, _, rest = line.partition(" - ")
                parts = fields.split()
                if len(parts) < 5 or not rest:
                    continue
                point = parts[4].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, rest.split()[0]
        return kind
    except OSError:
        return ""


__all__ = ["ENV_VAR", "FOOTPRINT", "ColumnSink", "Spill", "sink_for", "follow", "headroom", "is_spilled", "min_bytes", "spiller"]
