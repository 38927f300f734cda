"""BucketBatchSampler: homogeneous buckets, exact lengths, every sample once, equal shares per rank."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.data import BucketBatchSampler
from stepscope.errors import UsageError

sizes_strategy = st.lists(st.integers(0, 300), min_size=0, max_size=200)


@settings(max_examples=60, deadline=None)
@given(sizes=sizes_strategy, batch_size=st.integers(1, 17), num_buckets=st.integers(1, 6),
       drop_last=st.booleans(), shuffle=st.booleans(), epoch=st.integers(0, 3))
def test_batches_are_homogeneous_and_len_is_exact(sizes, batch_size, num_buckets, drop_last, shuffle, epoch):
    sampler = BucketBatchSampler(sizes, batch_size, num_buckets=num_buckets, drop_last=drop_last, shuffle=shuffle)
    sampler.set_epoch(epoch)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    for batch in batches:
        assert 1 <= len(batch) <= batch_size and (not drop_last or len(batch) == batch_size)
        assert len({int(sampler.bucket_of[i]) for i in batch}) == 1
    seen = Counter(i for batch in batches for i in batch)
    if not drop_last:
        assert sorted(seen) == list(range(len(sizes))) and set(seen.values()) <= {1}
    else:
        assert set(seen.values()) <= {1}
        per_bucket = Counter(int(b) for b in sampler.bucket_of)
        assert len(seen) == sum(n - n % batch_size for n in per_bucket.values())


@settings(max_examples=60, deadline=None)
@given(sizes=sizes_strategy, batch_size=st.integers(1, 9), world_size=st.integers(1, 4), drop_last=st.booleans(),
       epoch=st.integers(0, 2))
def test_ranks_get_equal_shares_covering_every_sample(sizes, batch_size, world_size, drop_last, epoch):
    shares = []
    for rank in range(world_size):
        sampler = BucketBatchSampler(sizes, batch_size, boundaries=[50, 100, 200], seed=7, drop_last=drop_last,
                                     rank=rank, world_size=world_size)
        sampler.set_epoch(epoch)
        shares.append(list(sampler))
        assert len(shares[-1]) == len(sampler)
    assert len({len(share) for share in shares}) == 1
    seen = Counter(i for share in shares for batch in share for i in batch)
    if drop_last:
        assert set(seen.values()) <= {1}
    else:  # every sample at least once; repeats only to even out the ranks
        assert sorted(seen) == list(range(len(sizes)))
        repeated_batches = len(shares[0]) * world_size - sum(-(-n // batch_size) for n in
                                                             Counter(np.searchsorted([50, 100, 200], sizes,
                                                                                     side="right")).values())
        assert repeated_batches < world_size


def test_explicit_boundaries_and_seeded_epochs():
    sizes = [5, 60, 150, 250, 7, 61, 149, 999] * 10
    sampler = BucketBatchSampler(sizes, 4, boundaries=[50, 100, 200], seed=1)
    buckets = {tuple(sorted({sizes[i] for i in batch})) for batch in sampler}
    assert buckets <= {(5,), (7,), (5, 7), (60,), (61,), (60, 61), (149,), (150,), (149, 150), (250,), (999,),
                       (250, 999)}
    again = BucketBatchSampler(sizes, 4, boundaries=[50, 100, 200], seed=1)
    assert list(again) == list(sampler)
    again.set_epoch(1)
    assert list(again) != list(sampler)


def test_bad_arguments():
    with pytest.raises(UsageError):
        BucketBatchSampler([1, 2], 0)
    with pytest.raises(UsageError, match="increase"):
        BucketBatchSampler([1, 2], 2, boundaries=[5, 5])
    with pytest.raises(UsageError, match="rank"):
        BucketBatchSampler([1, 2], 2, rank=2, world_size=2)
