"""Limits on what is decoded from files: damaged or hostile input must stay cheap to refuse.

Contract: :func:`max_bytes` is the most bytes of decompressed JSON held in memory at once — one
trace event (or one run of whitespace between events), a trace decoded as a whole document, a run
record, one line of a samples file. Files read in a stream (traces, samples) may be larger, but
past that size their decompressed bytes may not exceed :data:`MAX_RATIO` times the compressed
bytes read: a gzip "bomb" of valid, repeated lines or events would otherwise cost minutes and all
the memory its columns take. Past a limit, readers raise
:class:`~stepscope.errors.InputError` naming the limit and how to raise it: ``--max-bytes`` on
``stepscope analyze`` / ``report``, or the environment variable ``STEPSCOPE_MAX_BYTES`` (a number
of bytes, or with a suffix ``K``/``M``/``G``, powers of 1024).

Why 64 MiB: a real trace event is a few hundred bytes (the largest in the reference set is under
1 MB), a record of 100k steps is ~5 MB of JSON, a samples line holds one second of samples; 64 MiB
leaves room for all of these while a gzip "bomb" (a few MB that inflate to GiBs) is refused within
seconds, in bounded memory. Why 200: Kineto traces compress about 30:1 with gzip (87 MB → 3 MB for
the largest reference trace), samples files less; filler compresses up to 1000:1.
"""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

from stepscope.errors import InputError, UsageError

ENV_VAR = "STEPSCOPE_MAX_BYTES"
DEFAULT_MAX_BYTES = 64 * 1024**2
#: Past :func:`max_bytes`, a stream's decompressed size may be at most this many times its compressed size.
MAX_RATIO = 200
# the smallest byte range of one trace decoded on a process of its own (stepscope.traces.split_load):
# below it the process's start and the columns' round trip through TMPDIR outweigh the gain
SPLIT_PART_MIN_BYTES = 64 * 1024 * 1024
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_override: int | None = None


def parse_size(text: str) -> int:
    """``"1048576"``, ``"512M"``, ``"2G"``, ``"64KiB"`` -> bytes (powers of 1024)."""
    found = _SIZE.match(str(text))
    if not found or int(found.group(1)) <= 0:
        raise UsageError(f"invalid size {text!r}: expected a positive number of bytes, e.g. 268435456, 512M or 2G")
    return int(found.group(1)) * 1024 ** "bkmgt".index((found.group(2) or "b").lower())


def configure(limit: int | None) -> None:
    """Set the limit for this process (the CLI's ``--max-bytes``); ``None`` goes back to the default."""
    global _override
    _override = limit


@contextlib.contextmanager
def configured(limit: int | None) -> Iterator[None]:
    """:func:`configure` for the duration of a ``with`` block (``None``: leave the limit as it is)."""
    previous = _override
    if limit is not None:
        configure(limit)
    try:
        yield
    finally:
        configure(previous)


def max_bytes() -> int:
    """The limit in force: ``configure()``, else ``STEPSCOPE_MAX_BYTES``, else the default."""
    if _override is not None:
        return _override
    value = os.environ.get(ENV_VAR)
    if value:
        try:
            return parse_size(value)
        except UsageError as exc:
            raise UsageError(f"{ENV_VAR}: {exc}") from None
    return DEFAULT_MAX_BYTES


def describe(limit: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if limit >= size:
            return f"{limit / size:.4g} {unit}"
    return f"{limit} bytes"


def too_large(path: str | Path, what: str, limit: int, position: int | str | None = None) -> InputError:
    """The error for input past a limit: what, where, and how to raise the limit."""
    return InputError(
        path,
        f"{what} exceeds the limit of {describe(limit)}; the file is damaged or not what it claims "
        f"to be — if it is genuine, raise the limit with --max-bytes or {ENV_VAR}",
        position=position,
    )


def check_ratio(path: str | Path, what: str, decompressed: int, compressed: int, limit: int) -> None:
    """Refuse a stream past ``limit`` decompressed bytes that inflates more than :data:`MAX_RATIO`:1."""
    if decompressed > limit and decompressed > MAX_RATIO * max(compressed, 1):
        raise InputError(
            path,
            f"{what} inflates more than {MAX_RATIO}:1 ({describe(decompressed)} from {describe(compressed)} "
            f"of gzip so far, past {describe(limit)}); real files compress far less — it is damaged or a "
            f"decompression bomb; if it is genuine, raise the limit with --max-bytes or {ENV_VAR}",
        )


def is_gzip(path: str | Path) -> bool:
    """True when the file starts with the gzip magic bytes (whatever its name)."""
    with open(path, "rb") as handle:
        return handle.read(2) == b"\x1f\x8b"


def regular_file(path: str | Path, what: str = "file") -> int:
    """The size of ``path``, refusing what is not a regular file (a FIFO would block, /dev/zero never ends)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError(path, f"cannot read {what} ({exc.strerror}); check the path") from None
    import stat

    if stat.S_ISDIR(info.st_mode):
        raise InputError(path, f"is a directory, not a {what}")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(path, f"is not a regular file (a pipe, device or socket); pass the {what} itself")
    return info.st_size


def read_gzip_or_plain(path: str | Path, limit: int, what: str) -> bytes:
    """A small gzip or plain file, decompressed, refusing more than ``limit`` bytes either way.

    Streams the decompression in bounded pieces, so a gzip bomb costs at most ``limit`` bytes of
    memory and the time to inflate them.
    """
    size = regular_file(path, what)
    if size > limit:
        raise too_large(path, f"the {what} ({describe(size)} on disk)", limit)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise InputError(path, f"cannot read the {what}: {exc.strerror}") from None
    if raw[:2] != b"\x1f\x8b":
        if len(raw) > limit:
            raise too_large(path, f"the {what}", limit)
        return raw
    parts: list[bytes] = []
    total = 0
    pending = raw
    decoder = zlib.decompressobj(wbits=31)
    while True:
        try:
            piece = decoder.decompress(pending, 1 << 20)
        except zlib.error:
            raise InputError(path, f"damaged gzip data in the {what} (truncated or corrupt)") from None
        total += len(piece)
        if total > limit:
            raise too_large(path, f"the decompressed {what}", limit)
        parts.append(piece)
        if decoder.eof:
            pending = decoder.unused_data
            if not pending.strip(b"\x00"):
                break
            if pending[:2] != b"\x1f\x8b":
                raise InputError(path, f"trailing garbage after the gzip data of the {what}")
            decoder = zlib.decompressobj(wbits=31)  # another member, as gzip.decompress reads it
        elif decoder.unconsumed_tail:
            pending = decoder.unconsumed_tail
        elif piece:
            pending = b""  # drain what zlib still holds
        else:
            break
    if not decoder.eof:
        raise InputError(path, f"damaged gzip data in the {what} (truncated)")
    return b"".join(parts)
