"""tune_loader's parts: rebuilding a loader with other knobs, counting samples, the budget, errors."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, TensorDataset

from stepscope.data.tuner import LoaderFactory, LoaderSetting, batch_length, rebuild, tune_loader
from stepscope.errors import UsageError

DATA = TensorDataset(torch.arange(64.0).unsqueeze(1))


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(32))


def collate_ids(batch):
    return torch.tensor([item[0].item() for item in batch])


@pytest.mark.parametrize("loader", [
    DataLoader(DATA, batch_size=8, sampler=SequentialSampler(DATA), collate_fn=collate_ids, drop_last=True),
    DataLoader(DATA, batch_sampler=BatchSampler(SequentialSampler(DATA), 16, False), collate_fn=collate_ids),
    DataLoader(Stream(), batch_size=4),
], ids=["sampler", "batch_sampler", "iterable"])
def test_rebuild_keeps_data_sampling_and_collate(loader):
    setting = LoaderSetting(num_workers=1, prefetch_factor=3, pin_memory=False, persistent_workers=True,
                            batch_size=loader.batch_size)
    rebuilt = rebuild(loader, setting)
    assert (rebuilt.num_workers, rebuilt.prefetch_factor, rebuilt.persistent_workers) == (1, 3, True)
    assert rebuilt.dataset is loader.dataset and rebuilt.collate_fn is loader.collate_fn
    assert [b.tolist() for b in rebuilt] == [b.tolist() for b in loader]


@pytest.mark.parametrize(("batch", "length"), [
    (torch.zeros(5, 2), 5), ({"x": torch.zeros(3)}, 3), ([torch.zeros(4), torch.zeros(4)], 4), ([1, 2, 3], 3),
    (7, 1),
])
def test_batch_length(batch, length):
    assert batch_length(batch) == length


def test_factory_errors_are_usage_errors():
    def raising():
        raise RuntimeError("no data here")

    with pytest.raises(UsageError, match="raised RuntimeError: no data here"):
        LoaderFactory(raising)
    with pytest.raises(UsageError, match="not a DataLoader"):
        LoaderFactory(lambda: [1, 2])
    with pytest.raises(UsageError, match="not a function"):
        LoaderFactory(3)


def test_a_tiny_budget_stops_after_the_first_trials():
    def slow_loader(num_workers=0, batch_size=4):
        class Slow(torch.utils.data.Dataset):
            def __len__(self):
                return 400

            def __getitem__(self, index):
                time.sleep(0.001)
                return torch.tensor([index])

        return DataLoader(Slow(), batch_size=batch_size, num_workers=num_workers)

    result = tune_loader(slow_loader, budget_s=0.2, batches=4, min_time_s=0.05, max_workers=0)
    assert result.budget_exhausted and len(result.trials) <= 2
    assert result.baseline == LoaderSetting(0, None, False, False, 4)


def scripted(rates):
    """A stand-in for one trial: the rate is a function of the setting, no loader runs."""
    from stepscope.data import tuner

    def fake_measure(factory, setting, batches, stage, min_time_s=0.0):
        return tuner.Trial(stage, setting, rates(setting), 0.01, 0.2 if not setting.persistent_workers else 0.01,
                           batches, 0.001)

    return fake_measure


def test_the_search_climbs_until_flat_and_does_not_walk_the_grid(monkeypatch):
    from stepscope.data import tuner

    def rates(setting):  # flattens at 4 workers; prefetch 4 helps a little, 8 does not; larger batches help
        rate = 100.0 * min(setting.num_workers, 4) + 50
        rate *= 1.2 if setting.prefetch_factor == 4 else 1.0
        return rate * (1.1 if setting.batch_size == 64 else 1.0)

    monkeypatch.setattr(tuner, "measure", scripted(rates))
    factory = lambda num_workers=0, batch_size=32, **kw: DataLoader(DATA, batch_size=batch_size,  # noqa: E731
                                                                    num_workers=num_workers, **kw)
    result = tune_loader(factory, budget_s=30, max_workers=64)
    workers = [t.setting.num_workers for t in result.trials if t.stage == "workers"]
    assert workers == [1, 2, 3, 4, 6, 8]  # two flat steps after 4, then stop: no 12…64
    assert result.best == LoaderSetting(4, 4, False, True, 64)  # persistent kept: restart halved, speed held
    assert [t.stage for t in result.trials][-2:] == ["repeat", "repeat"]
    assert result.speedup == pytest.approx(450 * 1.2 * 1.1 / 50)
    assert len(result.trials) < 15


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_the_search_walks_down_when_more_workers_do_not_help(monkeypatch):
    from stepscope.data import tuner

    monkeypatch.setattr(tuner, "measure", scripted(lambda setting: 100.0 if setting.num_workers >= 2 else 60.0))
    factory = lambda num_workers=8, **kw: DataLoader(DATA, batch_size=4, num_workers=num_workers, **kw)  # noqa: E731
    result = tune_loader(factory, budget_s=30, max_workers=16)
    assert result.best.num_workers == 2 and result.oversubscribed is (2 + torch.get_num_threads() > result.cpu_count)
