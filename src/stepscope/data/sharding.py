"""Which process am I, among ranks × DataLoader workers, and which byte ranges are mine.

A *slot* is one reading process: ``slot = rank * num_workers + worker_id`` out of
``world_size * num_workers``. Ranks come from ``torch.distributed`` when it is initialised, workers
from ``torch.utils.data.get_worker_info()``; either can be given explicitly (tests simulate ranks and
workers this way). A worker started by *spawn* (macOS, CUDA users, anything under
``torch.multiprocessing.spawn``) has no process group: the dataset hands it its rank when it is
pickled for the worker.

Files are cut into byte ranges without reading them: a line belongs to the range that holds its
first byte. A reader of ``[start, end)`` seeks to ``start - 1``, skips to the end of that line (the
previous range's last line, unless byte ``start - 1`` is a newline), then reads lines while they
start before ``end`` — the last one may run past ``end``. So each line is read by exactly one range
and no reader scans lines that belong to another. Gzip files cannot be entered in the middle: each
is one range, read whole by the process it is assigned to.
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from stepscope.errors import UsageError

#: Default size of a byte range of a plain file (ranges are then dealt out round-robin).
DEFAULT_CHUNK_BYTES = 64 * 1024 * 1024
_READ_BUFFER = 1 << 20


@dataclass(frozen=True)
class ByteRange:
    """Lines of ``files[file]`` that start in ``[start, end)``; ``end is None`` means the whole file."""

    file: int
    start: int
    end: int | None


def resolve_slot(rank: int | None = None, world_size: int | None = None,
                 worker_id: int | None = None, num_workers: int | None = None) -> tuple[int, int]:
    """Return ``(slot, slot_count)`` for this process; explicit arguments win over detection.

    Raises:
        UsageError: a rank or worker id outside its count.
    """
    if rank is None or world_size is None:
        detected_rank, detected_world = distributed_rank()
        rank = detected_rank if rank is None else rank
        world_size = detected_world if world_size is None else world_size
    if worker_id is None or num_workers is None:
        detected_id, detected_count = _worker_slot()
        worker_id = detected_id if worker_id is None else worker_id
        num_workers = detected_count if num_workers is None else num_workers
    if not (0 <= rank < world_size) or not (0 <= worker_id < num_workers):
        raise UsageError(f"rank {rank} of {world_size} / worker {worker_id} of {num_workers} is out of range")
    return rank * num_workers + worker_id, world_size * num_workers


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` from ``torch.distributed``, ``(0, 1)`` when it is not initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _worker_slot() -> tuple[int, int]:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def split_ranges(sizes: Sequence[int], gzipped: Sequence[bool], slot_count: int,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[ByteRange]:
    """Cut files into byte ranges: at least one per slot, about ``chunk_bytes`` each.

    Plain bytes are divided into a multiple of ``slot_count`` pieces of equal size (so round-robin
    dealing gives every slot the same number of bytes, give or take a range); each plain file is cut
    into as many of those pieces as it holds. Each gzip file is one range.
    """
    plain_total = sum(size for size, packed in zip(sizes, gzipped) if not packed)
    pieces = max(slot_count, math.ceil(plain_total / max(1, chunk_bytes)))
    pieces = math.ceil(pieces / slot_count) * slot_count
    target = max(1, math.ceil(plain_total / pieces))
    ranges: list[ByteRange] = []
    for index, (size, packed) in enumerate(zip(sizes, gzipped)):
        if packed:
            ranges.append(ByteRange(index, 0, None))
            continue
        count = max(1, math.ceil(size / target))
        bounds = [size * part // count for part in range(count + 1)]
        ranges.extend(ByteRange(index, bounds[part], bounds[part + 1]) for part in range(count))
    return ranges


def read_range(path: str, byte_range: ByteRange, packed: bool, resume_at: int | None = None
               ) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, line)`` for the lines of one range (``line`` keeps its newline).

    Args:
        resume_at: offset of the first line to read (a saved position inside this range) instead of
            the range's start.
    """
    if packed:
        yield from _read_gzip(path, resume_at or 0)
        return
    end = byte_range.end if byte_range.end is not None else os.path.getsize(path)
    with open(path, "rb", buffering=_READ_BUFFER) as handle:
        if resume_at is not None:
            position = resume_at
            handle.seek(position)
        elif byte_range.start > 0:
            handle.seek(byte_range.start - 1)
            position = byte_range.start - 1 + len(handle.readline())
        else:
            position = 0
        while position < end:
            line = handle.readline()
            if not line:
                return
            yield position, line
            position += len(line)


def _read_gzip(path: str, offset: int) -> Iterator[tuple[int, bytes]]:
    with gzip.open(path, "rb") as handle:
        if offset:
            handle.seek(offset)  # decompresses forward: gzip has no random access
        position = offset
        for line in handle:
            yield position, line
            position += len(line)


def read_lines_at(path: str, packed: bool, offsets: Sequence[int]) -> dict[int, bytes]:
    """The lines starting at ``offsets`` (a shuffle buffer being restored), read in one forward pass."""
    found: dict[int, bytes] = {}
    opener = gzip.open if packed else open
    with opener(path, "rb") as handle:
        for offset in sorted(set(offsets)):
            handle.seek(offset)
            found[offset] = handle.readline()
    return found
