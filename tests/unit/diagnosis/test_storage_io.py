from __future__ import annotations

import pytest

from diagnosis_records import ctx_of, make_record
from stepscope.diagnosis.rules.storage_io import loader_waits_on_io

INPUT = {"data_wait": 0.7, "forward": 0.15, "backward": 0.1, "optimizer": 0.03}


@pytest.mark.parametrize("record_kwargs, signals, fires", [
    (dict(shares=INPUT, num_workers=0), dict(cpu_count=2, main_cpu_util=0.25, cpu_util_mean=0.12), True),
    (dict(shares=INPUT, num_workers=2), dict(cpu_count=2, worker_cpu_util_mean=0.05, iowait_share=0.2), True),
    (dict(shares=INPUT, num_workers=2), dict(cpu_count=2, worker_cpu_util_mean=0.95), False),
    (dict(shares=INPUT, num_workers=0), None, False),  # no evidence of I/O at all: not claimed
    (dict(shares={"data_wait": 0.02, "forward": 0.7, "backward": 0.2}, num_workers=0),
     dict(cpu_count=2, main_cpu_util=0.1, iowait_share=0.3), False),
])
def test_loader_waits_on_io(record_kwargs, signals, fires):
    finding = loader_waits_on_io(ctx_of(make_record(**record_kwargs), signals))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "storage_io"
        assert finding.impact == pytest.approx(0.7, abs=0.05)


def test_latency_bound_suggests_more_workers_than_cores():
    record = make_record(shares=INPUT, num_workers=0, cpu_count=2)
    finding = loader_waits_on_io(ctx_of(record, dict(cpu_count=2, main_cpu_util=0.2, cpu_util_mean=0.1)))
    workers = finding.prescriptions[0]
    assert workers.setting == "num_workers" and workers.current == 0
    assert workers.suggested > 2  # waiting workers cost no CPU: more than the 2 cores


def test_slow_first_epoch_without_sampler():
    # epoch 1 (steps 1..19) waits 8 ms per step, later epochs 1 ms: the page cache took over
    added = {index: {"data_wait": 0.008} for index in range(1, 20)}
    record = make_record(steps=60, shares={"data_wait": 0.3, "forward": 0.4, "backward": 0.2}, added=added,
                         num_workers=0, loader_init={20: 0.0001, 40: 0.0001})
    assert ctx_of(record).storage.first_epoch_ratio > 2
    finding = loader_waits_on_io(ctx_of(record))
    assert finding is not None
    assert any(item.metric == "first_epoch_wait_ratio" for item in finding.evidence)
    assert any("Stage the dataset" in item.action for item in finding.prescriptions)


def test_idle_looking_loader_on_a_saturated_machine_is_not_conclusive():
    # every core busy (other processes): the loader may be starved, not waiting on I/O
    record = make_record(shares=INPUT, num_workers=0)
    signals = dict(cpu_count=2, main_cpu_util=0.3, cpu_util_mean=0.99)
    assert loader_waits_on_io(ctx_of(record, signals)) is None
    from stepscope.diagnosis.rules.input_pipeline import loader_cpu_bound

    finding = loader_cpu_bound(ctx_of(record, signals))
    assert finding is not None and finding.confidence < 0.7


def _with_loading_cpu(record, cpu_share: float):
    """The record with the training thread's CPU inside next() at ``cpu_share`` of the data wait."""
    from dataclasses import replace

    import numpy as np

    from stepscope.record.run import StepTable

    columns = record.steps.columns()
    columns["data_wait_cpu_ns"] = np.round(columns["data_wait_ns"] * cpu_share).astype(np.int64)
    return replace(record, steps=StepTable.from_columns(columns))


@pytest.mark.parametrize("cpu_share, storage, cpu_bound", [(0.05, True, False), (0.97, False, True)])
def test_capture_measured_loading_cpu_decides_between_storage_and_cpu(cpu_share, storage, cpu_bound):
    from stepscope.diagnosis.rules.input_pipeline import loader_cpu_bound

    record = _with_loading_cpu(make_record(shares=INPUT, num_workers=0), cpu_share)
    # the sampler sees a busy main process (OpenMP threads spinning): capture's thread CPU wins
    context = ctx_of(record, dict(cpu_count=2, main_cpu_util=0.9, cpu_util_mean=0.5))
    assert (loader_waits_on_io(context) is not None) == storage
    assert (loader_cpu_bound(context) is not None) == cpu_bound


def test_a_saturated_machine_with_only_page_cache_warming_is_not_called_storage_bound():
    """All cores busy (a crowded machine): the loader's low CPU may be starvation, and reads high
    early / low late also fit a script importing its libraries — not enough to say "storage"."""
    from stepscope.diagnosis.engine import run_rules

    shares = {"data_wait": 0.9, "forward": 0.05, "backward": 0.03}
    record = make_record(shares=shares, num_workers=0)
    signals = dict(cpu_count=2, cpu_util_mean=0.99, main_cpu_util=0.45, page_cache_warming=True, iowait_share=0.0)
    assert loader_waits_on_io(ctx_of(record, signals)) is None
    families = [item.family for item in run_rules(ctx_of(record, signals)).findings]
    assert "input_pipeline" in families and "storage_io" not in families


@pytest.mark.parametrize("runnable, conclusive", [(0.2, True), (0.9, False), (None, False)])
def test_workers_blocked_rather_than_runnable_make_an_idle_loader_conclusive_on_busy_cores(runnable, conclusive):
    """All cores busy (the model's threads): workers using little CPU may be starved — unless their
    scheduler states show them blocked (reading, sleeping on a source), not runnable."""
    from stepscope.diagnosis.rules.input_pipeline import loader_cpu_bound

    record = make_record(shares=INPUT, num_workers=2)
    signals = dict(cpu_count=2, worker_cpu_util_mean=0.15, cpu_util_mean=0.99, loader_runnable_share=runnable)
    finding = loader_waits_on_io(ctx_of(record, signals))
    assert (finding is not None) == conclusive
    if conclusive:
        assert "blocked, not starved" in " ".join(item.scope for item in finding.evidence)
        assert "while the loaders are idle" in finding.title
    else:
        assert "not conclusive" in loader_cpu_bound(ctx_of(record, signals)).title + \
            loader_cpu_bound(ctx_of(record, signals)).summary
