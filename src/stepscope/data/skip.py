"""`SkipBadSamples`: move on to the next index when a sample fails to load — and count it.

The common idiom (``except Exception: return self[(index + 1) % len(self)]``) hides data problems:
the run looks healthy while it silently trains on fewer, and duplicated, samples. This wrapper
does the same but counts every skip, per process (slot 0 is the main process, slot ``1 + id`` a
DataLoader worker), in shared memory created before the workers start (a lock-free array: each
process writes only its own slot), so the totals add up across forked or spawned workers. Two
loaders iterating the same wrapper at the same time share worker slots and may lose a count.

Capture reads the totals through :func:`skipped_samples` (total) or :func:`skip_counts` (per
wrapped dataset and process), in the process that created the wrappers (the training process).
Torch is not imported here and nothing is allocated until a wrapper exists; a caller that must not
import anything can look the module up first: when ``sys.modules.get("stepscope.data.skip")`` is
None, no wrapper exists and nothing was skipped. After ``max_consecutive`` failures in a row the
last error is raised, chained, as :class:`BadSamplesError`.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawArray
from typing import Any

from stepscope.errors import StepscopeError, UsageError

logger = logging.getLogger(__name__)

#: Per-process counters: the main process and up to this many DataLoader workers (more share slots).
WORKER_SLOTS = 256

#: (name, shared counters) of every wrapper made in this process; not the wrappers (no dataset is kept alive).
_REGISTRY: list[tuple[str, Any]] = []
_REGISTRY_LOCK = threading.Lock()


class BadSamplesError(StepscopeError):
    """Too many samples in a row failed to load: the data, not a sample, is broken."""


@dataclass(frozen=True)
class SkipCount:
    """Skips of one wrapped dataset: ``total``, and per process (``by_process[0]`` is the main one)."""

    dataset: str
    total: int
    by_process: tuple[int, ...]


class SkipBadSamples:
    """Wrap a map-style dataset; a sample whose loading raises is replaced by the next index's.

    Args:
        dataset: anything with ``__getitem__`` and ``__len__``.
        exceptions: the errors that mean "bad sample" (others propagate at once).
        max_consecutive: failures in a row before giving up.
        name: how the dataset is named in :func:`skip_counts` (default: its class name).

    Raises:
        UsageError: ``max_consecutive`` < 1.
        BadSamplesError: (from ``__getitem__``) ``max_consecutive`` failures in a row.
    """

    def __init__(self, dataset: Any, *, exceptions: type[BaseException] | tuple[type[BaseException], ...] = Exception,
                 max_consecutive: int = 10, name: str | None = None):
        if max_consecutive < 1:
            raise UsageError(f"max_consecutive must be at least 1, got {max_consecutive}")
        self.dataset = dataset
        self.exceptions = exceptions
        self.max_consecutive = max_consecutive
        self.name = name or type(dataset).__name__
        self._counts = RawArray("q", WORKER_SLOTS + 1)
        self._lock = threading.Lock()
        with _REGISTRY_LOCK:
            _REGISTRY.append((self.name, self._counts))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        error: BaseException | None = None
        for attempt in range(self.max_consecutive):
            try:
                return self.dataset[(index + attempt) % len(self.dataset)]
            except self.exceptions as exc:  # noqa: PERF203 - the point of the wrapper
                error = exc
                self._count_one()
                if attempt == 0:
                    logger.debug("sample %s of %s failed: %r; using the next one", index, self.name, exc)
        raise BadSamplesError(f"{self.max_consecutive} samples in a row failed to load from {self.name} "
                              f"(from index {index}); last error: {error!r}") from error

    def _count_one(self) -> None:
        with self._lock:  # threads of one process; processes write only their own slot
            self._counts[_process_slot()] += 1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def skipped(self) -> int:
        """Samples skipped so far, in every process."""
        return sum(self._counts[:])

    def count(self) -> SkipCount:
        return _count(self.name, self._counts)


def _count(name: str, shared: Any) -> SkipCount:
    counts = tuple(shared[:])
    last = max((slot for slot, value in enumerate(counts) if value), default=0)
    return SkipCount(name, sum(counts), counts[:last + 1])


def _process_slot() -> int:
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return 0 if info is None else 1 + info.id % WORKER_SLOTS


def skip_counts() -> list[SkipCount]:
    """One :class:`SkipCount` per :class:`SkipBadSamples` created in this process, in creation order."""
    with _REGISTRY_LOCK:
        entries = list(_REGISTRY)
    return [_count(name, shared) for name, shared in entries]


def skipped_samples() -> int:
    """Total samples skipped by every :class:`SkipBadSamples` of this process and its workers."""
    return sum(count.total for count in skip_counts())


def reset_skip_counts() -> None:
    """Forget every wrapper made so far (their own counters keep counting)."""
    with _REGISTRY_LOCK:
        _REGISTRY.clear()
