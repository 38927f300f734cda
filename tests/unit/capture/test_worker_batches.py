"""The DataLoader workers' own time per batch, timed in real forked workers."""

from __future__ import annotations

import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils import fetch

from stepscope.capture import worker_batches
from stepscope.capture.patching import patch_attribute

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forked DataLoader workers and /proc")

SLEEP_S = 0.004


class Sleepy(Dataset):
    """Each item sleeps (a read's latency) and then computes a little."""

    def __len__(self):
        return 24

    def __getitem__(self, index):
        time.sleep(SLEEP_S)
        return torch.full((4,), float(index))


@pytest.fixture
def timed(tmp_path):
    undo: list = []
    path = tmp_path / "worker_batches.txt"
    worker_batches.install(path, lambda owner, name, value: patch_attribute(owner, name, value, undo))
    yield path
    while undo:
        undo.pop()()


def _batches(loader):
    return [batch[:, 0].tolist() for batch in loader]


def test_forked_workers_write_one_line_per_batch_with_their_times(timed):
    loader = DataLoader(Sleepy(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    iterator = iter(loader)
    pids = {worker.pid for worker in iterator._workers}
    batches = [batch[:, 0].tolist() for batch in iterator]
    assert batches == _batches(DataLoader(Sleepy(), batch_size=4))  # the data is the same, in order
    rows = worker_batches.read_rows(timed, pids)
    assert rows is not None and len(rows) == 6 and {row[0] for row in rows} == pids
    for _pid, end_ns, wall_ns, cpu_ns, runq_ns in rows:
        assert wall_ns >= 4 * SLEEP_S * 1e9  # four items, each asleep SLEEP_S at least
        assert 0 <= cpu_ns <= wall_ns and runq_ns >= 0
        assert wall_ns - cpu_ns - runq_ns >= 0.5 * 4 * SLEEP_S * 1e9  # mostly off CPU: asleep
        assert end_ns <= time.monotonic_ns()  # the steps' and the samples' clock


def test_the_training_process_itself_is_not_timed(timed):
    assert _batches(DataLoader(Sleepy(), batch_size=4, num_workers=0)) == _batches(DataLoader(Sleepy(), batch_size=4))
    assert not timed.exists()


def test_the_fetchers_are_restored(tmp_path):
    before = (fetch._MapDatasetFetcher.fetch, fetch._IterableDatasetFetcher.fetch)
    undo: list = []
    worker_batches.install(tmp_path / "t.txt", lambda owner, name, value: patch_attribute(owner, name, value, undo))
    assert fetch._MapDatasetFetcher.fetch is not before[0]
    while undo:
        undo.pop()()
    assert (fetch._MapDatasetFetcher.fetch, fetch._IterableDatasetFetcher.fetch) == before


def test_a_dataset_error_in_a_worker_reaches_the_loop_as_without_timing(timed):
    class Broken(Sleepy):
        def __getitem__(self, index):
            raise KeyError(f"item {index}")

    with pytest.raises(KeyError, match="item 0"):
        next(iter(DataLoader(Broken(), batch_size=2, num_workers=1, multiprocessing_context="fork")))


def test_damaged_and_foreign_lines_are_skipped(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"7 100 50 10 5\n"  # a worker's line
                     b"8 100 50 10 5\n"  # not a worker of this run
                     b"7 x 50 10 5\n7 100 50\n7 100 -1 0 0\n"  # damaged
                     b"7 200 60 20 -1\n"  # run-queue not measured
                     b"7 300 7")  # cut mid-write
    assert worker_batches.read_rows(path, {7}) == ((7, 100, 50, 10, 5), (7, 200, 60, 20, -1))
    assert worker_batches.read_rows(tmp_path / "missing.txt", {7}) is None
    assert worker_batches.read_rows(path, {9}) is None


@pytest.mark.parametrize("setting", [None, "0"], ids=["default", "off"])
def test_a_captured_loop_records_its_workers_batches_unless_turned_off(tmp_path, monkeypatch, setting):
    import stepscope

    if setting is not None:
        monkeypatch.setenv("STEPSCOPE_WORKER_BATCHES", setting)
    model = torch.nn.Linear(4, 1)
    loader = DataLoader(Sleepy(), batch_size=4, num_workers=1, multiprocessing_context="fork")
    with stepscope.profile(tmp_path / "run", sample_interval_s=None, summary=False) as session:
        for batch in loader:
            model(batch).sum().backward()
    timed = session.record.facts.worker_batches
    if setting == "0":
        assert timed is None and not (tmp_path / "run" / "worker_batches.rank0.txt").exists()
    else:
        assert timed is not None and len(timed) == 6 and set(timed.pid) == set(session.record.loaders[0].worker_pids)
    assert fetch._MapDatasetFetcher.fetch.__name__ == "fetch" and not hasattr(fetch._MapDatasetFetcher.fetch, "__wrapped__")
