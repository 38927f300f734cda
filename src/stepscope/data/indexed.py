"""`IndexedJsonl`: a map-style dataset over one JSONL file, through a cached line-offset index.

The index (the start offset and byte length of every non-empty line) is built once, by one pass
over the file in 16 MiB blocks with NumPy (no line is decoded), and saved beside the file as
``<file>.stepscope-index.npz`` — or under ``cache_dir`` when given, or when the file's directory is
not writable. It records the file's size and modification time (ns); a file that changed either is
re-indexed. ``dataset[i]`` is one ``os.pread`` of that line, so DataLoader workers (forked or
spawned) share nothing but the file name.

Per-sample sizes for :class:`~stepscope.data.buckets.BucketBatchSampler` come from
:meth:`IndexedJsonl.sizes`: the line lengths in bytes are free (they are in the index); a key
function's values (e.g. token counts) are computed in one pass and cached the same way, keyed by
``size_key``.

Gzip files cannot be read at an offset without decompressing everything before it: they are
refused (use :class:`~stepscope.data.sharded.ShardedJsonl`, or decompress once).
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from torch.utils.data import Dataset

from stepscope.errors import InputError, UsageError
from stepscope.limits import is_gzip
from stepscope.safe_write import atomic_write

INDEX_VERSION = 1
_BLOCK = 16 * 1024 * 1024


def default_cache_dir() -> Path:
    """Where indexes go when the data's directory is not writable (``$XDG_CACHE_HOME/stepscope``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stepscope" / "jsonl-index"


def _fingerprint(path: str) -> np.ndarray:
    stat = os.stat(path)
    return np.array([INDEX_VERSION, stat.st_size, stat.st_mtime_ns], dtype=np.int64)


def scan_lines(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and lengths (newline excluded) of the non-empty lines of ``path``."""
    newlines: list[np.ndarray] = []
    with open(path, "rb", buffering=0) as handle:
        base = 0
        while block := handle.read(_BLOCK):
            newlines.append(np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + base)
            base += len(block)
    ends = np.concatenate(newlines) if newlines else np.empty(0, dtype=np.int64)
    if base and (not len(ends) or ends[-1] != base - 1):
        ends = np.append(ends, base)  # a last line without a newline
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64) if len(ends) else ends.astype(np.int64)
    lengths = (ends - starts).astype(np.int64)
    # blank lines ("\n" or "\r\n") are not samples
    keep = lengths > 0
    if keep.any():
        with open(path, "rb") as handle:
            crlf_only = np.flatnonzero(keep & (lengths == 1))
            for position in crlf_only:
                handle.seek(int(starts[position]))
                if handle.read(1) == b"\r":
                    keep[position] = False
    return starts[keep], lengths[keep]


class IndexCache:
    """Arrays derived from a file, saved in one ``.npz`` and valid while the file's size+mtime hold."""

    def __init__(self, path: str, cache_dir: str | os.PathLike | None = None):
        self.path = os.path.abspath(path)
        self.cache_dir = None if cache_dir is None else Path(cache_dir)

    def location(self, kind: str) -> Path:
        """The cache file for ``kind`` (``index``, ``sizes-<key>``)."""
        name = f"{os.path.basename(self.path)}.stepscope-{kind}.npz"
        if self.cache_dir is None and os.access(os.path.dirname(self.path), os.W_OK):
            return Path(self.path).with_name(name)
        digest = hashlib.sha1(self.path.encode()).hexdigest()[:16]
        return (self.cache_dir or default_cache_dir()) / f"{digest}-{name}"

    def load(self, kind: str) -> dict[str, np.ndarray] | None:
        """The cached arrays, or None when absent, stale or unreadable."""
        location = self.location(kind)
        try:
            with np.load(location) as saved:
                if not np.array_equal(saved["fingerprint"], _fingerprint(self.path)):
                    return None
                return {name: saved[name] for name in saved.files if name != "fingerprint"}
        except (OSError, KeyError, ValueError):
            return None

    def save(self, kind: str, arrays: dict[str, np.ndarray], fingerprint: np.ndarray) -> None:
        """Write atomically (:func:`~stepscope.safe_write.atomic_write`); a cache that cannot be
        written is skipped, leaving no temporary file."""
        location = self.location(kind)
        buffer = io.BytesIO()
        np.savez(buffer, fingerprint=fingerprint, **arrays)  # type: ignore[arg-type]
        try:
            location.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(location, buffer.getvalue())
        except OSError:
            return


class IndexedJsonl(Dataset):
    """Random access to the non-empty lines of a plain JSONL file.

    Args:
        path: the JSONL file (not gzip).
        cache_dir: where to keep the index (default: beside the file, else the user cache).
        decode: turns one line (bytes) into a sample (default ``orjson.loads``).
        transform: applied to each decoded sample.

    Raises:
        InputError: a missing file, or a gzip file.
    """

    def __init__(self, path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
                 decode: Callable[[bytes], Any] = orjson.loads, transform: Callable[[Any], Any] | None = None):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise InputError(self.path, "no such JSONL file")
        if is_gzip(self.path):
            raise InputError(self.path, "a gzip file has no random access; use ShardedJsonl, or decompress it")
        self.cache = IndexCache(self.path, cache_dir)
        self.decode = decode
        self.transform = transform
        self.index_was_cached = True
        self.offsets, self.lengths = self._load_index()
        self._fd: int | None = None
        self._fd_pid: int | None = None

    def _load_index(self) -> tuple[np.ndarray, np.ndarray]:
        saved = self.cache.load("index")
        if saved is not None:
            return saved["offsets"], saved["lengths"]
        self.index_was_cached = False
        fingerprint = _fingerprint(self.path)
        offsets, lengths = scan_lines(self.path)
        if np.array_equal(fingerprint, _fingerprint(self.path)):  # unchanged while scanned
            self.cache.save("index", {"offsets": offsets, "lengths": lengths}, fingerprint)
        return offsets, lengths

    def __len__(self) -> int:
        return len(self.offsets)

    def raw(self, index: int) -> bytes:
        """The bytes of line ``index`` (no newline)."""
        if self._fd is None or self._fd_pid != os.getpid():
            self._fd, self._fd_pid = os.open(self.path, os.O_RDONLY), os.getpid()
        return os.pread(self._fd, int(self.lengths[index]), int(self.offsets[index]))

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} lines")
        sample = self.decode(self.raw(index))
        return sample if self.transform is None else self.transform(sample)

    def sizes(self, key: Callable[[Any], int] | None = None, size_key: str | None = None) -> np.ndarray:
        """One size per sample, for bucketing; cached beside the index.

        Args:
            key: computes a size from a decoded sample (e.g. ``lambda s: len(s["tokens"])``); None
                uses the line length in bytes (free, from the index).
            size_key: names ``key`` in the cache (required with ``key``; change it when ``key``
                changes).

        Raises:
            UsageError: ``key`` without ``size_key``.
        """
        if key is None:
            return self.lengths
        if not size_key or not size_key.replace("-", "").replace("_", "").isalnum():
            raise UsageError("IndexedJsonl.sizes(key=...) needs size_key, a name of letters, digits, - and _ "
                             "(it names the cached sizes; change it when the key function changes)")
        kind = f"sizes-{size_key}"
        saved = self.cache.load(kind)
        if saved is not None and len(saved["sizes"]) == len(self):
            return saved["sizes"]
        fingerprint = _fingerprint(self.path)
        values = np.fromiter((key(self.decode(line)) for line in self._lines_in_order()), dtype=np.int64,
                             count=len(self))
        self.cache.save(kind, {"sizes": values}, fingerprint)
        return values

    def _lines_in_order(self):
        """Every indexed line, read sequentially (one pass, not one ``pread`` per line)."""
        with open(self.path, "rb", buffering=1 << 20) as handle:
            for line in handle:
                if line.rstrip(b"\n") not in (b"", b"\r"):
                    yield line

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fd"] = state["_fd_pid"] = None  # workers open their own descriptor
        return state

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None and self._fd_pid == os.getpid():
            try:
                os.close(fd)
            except OSError:
                pass
