from __future__ import annotations

import pytest

from stepscope.analysis.evidence import StepShares

from diagnosis_records import ctx_of, make_record, workers
from stepscope.diagnosis.rules.input_pipeline import loader_cpu_bound

INPUT = {"data_wait": 0.6, "forward": 0.2, "backward": 0.12, "optimizer": 0.05}


@pytest.mark.parametrize("record_kwargs, signals, fires", [
    # main process loads (num_workers=0) and is busy: CPU-bound
    (dict(shares=INPUT, num_workers=0), dict(cpu_count=2, main_cpu_util=1.0, cpu_util_mean=0.55), True),
    # workers saturated on CPU
    (dict(shares=INPUT, num_workers=1), dict(cpu_count=2, worker_cpu_util_mean=0.97, cpu_util_mean=0.7), True),
    # no sampler evidence: still reported (lower confidence)
    (dict(shares=INPUT, num_workers=0), None, True),
    # waiting, but the loading process is idle: storage/latency, not this rule
    (dict(shares=INPUT, num_workers=0), dict(cpu_count=2, main_cpu_util=0.3, cpu_util_mean=0.15), False),
    # well below XProf's moderate level (the near-threshold band starts at 3 %)
    (dict(shares={"data_wait": 0.02, "forward": 0.6, "backward": 0.3}), dict(cpu_count=2, main_cpu_util=1.0), False),
])
def test_loader_cpu_bound(record_kwargs, signals, fires):
    finding = loader_cpu_bound(ctx_of(make_record(**record_kwargs), signals))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "input_pipeline"
        assert finding.impact == pytest.approx(0.6, abs=0.05)
        assert finding.severity.name == "CRITICAL"


def test_prescribes_workers_priced_against_the_cores_the_model_uses():
    # 2 intra-op threads and no measurement of the model's cores: assume it uses both. Workers
    # alone would fight its threads for the 2 cores (no gain); workers with one intra-op thread in
    # the training process are the pair that helps, and the gain is stated as the calibrated range
    record = make_record(shares=INPUT, num_workers=0, cpu_count=2, intra_op_threads=2)
    finding = loader_cpu_bound(ctx_of(record, dict(cpu_count=2, main_cpu_util=1.0, cpu_util_mean=0.55)))
    first = finding.prescriptions[0]
    assert (first.setting, first.current) == ("num_workers", 0)
    assert first.set == {"dataloader.num_workers": first.suggested, "torch.num_threads": 1}
    assert "torch.set_num_threads(1)" in first.action and "workers alone would gain ~0.0%" in first.why
    low, high = first.expected_range
    assert low < first.expected_gain < high and 0.1 <= first.expected_gain <= 0.4
    assert "assumed" in first.cost
    assert finding.confidence > 0.8


def test_workers_hide_loading_when_the_model_leaves_cores_free():
    # 4 cores, workers measured: the main process uses one core while not waiting
    record = make_record(shares=INPUT, num_workers=1, cpu_count=4, intra_op_threads=1)
    signals = dict(cpu_count=4, main_cpu_util=0.4, worker_cpu_util_mean=0.97, cpu_util_mean=0.4,
                   workers=workers(1, 0.97))
    finding = loader_cpu_bound(ctx_of(record, signals))
    first = finding.prescriptions[0]
    assert first.setting == "num_workers" and first.suggested >= 3
    assert first.expected_gain > 0.3


def test_no_workers_for_a_model_that_uses_every_core():
    # data wait 8 %: loading is light, the model keeps both cores busy (measured by capture)
    shares = {"data_wait": 0.08, "forward": 0.5, "backward": 0.35, "optimizer": 0.05}
    record = make_record(shares=shares, num_workers=0, cpu_count=2, intra_op_threads=2)
    columns = record.steps.columns()
    columns["data_wait_cpu_ns"] = columns["data_wait_ns"]  # loading is pure CPU
    from dataclasses import replace

    from stepscope.record.run import StepTable

    record = replace(record, steps=StepTable.from_columns(columns))
    finding = loader_cpu_bound(ctx_of(record, dict(cpu_count=2, main_cpu_util=1.9, cpu_util_mean=0.97)))
    assert finding is not None
    assert all(item.setting not in ("num_workers", "intra_op_threads") for item in finding.prescriptions)
    assert "cheaper" in finding.prescriptions[0].action and "GPU" not in finding.prescriptions[0].action


@pytest.mark.parametrize("wait", [0.035, 0.045, 0.055, 0.07])
def test_near_the_threshold_is_reported_as_minor(wait):
    shares = {"data_wait": wait, "forward": 0.5, "backward": 0.35, "optimizer": 0.05}
    finding = loader_cpu_bound(ctx_of(make_record(shares=shares, num_workers=0),
                                      dict(cpu_count=2, main_cpu_util=1.0)))
    assert finding is not None and finding.severity.name == "LOW"
    assert all(item.setting not in ("num_workers", "intra_op_threads") for item in finding.prescriptions)


def test_all_cores_loading_prescribes_cheaper_samples_not_workers():
    record = make_record(shares=INPUT, num_workers=2, cpu_count=2)
    finding = loader_cpu_bound(ctx_of(record, dict(cpu_count=2, worker_cpu_util_mean=0.98,
                                                   workers=workers(2, 0.98), cpu_util_mean=0.8)))
    assert finding is not None
    assert all(item.setting != "num_workers" for item in finding.prescriptions)
    assert "cheaper" in finding.prescriptions[0].action


@pytest.mark.parametrize("share, fires", [(0.3, True), (0.02, False), (None, False)])
def test_bare_trace_uses_the_dataloader_share(share, fires):
    finding = loader_cpu_bound(ctx_of(None, trace=dict(shares=StepShares(dataloader=share))))
    assert (finding is not None) == fires


def test_a_record_claiming_an_absurd_core_count_gets_a_plan_at_once():
    """A corrupt or hostile record's cpu count (2**70) bounds the worker search at MAX_PLANNED_CORES
    instead of hanging `stepscope report` (found by the record fuzz test)."""
    import time

    from stepscope.diagnosis.rules.input_pipeline import MAX_PLANNED_CORES, LoadingModel, plan_workers

    model = LoadingModel(per_batch_s=0.04, wait_s=0.03, compute_s=0.01, load_cpu_s=0.03, cores=float(2**70),
                         compute_cores=1.0, compute_cores_measured=True, threads=1, workers=0)
    started = time.perf_counter()
    plan = plan_workers(model)
    assert time.perf_counter() - started < 5.0
    assert 1 <= plan.workers <= MAX_PLANNED_CORES


def test_keeping_restarted_workers_states_one_gain_with_its_measured_error_in_both_findings():
    # workers saturated on costly samples, and started anew every 4 steps: 10 ms in __iter__, then 20 ms
    # more for the first batch the new workers owe. The input finding and the epoch-boundary finding
    # both prescribe persistent_workers, at the same gain: the epoch starts' whole excess wait
    from dataclasses import replace

    from stepscope.diagnosis.engine import run_rules
    from stepscope.diagnosis.rules._common import GAIN_ERROR

    shares = {"data_wait": 0.15, "forward": 0.4, "backward": 0.25, "optimizer": 0.05}
    starts = range(0, 40, 4)
    record = make_record(shares=shares, num_workers=2, cpu_count=2, loader_init={i: 0.01 for i in starts},
                         added={i: {"data_wait": 0.02} for i in starts})
    record = replace(record, loaders=(replace(record.loaders[0], iterators=10, init_ns=int(10 * 0.01e9)),))
    signals = dict(cpu_count=2, worker_cpu_util_mean=0.97, cpu_util_mean=0.98, workers=workers(2, 0.97))
    diagnosis = run_rules(ctx_of(record, signals))
    findings = [*diagnosis.findings, *(item for item, _ in diagnosis.superseded)]
    kept = [(finding.rule_id, item) for finding in findings for item in finding.prescriptions
            if item.setting == "persistent_workers" and item.expected_gain is not None]
    assert {rule for rule, _ in kept} == {"input_pipeline.loader_cpu_bound", "epoch_boundary.worker_startup"}
    gains = {item.expected_gain for _, item in kept}
    steady = ctx_of(record, signals).steady
    assert len(gains) == 1 and gains.pop() > 2 * steady.loader_init_share  # not __iter__'s time alone
    over, under = GAIN_ERROR["restarts"]
    for _, item in kept:
        assert item.expected_range == pytest.approx((max(-1.0, item.expected_gain - over),
                                                     min(0.99, item.expected_gain + under)), abs=1e-4)
