"""`run --set` parsing, validation, and how the values reach DataLoader constructor arguments."""

from __future__ import annotations

import os

import pytest

from stepscope.capture import overrides
from stepscope.capture.overrides import (KEYS, OverrideApplier, describe, parse_max_steps, parse_settings,
                                         parse_value)
from stepscope.errors import UsageError


def test_every_key_parses_to_its_type():
    settings = parse_settings(["dataloader.num_workers=4", "dataloader.pin_memory=true",
                               "dataloader.persistent_workers=Yes", "dataloader.prefetch_factor=4",
                               "dataloader.batch_size=64", "torch.num_threads=1"])
    assert settings == {"dataloader.num_workers": 4, "dataloader.pin_memory": True,
                        "dataloader.persistent_workers": True, "dataloader.prefetch_factor": 4,
                        "dataloader.batch_size": 64, "torch.num_threads": 1}
    assert set(settings) == set(KEYS)
    assert parse_value("dataloader.pin_memory", "0") is False
    assert describe({"dataloader.pin_memory": False, "dataloader.num_workers": 2}) == \
        "dataloader.pin_memory=false dataloader.num_workers=2"


@pytest.mark.parametrize(("items", "message"), [
    (["dataloader.workers=4"], "unknown key 'dataloader.workers'; accepted keys: dataloader.batch_size, "),
    (["num_workers"], "expects KEY=VALUE"),
    (["=3"], "expects KEY=VALUE"),
    (["dataloader.num_workers=-1"], "expected an integer >= 0, got -1"),
    (["dataloader.num_workers=two"], "expected an integer >= 0, got 'two'"),
    (["dataloader.num_workers=2.5"], "expected an integer"),
    (["dataloader.batch_size=0"], "expected an integer >= 1, got 0"),
    (["torch.num_threads=0"], "expected an integer >= 1"),
    (["dataloader.pin_memory=maybe"], "expected true or false, got 'maybe'"),
    (["dataloader.num_workers=1", "dataloader.num_workers=2"], "given twice"),
    (["dataloader.num_workers=0", "dataloader.prefetch_factor=4"], "needs DataLoader workers"),
    (["dataloader.num_workers=0", "dataloader.persistent_workers=true"], "needs DataLoader workers"),
])
def test_bad_settings_are_usage_errors(items, message):
    with pytest.raises(UsageError, match=None) as caught:
        parse_settings(items)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("key", ["dataloader.num_workers", "torch.num_threads"])
def test_worker_and_thread_counts_are_bounded_by_the_usable_cores(monkeypatch, key):
    monkeypatch.setattr(overrides, "usable_cores", lambda: 2)
    assert parse_settings([f"{key}=8"]) == {key: 8}  # 4 x 2 cores, and at least 8
    for text in ("9", "99999", "1000000000", "9" * 5000):
        with pytest.raises(UsageError) as caught:
            parse_settings([f"{key}={text}"])
        message = str(caught.value)
        assert "is past the bound of 8 (4 x the 2 usable cores, at least 8); give a value from" in message, message
        assert "\n" not in message and len(message) < 200
    monkeypatch.setattr(overrides, "usable_cores", lambda: 64)
    assert parse_settings([f"{key}=256"]) == {key: 256}
    with pytest.raises(UsageError, match="past the bound of 256 \\(4 x the 64 usable cores"):
        parse_settings([f"{key}=257"])


def test_prefetch_and_batch_size_are_bounded():
    assert parse_settings(["dataloader.prefetch_factor=64", "dataloader.batch_size=16777216"])
    with pytest.raises(UsageError, match="prefetch_factor: 65 is past the bound of 64"):
        parse_settings(["dataloader.prefetch_factor=65"])
    with pytest.raises(UsageError, match="batch_size: 99999999999 is past the bound of 16777216 \\(2\\^24 samples"):
        parse_settings(["dataloader.batch_size=99999999999"])


def test_usable_cores_follow_the_affinity():
    assert overrides.usable_cores() == len(os.sched_getaffinity(0))


def test_unknown_key_lists_every_accepted_key():
    with pytest.raises(UsageError) as caught:
        parse_settings(["nope=1"])
    for key in KEYS:
        assert key in str(caught.value)


def test_persistent_workers_false_with_no_workers_is_fine():
    assert parse_settings(["dataloader.num_workers=0", "dataloader.persistent_workers=false"])


def test_max_steps():
    assert parse_max_steps(None) is None and parse_max_steps(5) == 5
    with pytest.raises(UsageError, match="at least 1"):
        parse_max_steps(0)


def applier(*items: str) -> OverrideApplier:
    return OverrideApplier(parse_settings(items))


def test_loader_arguments_follow_the_effective_worker_count():
    fewer = applier("dataloader.num_workers=0")
    out = fewer.loader_kwargs({"dataset": [], "num_workers": 4, "prefetch_factor": 8, "persistent_workers": True})
    assert out == {"dataset": [], "num_workers": 0, "prefetch_factor": None, "persistent_workers": False}
    more = applier("dataloader.prefetch_factor=4", "dataloader.persistent_workers=true")
    assert more.loader_kwargs({"dataset": []}, "Loader") == {"dataset": []}  # no workers: skipped, noted
    assert more.skipped["dataloader.prefetch_factor"] == ["Loader with num_workers=0: prefetch_factor needs workers"]
    assert more.applied == {"dataloader.prefetch_factor": 0, "dataloader.persistent_workers": 0}
    out = more.loader_kwargs({"dataset": [], "num_workers": 2})
    assert out["prefetch_factor"] == 4 and out["persistent_workers"] is True
    both = applier("dataloader.num_workers=3", "dataloader.prefetch_factor=4", "dataloader.pin_memory=true")
    assert both.loader_kwargs({"dataset": []}) == {"dataset": [], "num_workers": 3, "prefetch_factor": 4,
                                                    "pin_memory": True}
    frozen = both.frozen(10, True)
    assert frozen.max_steps == 10 and frozen.stopped_at_max_steps
    assert [(item.key, item.value, item.applied) for item in frozen.settings] == [
        ("dataloader.num_workers", 3, 1), ("dataloader.prefetch_factor", 4, 1), ("dataloader.pin_memory", True, 1)]


def test_batch_size_rebuilds_a_plain_batch_sampler_and_leaves_custom_ones():
    from torch.utils.data import BatchSampler, SequentialSampler

    sizes = applier("dataloader.batch_size=64")
    assert sizes.loader_kwargs({"dataset": [], "batch_size": 8}) == {"dataset": [], "batch_size": 64}
    assert sizes.loader_kwargs({"dataset": []}) == {"dataset": [], "batch_size": 64}
    plain = BatchSampler(SequentialSampler(range(100)), 8, drop_last=True)
    rebuilt = sizes.loader_kwargs({"dataset": [], "batch_sampler": plain})["batch_sampler"]
    assert rebuilt.batch_size == 64 and rebuilt.drop_last and rebuilt.sampler is plain.sampler

    class Buckets(BatchSampler):
        pass

    custom = Buckets(SequentialSampler(range(10)), 2, drop_last=False)
    assert sizes.loader_kwargs({"dataset": [], "batch_sampler": custom})["batch_sampler"] is custom
    assert sizes.loader_kwargs({"dataset": [], "batch_size": None})["batch_size"] is None
    assert sizes.applied["dataloader.batch_size"] == 3
    assert len(sizes.skipped["dataloader.batch_size"]) == 2


def test_constructor_patch_binds_positional_arguments():
    from torch.utils.data import DataLoader

    undo = []

    def patch(owner, name, replacement):
        original = vars(owner)[name]
        setattr(owner, name, replacement)
        undo.append(lambda: setattr(owner, name, original))

    settings = applier("dataloader.batch_size=5", "dataloader.num_workers=0")
    settings.install_loader(patch)
    try:
        loader = DataLoader(list(range(20)), 2, False, None, None, 3, prefetch_factor=2)  # positional batch_size
    finally:
        undo.pop()()
    assert loader.batch_size == 5 and loader.num_workers == 0 and loader.prefetch_factor is None
    assert DataLoader(list(range(4)), 2).batch_size == 2  # restored
