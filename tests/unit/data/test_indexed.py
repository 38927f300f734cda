"""IndexedJsonl: the line index is built once, cached, and rebuilt when the file changes."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonl_files import sample, write_jsonl
from torch.utils.data import DataLoader

from stepscope.data import IndexedJsonl
from stepscope.data.indexed import scan_lines
from stepscope.errors import InputError, UsageError


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.sampled_from([b"", b"\r", b"{}", b"[1,2]", b'{"a": "x"}', b"7"]), max_size=30),
       trailing=st.booleans())
def test_index_finds_every_non_blank_line(tmp_path_factory, lines, trailing):
    path = tmp_path_factory.mktemp("scan") / "data.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if trailing and lines else b""))
    offsets, lengths = scan_lines(str(path))
    content = path.read_bytes()
    assert [content[o:o + n] for o, n in zip(offsets, lengths)] == [line for line in lines if line not in (b"", b"\r")]


def test_random_access_and_index_cache(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", range(100), blank_every=7, trailing_newline=False)
    first = IndexedJsonl(path)
    assert not first.index_was_cached and len(first) == 100
    assert first[42] == sample(42, 42 % 13) and first[-1]["id"] == 99
    assert (tmp_path / "data.jsonl.stepscope-index.npz").exists()
    again = IndexedJsonl(path)
    assert again.index_was_cached and again[99]["id"] == 99
    with pytest.raises(IndexError):
        again[100]


def test_a_changed_file_is_reindexed(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", range(10))
    IndexedJsonl(path)
    write_jsonl(path, range(10, 25))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    dataset = IndexedJsonl(path)
    assert not dataset.index_was_cached and len(dataset) == 15 and dataset[0]["id"] == 10


def test_cache_dir_and_cached_sizes(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", range(50))
    cache = tmp_path / "cache"
    dataset = IndexedJsonl(path, cache_dir=cache)
    calls = []

    def tokens(item):
        calls.append(1)
        return len(item["tokens"])

    sizes = dataset.sizes(tokens, size_key="tokens")
    assert sizes.tolist() == [i % 13 for i in range(50)] and len(calls) == 50
    assert IndexedJsonl(path, cache_dir=cache).sizes(tokens, size_key="tokens").tolist() == sizes.tolist()
    assert len(calls) == 50  # second time from the cache
    assert len(list(cache.iterdir())) == 2 and not (tmp_path / "data.jsonl.stepscope-index.npz").exists()
    assert np.array_equal(dataset.sizes(), dataset.lengths)
    with pytest.raises(UsageError, match="size_key"):
        dataset.sizes(tokens)


def test_gzip_and_missing_files_are_refused(tmp_path):
    with pytest.raises(InputError, match="gzip"):
        IndexedJsonl(write_jsonl(tmp_path / "data.jsonl.gz", range(3), packed=True))
    with pytest.raises(InputError, match="no such"):
        IndexedJsonl(tmp_path / "nope.jsonl")


def test_workers_read_through_their_own_descriptor(tmp_path):
    dataset = IndexedJsonl(write_jsonl(tmp_path / "data.jsonl", range(64)))
    dataset[0]  # the parent's descriptor must not travel to the workers
    loader = DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=lambda batch: [s["id"] for s in batch])
    assert sorted(i for batch in loader for i in batch) == list(range(64))
