"""`ShardedJsonl`: an ``IterableDataset`` over JSONL files where each process reads only its own bytes.

Contract, per epoch: every non-empty line of every file is yielded by exactly one process among
ranks × DataLoader workers. The files are cut into byte ranges aligned to line starts (see
:mod:`stepscope.data.sharding`), the ranges are dealt out round-robin to the processes (in a
seeded, epoch-dependent order when shuffling), and a process opens, seeks and reads only its own
ranges — it never scans lines that belong to another (the hand-written idiom
``if line_no % world == rank`` makes every process read every line).

Ranges are equal in bytes, not in lines, so ranks may get a few samples more or fewer: with DDP,
run a fixed number of steps per epoch (or use a map-style dataset with a distributed sampler) so no
rank waits in a collective for one that has finished.

Gzip files are not seekable: each one is a single range, read whole by one process. Give several
gzip files (at least as many as ranks × workers) for parallelism; a single ``.jsonl.gz`` is read by
one process while the others get nothing from it.

Shuffling is two-level: the order of the ranges (so which process reads which bytes changes with
the epoch) and a per-process shuffle buffer of ``shuffle_buffer`` lines (seeded by seed, epoch and
process). Position is saved by :meth:`ShardedJsonl.state_dict` — the range, the next offset, the
offsets of the buffered lines and the buffer's random state of every process iterated in *this*
Python process — and restored exactly by :meth:`ShardedJsonl.load_state_dict`. With
``num_workers=0`` that is the trainer's process; with workers, use a DataLoader that calls these
methods inside each worker (torchdata's ``StatefulDataLoader`` does): a plain DataLoader keeps the
workers' positions out of reach.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import get_spawning_popen
from multiprocessing.sharedctypes import RawValue
from typing import Any

import orjson
from torch.utils.data import IterableDataset

from stepscope.data.sharding import (
    DEFAULT_CHUNK_BYTES,
    ByteRange,
    distributed_rank,
    read_lines_at,
    read_range,
    resolve_slot,
    split_ranges,
)
from stepscope.errors import InputError, UsageError
from stepscope.limits import is_gzip

STATE_VERSION = 1


@dataclass
class _SlotState:
    """Where one process is in its epoch; mutated while it iterates, read by ``state_dict``."""

    range_index: int = 0
    offset: int | None = None  # next line start inside ranges[range_index]; None: the range's start
    buffer: list[tuple[int, int, bytes]] = field(default_factory=list)  # (file, offset, line)
    rng: random.Random = field(default_factory=random.Random)

    def snapshot(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"range": self.range_index, "offset": self.offset,
                "buffer": [[file, offset] for file, offset, _ in self.buffer],
                "rng": [version, list(internal), gauss]}


class ShardedJsonl(IterableDataset):
    """Samples from JSONL files (plain or gzip, any size), each read by exactly one process.

    Args:
        paths: one file or several; gzip is recognised by its magic bytes.
        shuffle_buffer: lines held per process to shuffle among (0: file order).
        seed: shuffle seed; the same seed and epoch give the same order on every run.
        shuffle_ranges: deal the byte ranges out in a seeded, epoch-dependent order (default: when
            ``shuffle_buffer`` > 0).
        chunk_bytes: approximate size of a byte range of a plain file.
        decode: turns one line (bytes, newline included) into a sample (default ``orjson.loads``).
        transform: applied to each decoded sample.
        rank, world_size, worker_id, num_workers: override what ``torch.distributed`` and
            ``get_worker_info()`` say (to simulate processes, or to shard by hand).

    Raises:
        InputError: a path that does not exist or is not a file.
        UsageError: a negative ``shuffle_buffer`` or non-positive ``chunk_bytes``.
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike], *, shuffle_buffer: int = 0,
                 seed: int = 0, shuffle_ranges: bool | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 decode: Callable[[bytes], Any] = orjson.loads, transform: Callable[[Any], Any] | None = None,
                 rank: int | None = None, world_size: int | None = None,
                 worker_id: int | None = None, num_workers: int | None = None):
        super().__init__()
        self.paths = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
        for path in self.paths:
            if not os.path.isfile(path):
                raise InputError(path, "no such JSONL file")
        if shuffle_buffer < 0 or chunk_bytes < 1:
            raise UsageError(f"shuffle_buffer must be >= 0 and chunk_bytes >= 1 "
                             f"(got {shuffle_buffer}, {chunk_bytes})")
        self.gzipped = [is_gzip(path) for path in self.paths]
        self.sizes = [os.path.getsize(path) for path in self.paths]
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.shuffle_ranges = shuffle_buffer > 0 if shuffle_ranges is None else shuffle_ranges
        self.chunk_bytes = chunk_bytes
        self.decode = decode
        self.transform = transform
        self._identity = (rank, world_size, worker_id, num_workers)
        self._epoch: Any = RawValue("q", 0)  # shared: set_epoch reaches persistent workers too
        self._pending_epoch = 0
        self._live: dict[int, _SlotState] = {}
        self._pending: dict[int, dict[str, Any]] = {}
        self._slot_count: int | None = None

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (it seeds the shuffles); a saved position for another epoch is dropped.

        The epoch lives in shared memory made before the workers start, so it reaches
        ``persistent_workers`` too.
        """
        self._epoch.value = epoch

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if get_spawning_popen() is None:  # a copy (deepcopy, pickle), not a worker starting: detach
            state["_epoch"] = _Cell(self.epoch)
            return state
        # A spawned worker starts without this rank's process group: hand it the rank now.
        rank, world_size, worker_id, num_workers = self._identity
        if rank is None or world_size is None:
            detected_rank, detected_world = distributed_rank()
            state["_identity"] = (detected_rank if rank is None else rank,
                                  detected_world if world_size is None else world_size, worker_id, num_workers)
        return state

    def ranges_for(self, slot: int, slot_count: int, epoch: int | None = None) -> list[ByteRange]:
        """The byte ranges process ``slot`` of ``slot_count`` reads in ``epoch``, in reading order."""
        ranges = split_ranges(self.sizes, self.gzipped, slot_count, self.chunk_bytes)
        if self.shuffle_ranges:
            random.Random(f"{self.seed}:{self.epoch if epoch is None else epoch}:ranges").shuffle(ranges)
        return ranges[slot::slot_count]

    def __iter__(self) -> Iterator[Any]:
        slot, slot_count = resolve_slot(*self._identity)
        if self._slot_count not in (None, slot_count) and self._pending:
            raise UsageError(f"the saved position is for {self._slot_count} reading processes "
                             f"(ranks × workers), this run has {slot_count}")
        self._slot_count = slot_count
        if self._pending_epoch != self.epoch:
            self._pending.clear()
        return self._iterate(slot, slot_count)

    def _iterate(self, slot: int, slot_count: int) -> Iterator[Any]:
        ranges = self.ranges_for(slot, slot_count)
        state = self._restore(slot) or self._fresh_state(slot)
        self._live[slot] = state
        decode, transform, capacity = self.decode, self.transform, self.shuffle_buffer
        buffer, rng = state.buffer, state.rng
        while state.range_index < len(ranges):
            byte_range = ranges[state.range_index]
            path, packed = self.paths[byte_range.file], self.gzipped[byte_range.file]
            for offset, line in read_range(path, byte_range, packed, state.offset):
                state.offset = offset + len(line)
                if not line.strip():
                    continue
                if capacity == 0:
                    yield _apply(decode(line), transform)
                    continue
                buffer.append((byte_range.file, offset, line))
                if len(buffer) >= capacity:
                    yield _apply(decode(_take(buffer, rng)), transform)
            state.range_index += 1
            state.offset = None
        while buffer:
            yield _apply(decode(_take(buffer, rng)), transform)

    def _fresh_state(self, slot: int) -> _SlotState:
        return _SlotState(rng=random.Random(f"{self.seed}:{self.epoch}:{slot}:buffer"))

    def state_dict(self) -> dict[str, Any]:
        """The position of every process iterated in this Python process (and any not yet resumed).

        A process whose epoch is complete is saved at its end: resuming it yields nothing more
        until :meth:`set_epoch` selects the next epoch.
        """
        slots = {str(slot): dict(saved) for slot, saved in self._pending.items()}
        slots.update({str(slot): state.snapshot() for slot, state in self._live.items()})
        return {"version": STATE_VERSION, "epoch": self.epoch, "slot_count": self._slot_count,
                "seed": self.seed, "shuffle_buffer": self.shuffle_buffer, "slots": slots}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration of each saved process continues where it was.

        Raises:
            UsageError: a state from another version, seed or shuffle buffer size.
        """
        if state.get("version") != STATE_VERSION:
            raise UsageError(f"unknown ShardedJsonl state version {state.get('version')!r}")
        if (state["seed"], state["shuffle_buffer"]) != (self.seed, self.shuffle_buffer):
            raise UsageError("the saved position was made with another seed or shuffle_buffer; "
                             "construct the dataset with the same ones to resume")
        self._epoch.value = self._pending_epoch = state["epoch"]
        self._slot_count = state["slot_count"]
        self._pending = {int(slot): saved for slot, saved in state["slots"].items()}
        self._live.clear()

    def _restore(self, slot: int) -> _SlotState | None:
        saved = self._pending.pop(slot, None)
        if saved is None:
            return None
        rng = random.Random()
        version, internal, gauss = saved["rng"]
        rng.setstate((version, tuple(internal), gauss))
        by_file: dict[int, list[int]] = {}
        for file, offset in saved["buffer"]:
            by_file.setdefault(file, []).append(offset)
        lines = {file: read_lines_at(self.paths[file], self.gzipped[file], offsets)
                 for file, offsets in by_file.items()}
        buffer = [(file, offset, lines[file][offset]) for file, offset in saved["buffer"]]
        return _SlotState(range_index=saved["range"], offset=saved["offset"], buffer=buffer, rng=rng)


class _Cell:
    """A plain stand-in for the shared epoch in copies of the dataset."""

    def __init__(self, value: int):
        self.value = value


def _take(buffer: list[tuple[int, int, bytes]], rng: random.Random) -> bytes:
    """Remove a random line from the buffer (swap with the last, pop)."""
    index = rng.randrange(len(buffer))
    buffer[index], buffer[-1] = buffer[-1], buffer[index]
    return buffer.pop()[2]


def _apply(sample: Any, transform: Callable[[Any], Any] | None) -> Any:
    return sample if transform is None else transform(sample)
