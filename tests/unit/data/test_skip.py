"""SkipBadSamples: skips are counted in every process and reach skipped_samples()."""

from __future__ import annotations

import subprocess
import sys

import pytest
from torch.utils.data import DataLoader

from stepscope.data import skip
from stepscope.data.skip import BadSamplesError, SkipBadSamples, skip_counts, skipped_samples


class Flaky:
    """Samples whose index is a multiple of ``every`` fail to load."""

    def __init__(self, length: int, every: int):
        self.length, self.every = length, every

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if index % self.every == 0:
            raise ValueError(f"corrupt sample {index}")
        return index


@pytest.fixture(autouse=True)
def fresh_registry():
    skip.reset_skip_counts()
    yield
    skip.reset_skip_counts()


def test_a_failing_sample_is_replaced_by_the_next_and_counted():
    dataset = SkipBadSamples(Flaky(10, 3), name="flaky")
    assert [dataset[i] for i in range(10)] == [1, 1, 2, 4, 4, 5, 7, 7, 8, 1]
    assert dataset.skipped == 5 and skipped_samples() == 5
    assert skip_counts() == [skip.SkipCount("flaky", 5, (5,))]


def test_counts_add_up_across_dataloader_workers():
    dataset = SkipBadSamples(Flaky(40, 4))
    loader = DataLoader(dataset, batch_size=5, num_workers=2)
    assert sum(len(batch) for batch in loader) == 40
    counts = skip_counts()[0]
    assert counts.total == 10 == skipped_samples()
    assert counts.by_process[0] == 0 and sum(counts.by_process[1:]) == 10 and len(counts.by_process) == 3


def test_too_many_failures_in_a_row_raise_with_the_cause():
    dataset = SkipBadSamples(Flaky(10, 1), max_consecutive=3)
    with pytest.raises(BadSamplesError, match="3 samples in a row") as caught:
        dataset[0]
    assert isinstance(caught.value.__cause__, ValueError)


def test_other_errors_are_not_swallowed():
    dataset = SkipBadSamples(Flaky(10, 2), exceptions=KeyError)
    with pytest.raises(ValueError):
        dataset[0]


def test_the_counter_module_and_stepscope_stay_torch_free():
    code = ("import sys, stepscope, stepscope.data, stepscope.data.skip as s; assert s.skipped_samples() == 0; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr
    result = subprocess.run([sys.executable, "-c", "import sys, stepscope; assert 'stepscope.data' not in sys.modules"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_counts_reach_the_parent_from_spawned_workers():
    dataset = SkipBadSamples(Flaky(12, 3))  # one spawned worker (each imports torch anew)
    loader = DataLoader(dataset, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert sum(len(batch) for batch in loader) == 12
    assert skipped_samples() == 4 and skip_counts()[0].by_process == (0, 4)
