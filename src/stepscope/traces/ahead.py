"""Decode one trace in a forked child while this process imports the rest of the analysis.

``stepscope analyze TRACE`` spends its first ~0.15 s importing the analysis, the diagnosis and the
report (Python, one core), then decodes the trace (one core again). On a machine with a second core,
:func:`decoding` forks a child as soon as the decoder is imported; the child decodes the file with
the very code :func:`stepscope.traces.load.load_trace` runs and writes the columns to an anonymous
in-memory file, while the parent goes on importing. :func:`claim`, called by ``load_trace``, waits
for the child and takes its columns: the table, the metadata and the counters the streaming decode
gives, without the decode's time where the imports already took it. It reads the columns from the
last back and cuts the file after each, so they are never held twice.

Any doubt and the parent decodes the file itself, as without this module, so every error message
and byte offset is the streaming decode's: the child fails on the file (damage, a size guard), dies,
or is killed; the file is no longer the one the child opened (device, inode, size, modification
time); the guards differ from the ones the child ran with. Only a regular file is decoded ahead, only
where ``fork`` and ``memfd_create`` exist (Linux), no other thread runs, and two cores are there to
use. A child nobody claims is killed when the command ends. The child ends by a Ctrl-C as the parent
does, without a word: the parent reports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

from stepscope.traces.decode import DecodeStats
from stepscope.traces.events import TableBuilder

_HEADER_BYTES = 8  # the header's offset in the in-memory file, as the child reports it on the pipe
#: A decoded file: (builder, metadata, counters, JSON bytes).
Decoded = tuple[TableBuilder, dict[str, Any], DecodeStats, int]
#: What the child runs, ``decode(path, max_json_bytes, max_bytes)``:
#: :func:`stepscope.traces.load.decode_streaming`.
Decode = Callable[[str, int, Optional[int]], Decoded]
Identity = tuple[int, int, int, int]


class _Child:
    """A child decoding ``path``: its pid, the pipe it reports on, the file its columns go to."""

    def __init__(self, path: str, identity: Identity, decode: Decode,
                 guards: tuple[int, int | None]) -> None:
        import signal

        self.identity, self.guards = identity, guards
        self.memfd = os.memfd_create("stepscope-decode", os.MFD_CLOEXEC)
        self.reader, writer = os.pipe()
        # SIGINT held back across the fork: one arriving before the child's handler is its own would
        # be dropped with the Python-level signal state the child resets, and the child would live on
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            for fd in (self.memfd, self.reader, writer):
                os.close(fd)
            raise
        if self.pid == 0:  # the child: decode, report, never return into the parent's code
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends it quietly; the parent says it
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
                os.close(self.reader)
                code = _decode_to(path, decode, guards, self.memfd, writer)
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        os.close(writer)

    def take(self) -> Decoded | None:
        """The child's decode, once it has finished; None where it failed or died."""
        import pickle

        try:
            report = _read_all(self.reader)
            if len(report) != _HEADER_BYTES:
                return None
            header_at = int.from_bytes(report, "little")
            with open(self.memfd, "rb", closefd=False) as source:
                source.seek(header_at)
                header = pickle.load(source)  # noqa: S301 - written by this process's own child
                builder = TableBuilder()
                strings = header["symbols"]
                builder.symbols.strings = strings
                builder.symbols.ids = {text: index for index, text in enumerate(strings)}
                builder.counts.skipped.update(header["skipped"])
                builder.counts.ignored.update(header["ignored"])
                # read from the last column back, the file cut after each: the columns are never held twice
                end = header_at
                for key, buffer in reversed(builder.buffers().items()):
                    count = header["sizes"][key]
                    end -= count * buffer.itemsize
                    os.ftruncate(self.memfd, end + count * buffer.itemsize)
                    if count:
                        source.seek(end)
                        buffer.fromfile(source, count)
                if end != 0:
                    return None
            return builder, header["meta"], header["stats"], header["json_bytes"]
        except (OSError, EOFError, ValueError, KeyError, TypeError, pickle.UnpicklingError):
            return None
        finally:
            self.close()

    def close(self, kill: bool = False) -> None:
        if self.pid <= 0:
            return
        if kill:
            import signal

            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        for fd in (self.memfd, self.reader):
            os.close(fd)
        self.pid = 0


def _decode_to(path: str, decode: Decode, guards: tuple[int, int | None], memfd: int, writer: int) -> int:
    """In the child: ``path`` decoded as ``load_trace`` decodes it, its columns and a header written
    to ``memfd``, the header's offset to ``writer``. 0 on success; 1 on any failure."""
    import gc
    import pickle

    gc.disable()  # as in the parent's load: millions of acyclic objects, no cycle scans
    try:
        builder, meta, stats, json_bytes = decode(path, *guards)
        with open(memfd, "wb", closefd=False) as out:
            sizes = {}
            for key, buffer in builder.buffers().items():
                buffer.tofile(out)
                sizes[key] = len(buffer)
            header_at = out.tell()
            pickle.dump({"symbols": builder.symbols.strings, "sizes": sizes, "skipped": builder.counts.skipped,
                         "ignored": builder.counts.ignored, "meta": meta, "stats": stats, "json_bytes": json_bytes},
                        out, protocol=pickle.HIGHEST_PROTOCOL)
        os.write(writer, header_at.to_bytes(_HEADER_BYTES, "little"))
    except BaseException:  # noqa: BLE001 - the parent decodes the file itself and says what is wrong
        return 1
    return 0


def _read_all(fd: int) -> bytes:
    parts = []
    while block := os.read(fd, 64):
        parts.append(block)
    return b"".join(parts)


def _identity(path: str) -> Identity | None:
    import stat

    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size <= 0:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


_children: dict[Identity, _Child] = {}


def _can_fork() -> bool:
    """Forking is safe here (:func:`~stepscope.executors.fork_is_safe`), the platform has what the
    child needs, and a second core is there to run it."""
    import signal

    from stepscope.executors import fork_is_safe, usable_cores

    return (hasattr(os, "memfd_create") and hasattr(signal, "pthread_sigmask") and fork_is_safe()
            and usable_cores() > 1)


@contextmanager
def decoding(path: str | None, decode: Decode, max_json_bytes: int, max_bytes: int | None = None) -> Iterator[bool]:
    """Decode ``path`` in a forked child with ``decode`` and these size guards, for the length of the
    block, where that can help (see the module docstring); gives whether a child was started. A child
    nobody claimed is killed at the end."""
    identity = None if path is None else _identity(path)
    child = None
    if path is not None and identity is not None and identity not in _children and _can_fork():
        try:
            child = _Child(path, identity, decode, (max_json_bytes, max_bytes))
        except OSError:
            child = None
        else:
            _children[identity] = child
    try:
        yield child is not None
    finally:
        if child is not None and _children.get(child.identity) is child:
            del _children[child.identity]
            child.close(kill=True)


def claim(path: str, max_json_bytes: int, max_bytes: int | None) -> Decoded | None:
    """The decode of ``path`` by a child started for this very file with these guards, once it has
    finished; None where there is none or it failed (the caller decodes the file itself)."""
    if not _children:
        return None
    identity = _identity(path)
    child = None if identity is None else _children.pop(identity, None)
    if child is None:
        return None
    if (max_json_bytes, max_bytes) != child.guards:
        child.close(kill=True)
        return None
    return child.take()
