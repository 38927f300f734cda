"""`BucketBatchSampler`: batches of samples of similar size, from a size index read once.

The usual hand-written sampler computes every sample's length by loading the whole dataset at each start. Here
sizes are an array given once — typically :meth:`IndexedJsonl.sizes
<stepscope.data.indexed.IndexedJsonl.sizes>`, cached beside the data — so start-up costs an
``np.load``.

Algorithm, per epoch (every rank computes the same list from ``seed`` and ``epoch``):
1. Bucket each sample: bucket ``b`` holds sizes in ``[boundaries[b-1], boundaries[b])`` (sizes
   below the first boundary go to bucket 0, at or above the last to the last bucket). Without
   ``boundaries``, ``num_buckets`` quantiles of the sizes are used.
2. Shuffle the samples inside each bucket (if ``shuffle``), cut each bucket into batches of
   ``batch_size``; a bucket's last, short batch is dropped when ``drop_last``.
3. Shuffle the batches across buckets (if ``shuffle``).
4. Distributed: batches are dealt ``batches[rank::world_size]`` after making their count a
   multiple of ``world_size`` — by dropping the tail when ``drop_last``, else by repeating batches
   from the start (as ``DistributedSampler`` pads) — so every rank runs the same number of steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from stepscope.errors import UsageError


class BucketBatchSampler(Sampler[list[int]]):
    """Yields lists of indices whose sizes share a bucket; use as ``DataLoader(batch_sampler=...)``.

    Args:
        sizes: one size per sample (sequence length, pixels, bytes …).
        batch_size: samples per batch.
        boundaries: increasing bucket edges; None: ``num_buckets`` quantiles of ``sizes``.
        num_buckets: buckets when ``boundaries`` is None.
        shuffle: shuffle within and across buckets (seeded by ``seed`` and the epoch).
        seed: the shuffle seed (the same on every rank).
        drop_last: drop each bucket's short last batch, and the batches that would make ranks uneven.
        rank, world_size: this rank's share; default from ``torch.distributed`` when initialised.

    Raises:
        UsageError: ``batch_size`` < 1, ``num_buckets`` < 1, boundaries not increasing, or rank out
            of range.
    """

    def __init__(self, sizes: Sequence[int] | np.ndarray, batch_size: int, *,
                 boundaries: Sequence[float] | None = None, num_buckets: int = 8, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, rank: int | None = None, world_size: int | None = None):
        if batch_size < 1 or num_buckets < 1:
            raise UsageError(f"batch_size and num_buckets must be at least 1 (got {batch_size}, {num_buckets})")
        self.sizes = np.asarray(sizes)
        self.batch_size = batch_size
        self.boundaries = np.asarray(_boundaries(self.sizes, boundaries, num_buckets), dtype=np.float64)
        if np.any(np.diff(self.boundaries) <= 0):
            raise UsageError(f"bucket boundaries must increase: {self.boundaries.tolist()}")
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank, self.world_size = _rank(rank, world_size)
        self.epoch = 0
        self.bucket_of = np.searchsorted(self.boundaries, self.sizes, side="right")
        self._members = [np.flatnonzero(self.bucket_of == bucket) for bucket in range(len(self.boundaries) + 1)]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch: it seeds both shuffles."""
        self.epoch = epoch

    def _total_batches(self) -> int:
        rounding = math.floor if self.drop_last else math.ceil
        return sum(rounding(len(members) / self.batch_size) for members in self._members)

    def __len__(self) -> int:
        total = self._total_batches()
        return total // self.world_size if self.drop_last else math.ceil(total / self.world_size)

    def all_batches(self) -> list[list[int]]:
        """Every rank's batches of this epoch, in order, before they are dealt out."""
        return [batch.tolist() for batch in self._epoch_batches()]

    def _epoch_batches(self) -> list[np.ndarray]:
        """The epoch's batches as views into per-bucket permutations (no Python int per sample yet)."""
        rng = np.random.default_rng([self.seed, self.epoch])
        batches: list[np.ndarray] = []
        for members in self._members:
            order = rng.permutation(members) if self.shuffle else members
            stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
            batches.extend(order[start:start + self.batch_size] for start in range(0, stop, self.batch_size))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches)).tolist()]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._epoch_batches()
        needed = len(self) * self.world_size
        if len(batches) < needed:  # pad by repeating from the start (not drop_last)
            batches += (batches * math.ceil(needed / max(1, len(batches))))[:needed - len(batches)]
        for batch in batches[:needed][self.rank::self.world_size]:
            yield batch.tolist()


def _boundaries(sizes: np.ndarray, boundaries: Sequence[float] | None, num_buckets: int) -> list[float]:
    if boundaries is not None:
        return list(boundaries)
    if len(sizes) == 0 or num_buckets == 1:
        return []
    edges = np.unique(np.quantile(sizes, np.linspace(0, 1, num_buckets + 1)[1:-1], method="higher"))
    return edges.tolist()


def _rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        import torch.distributed as dist

        initialised = dist.is_available() and dist.is_initialized()
        rank = (dist.get_rank() if initialised else 0) if rank is None else rank
        world_size = (dist.get_world_size() if initialised else 1) if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside world_size {world_size}")
    return rank, world_size
