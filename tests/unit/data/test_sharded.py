"""ShardedJsonl: every sample exactly once across ranks × workers × epochs, own bytes only, resume."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonl_files import write_jsonl
from torch.utils.data import DataLoader

from stepscope.data import ShardedJsonl, sharding
from stepscope.errors import InputError, UsageError

HYPOTHESIS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def read_all(paths, ranks: int, workers: int, epoch: int = 0, **options) -> list[list[int]]:
    """The ids each simulated process (rank, worker) yields, in order."""
    out = []
    for rank in range(ranks):
        for worker in range(workers):
            dataset = ShardedJsonl(paths, rank=rank, world_size=ranks, worker_id=worker, num_workers=workers,
                                   **options)
            dataset.set_epoch(epoch)
            out.append([item["id"] for item in dataset])
    return out


@HYPOTHESIS
@given(files=st.lists(st.tuples(st.integers(0, 60), st.booleans(), st.booleans()), min_size=1, max_size=3),
       ranks=st.integers(1, 3), workers=st.integers(1, 3), chunk_bytes=st.integers(1, 400),
       shuffle_buffer=st.sampled_from([0, 1, 7]), epochs=st.integers(1, 2), blank_every=st.sampled_from([0, 3]))
def test_every_sample_exactly_once_across_ranks_workers_and_epochs(tmp_path_factory, files, ranks, workers,
                                                                    chunk_bytes, shuffle_buffer, epochs,
                                                                    blank_every):
    directory = tmp_path_factory.mktemp("sharded")
    paths, expected, next_id = [], [], 0
    for index, (count, packed, trailing) in enumerate(files):
        ids = list(range(next_id, next_id + count))
        next_id += count
        expected += ids
        suffix = ".jsonl.gz" if packed else ".jsonl"
        paths.append(write_jsonl(directory / f"part{index}{suffix}", ids, packed=packed,
                                 trailing_newline=trailing, blank_every=blank_every))
    for epoch in range(epochs):
        per_process = read_all(paths, ranks, workers, epoch, chunk_bytes=chunk_bytes, shuffle_buffer=shuffle_buffer,
                               seed=3)
        seen = Counter(ident for ids in per_process for ident in ids)
        assert sorted(seen) == sorted(expected) and set(seen.values()) <= {1}


def test_file_order_without_shuffle_and_a_new_order_each_epoch_with_it(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", range(300))
    assert read_all([path], 1, 1, chunk_bytes=500) == [list(range(300))]
    first, second = (read_all([path], 1, 1, epoch, chunk_bytes=500, shuffle_buffer=50, seed=1)[0]
                     for epoch in (0, 1))
    assert sorted(first) == sorted(second) == list(range(300)) and first != second
    assert read_all([path], 1, 1, 1, chunk_bytes=500, shuffle_buffer=50, seed=1)[0] == second  # seeded


def test_byte_ranges_cover_each_line_start_once():
    ranges = sharding.split_ranges([1000, 10, 0], [False, True, False], slot_count=4, chunk_bytes=128)
    plain = [r for r in ranges if r.file == 0]
    assert plain[0].start == 0 and plain[-1].end == 1000
    assert all(left.end == right.start for left, right in zip(plain, plain[1:]))
    assert [r for r in ranges if r.file == 1] == [sharding.ByteRange(1, 0, None)]
    assert len(ranges) >= 4


def test_each_process_reads_only_its_own_lines(tmp_path, monkeypatch):
    """Bytes returned to all processes together: the file once, plus one partial line per range start."""
    path = write_jsonl(tmp_path / "data.jsonl", range(2000))
    size, longest = path.stat().st_size, max(len(line) for line in path.read_bytes().splitlines(keepends=True))
    read = Counter()
    real_read_range = sharding.read_range

    def counting(*args, **kwargs):
        for offset, line in real_read_range(*args, **kwargs):
            read["bytes"] += len(line)
            read["lines"] += 1
            yield offset, line

    monkeypatch.setattr("stepscope.data.sharded.read_range", counting)
    per_process = read_all([path], 2, 4, chunk_bytes=4096)
    assert read["lines"] == 2000 and read["bytes"] == size  # no line read twice, none scanned by another
    assert all(ids for ids in per_process)  # every process got work
    assert longest < 4096


def test_resume_continues_exactly_where_it_stopped(tmp_path):
    paths = [write_jsonl(tmp_path / "a.jsonl", range(0, 400)),
             write_jsonl(tmp_path / "b.jsonl.gz", range(400, 600), packed=True)]
    options = dict(chunk_bytes=700, shuffle_buffer=32, seed=5, rank=1, world_size=2)
    whole = [item["id"] for item in ShardedJsonl(paths, **options)]
    for stop in (0, 1, 57, len(whole) - 1, len(whole)):
        dataset = ShardedJsonl(paths, **options)
        iterator = iter(dataset)
        head = [next(iterator)["id"] for _ in range(stop)]
        state = json.loads(json.dumps(dataset.state_dict()))  # survives a JSON checkpoint
        resumed = ShardedJsonl(paths, **options)
        resumed.load_state_dict(state)
        assert head + [item["id"] for item in resumed] == whole, stop


def test_resume_rejects_another_seed_or_process_count(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", range(50))
    dataset = ShardedJsonl(path, shuffle_buffer=4, seed=1, world_size=2, rank=0)
    next(iter(dataset))
    state = dataset.state_dict()
    with pytest.raises(UsageError, match="seed"):
        ShardedJsonl(path, shuffle_buffer=4, seed=2).load_state_dict(state)
    other = ShardedJsonl(path, shuffle_buffer=4, seed=1, world_size=3, rank=0)
    other.load_state_dict(state)
    with pytest.raises(UsageError, match="2 reading processes"):
        iter(other)


def test_set_epoch_drops_a_saved_position_of_another_epoch(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", range(20))
    dataset = ShardedJsonl(path)
    iterator = iter(dataset)
    [next(iterator) for _ in range(5)]
    resumed = ShardedJsonl(path)
    resumed.load_state_dict(dataset.state_dict())
    resumed.set_epoch(1)
    assert len(list(resumed)) == 20


def test_real_dataloader_workers_share_the_file_exactly_once(tmp_path):
    paths = [write_jsonl(tmp_path / "a.jsonl", range(0, 700)),
             write_jsonl(tmp_path / "b.jsonl.gz", range(700, 900), packed=True),
             write_jsonl(tmp_path / "c.jsonl.gz", range(900, 1000), packed=True)]
    dataset = ShardedJsonl(paths, chunk_bytes=1024, shuffle_buffer=16)
    loader = DataLoader(dataset, batch_size=10, num_workers=2, collate_fn=lambda batch: [s["id"] for s in batch])
    ids = [ident for batch in loader for ident in batch]
    assert sorted(ids) == list(range(1000))


def test_bad_arguments_are_reported(tmp_path):
    with pytest.raises(InputError, match="no such JSONL file"):
        ShardedJsonl(tmp_path / "missing.jsonl")
    path = write_jsonl(tmp_path / "a.jsonl", range(3))
    with pytest.raises(UsageError):
        ShardedJsonl(path, shuffle_buffer=-1)
    with pytest.raises(UsageError, match="out of range"):
        iter(ShardedJsonl(path, rank=2, world_size=2))


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_exact_resume_across_workers_with_a_stateful_dataloader(tmp_path):
    """torchdata's StatefulDataLoader calls state_dict/load_state_dict inside each worker."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    paths = [write_jsonl(tmp_path / "a.jsonl", range(500)),
             write_jsonl(tmp_path / "b.jsonl.gz", range(500, 700), packed=True)]

    def make_loader():
        dataset = ShardedJsonl(paths, chunk_bytes=2000, shuffle_buffer=16, seed=3)
        return stateful.StatefulDataLoader(dataset, batch_size=5, num_workers=2, collate_fn=ids_of)

    whole = [ident for batch in make_loader() for ident in batch]
    loader = make_loader()
    iterator = iter(loader)
    head = [ident for _ in range(37) for ident in next(iterator)]
    state = loader.state_dict()
    del iterator
    resumed = make_loader()
    resumed.load_state_dict(state)
    assert head + [ident for batch in resumed for ident in batch] == whole
    assert sorted(whole) == list(range(700))


def ids_of(batch):
    return [item["id"] for item in batch]


def test_set_epoch_reaches_persistent_workers(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", range(300))

    def epoch_orders(persistent: bool) -> list[list[int]]:
        dataset = ShardedJsonl(path, chunk_bytes=1500, shuffle_buffer=20, seed=2)
        loader = DataLoader(dataset, batch_size=10, num_workers=2, persistent_workers=persistent, collate_fn=ids_of)
        orders = []
        for epoch in range(2):
            dataset.set_epoch(epoch)
            orders.append([ident for batch in loader for ident in batch])
        return orders

    persistent = epoch_orders(True)
    assert persistent == epoch_orders(False) and persistent[0] != persistent[1]
    assert sorted(persistent[1]) == list(range(300))


def test_a_copy_of_the_dataset_is_detached(tmp_path):
    import copy
    import pickle

    dataset = ShardedJsonl(write_jsonl(tmp_path / "a.jsonl", range(5)))
    dataset.set_epoch(3)
    clone = pickle.loads(pickle.dumps(copy.deepcopy(dataset)))
    clone.set_epoch(4)
    assert (dataset.epoch, clone.epoch, len(list(clone))) == (3, 4, 5)


def _rank_main(rank: int, world_size: int, store: str, paths: list[str], out: str, context: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        dataset = ShardedJsonl(paths, chunk_bytes=1024, shuffle_buffer=8)  # rank and workers detected
        # spawned workers each import torch anew: one per rank is enough to cross processes there
        workers = 2 if context == "fork" else 1
        loader = DataLoader(dataset, batch_size=7, num_workers=workers, collate_fn=ids_of,
                            multiprocessing_context=context)
        ids = [ident for batch in loader for ident in batch]
        with open(f"{out}.{rank}", "w", encoding="utf-8") as handle:
            json.dump(ids, handle)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_ranks_from_torch_distributed_and_workers_read_each_sample_once(tmp_path, context):
    import torch.multiprocessing as mp

    paths = [str(write_jsonl(tmp_path / "a.jsonl", range(600))),
             str(write_jsonl(tmp_path / "b.jsonl.gz", range(600, 700), packed=True)),
             str(write_jsonl(tmp_path / "c.jsonl.gz", range(700, 800), packed=True))]
    out = str(tmp_path / "ids")
    mp.spawn(_rank_main, args=(2, str(tmp_path / "store"), paths, out, context), nprocs=2, join=True)
    per_rank = [json.loads((tmp_path / f"ids.{rank}").read_text()) for rank in range(2)]
    assert all(per_rank) and sorted(per_rank[0] + per_rank[1]) == list(range(800))
