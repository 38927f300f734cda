"""Safe file creation for everything stepscope writes into a run directory (and its caches).

Two operations, used by every writer:

- :func:`atomic_write` — write a whole file: the bytes go to a temporary file with an
  unpredictable name in the same directory, created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a
  planted file or symlink is never opened), flushed to the device (``fsync``), then ``os.replace``
  puts it in place (a rename replaces a symlink at the destination instead of following it) and
  the directory is synced so the new name survives a crash. On any error the temporary file is
  removed and the ``OSError`` is raised: the destination is either the old file or the new one,
  whole — a process killed at any instant (SIGKILL, the OOM killer, a power cut) never leaves a
  half-written file under the final name, only at worst a ``.NAME.<random>.tmp`` beside it.
  A process that ends itself by a signal mid-write (:func:`stepscope.capture.launcher.die_by`)
  first removes its writes' temporaries (:func:`remove_unfinished`), so it leaves none.
- :func:`create_exclusive` — create a new file for streaming (samples, roles): fails if anything,
  a symlink included, already has the name.

:func:`json_bytes` encodes with orjson and, when a string cannot be encoded as UTF-8 (argv, a
script path or a cwd with non-UTF-8 bytes arrive as lone surrogates), retries with every such
string escaped: ``surrogateescape`` bytes become ``\\xNN``, other lone surrogates ``\\udNNN``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import orjson

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC


def create_exclusive(path: str | Path, *, append: bool = False, mode: int = 0o666) -> BinaryIO:
    """Open a *new* file for writing (binary); ``FileExistsError`` if the name is taken.

    ``mode`` is filtered by the umask as usual.
    """
    flags = _CREATE_FLAGS | (os.O_APPEND if append else 0)
    descriptor = os.open(path, flags, mode)
    return os.fdopen(descriptor, "ab" if append else "wb")


#: The temporary files of this process's writes under way, by name, with the id of the process
#: that creates them (a forked child inherits the dict, never the writes).
_UNFINISHED: dict[str, int] = {}


def remove_unfinished() -> None:
    """Remove the temporary files of this process's writes under way: the process is about to end
    by a signal (which runs no ``except`` clause), and a write cut short has nothing to keep."""
    me = os.getpid()
    for name, owner in list(_UNFINISHED.items()):
        if owner == me:
            try:
                os.unlink(name)
            except OSError:
                pass


@contextmanager
def unfinished(*paths: Path) -> Iterator[None]:
    """Within the block, ``paths`` are temporaries of a write under way: :func:`remove_unfinished`
    removes them."""
    me = os.getpid()
    for path in paths:
        _UNFINISHED[str(path)] = me
    try:
        yield
    finally:
        for path in paths:
            _UNFINISHED.pop(str(path), None)


def atomic_write(path: str | Path, payload: bytes) -> Path:
    """Replace ``path`` with ``payload`` atomically, never following a symlink; see the module doc."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    with unfinished(tmp):
        _write_into_place(tmp, path, payload)
    sync_directory(path.parent)
    return path


def _write_into_place(tmp: Path, path: Path, payload: bytes) -> None:
    try:
        with create_exclusive(tmp) as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on the device before the name points at them
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename in (None, str(tmp), tmp):
            # the temporary name is gone and means nothing to the reader: name the file not written
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def sync_directory(directory: str | Path) -> None:
    """``fsync`` a directory so the names just created or renamed in it survive a crash; best effort
    (a filesystem that cannot sync directories keeps the file, only the crash guarantee is weaker)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def escape_text(text: str) -> str:
    """``text`` with lone surrogates escaped (UTF-8 safe); unchanged when it already is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def escape_strings(value: Any) -> Any:
    """A copy of a JSON-like value with every string (and mapping key) passed through :func:`escape_text`."""
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, dict):
        return {escape_strings(key): escape_strings(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [escape_strings(item) for item in value]
    return value


def json_bytes(document: Any, option: int = 0) -> bytes:
    """orjson-encode ``document``; strings that are not valid UTF-8 are escaped instead of failing."""
    try:
        return orjson.dumps(document, option=option)
    except TypeError:
        return orjson.dumps(escape_strings(document), option=option)


__all__ = ["atomic_write", "create_exclusive", "escape_strings", "escape_text", "json_bytes", "remove_unfinished",
           "sync_directory", "unfinished"]
