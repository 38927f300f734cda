from __future__ import annotations

import pytest

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
    # below XProf's moderate level
    (dict(shares={"data_wait": 0.03, "forward": 0.6, "backward": 0.3}), dict(cpu_count=2, main_cpu_util=1.0), False),
    # oversubscribed CPU: that rule speaks instead
    (dict(shares=INPUT, num_workers=4), dict(cpu_count=2, cpu_util_mean=0.99, runnable_threads_per_core=6.0,
                                             worker_cpu_util_mean=0.5, workers=workers(4, 0.5)), False),
])
def test_loader_cpu_bound(record_kwargs, signals, fires):
    finding = loader_cpu_bound(ctx_of(make_record(**record_kwargs), signals))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "input_pipeline"
        assert finding.impact == pytest.approx(0.6, abs=0.05)
        assert finding.severity.name == "CRITICAL"


def test_prescribes_workers_from_cores_and_times():
    record = make_record(shares=INPUT, num_workers=0, cpu_count=2, intra_op_threads=2)
    finding = loader_cpu_bound(ctx_of(record, dict(cpu_count=2, main_cpu_util=1.0, cpu_util_mean=0.55)))
    first = finding.prescriptions[0]
    assert (first.setting, first.current, first.suggested) == ("num_workers", 0, 2)
    assert "2 cores" in first.why
    assert finding.confidence > 0.8
    # 2 intra-op threads + 2 workers on 2 cores: also lower the intra-op threads
    assert any(item.setting == "intra_op_threads" for item in finding.prescriptions)


def test_all_cores_loading_prescribes_cheaper_samples_not_workers():
    record = make_record(shares=INPUT, num_workers=2, cpu_count=2)
    finding = loader_cpu_bound(ctx_of(record, dict(cpu_count=2, worker_cpu_util_mean=0.98,
                                                   workers=workers(2, 0.98), cpu_util_mean=0.8)))
    assert finding is not None
    assert all(item.setting != "num_workers" for item in finding.prescriptions)
    assert "cheaper" in finding.prescriptions[0].action


@pytest.mark.parametrize("share, fires", [(0.3, True), (0.02, False), (None, False)])
def test_bare_trace_uses_the_dataloader_share(share, fires):
    finding = loader_cpu_bound(ctx_of(None, trace=dict(dataloader_share=share)))
    assert (finding is not None) == fires
