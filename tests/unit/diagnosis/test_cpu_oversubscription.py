from __future__ import annotations

import pytest

from conftest import make_record, workers
from stepscope.diagnosis.rules.cpu_oversubscription import oversubscribed_cpu

INPUT = {"data_wait": 0.5, "forward": 0.3, "backward": 0.15}


@pytest.mark.parametrize("signals, fires", [
    (dict(cpu_count=2, cpu_util_mean=0.99, runnable_threads_per_core=5.0), True),
    (dict(cpu_count=2, cpu_util_mean=0.98, workers=workers(4, 0.5, threads=4)), True),  # 2 + 16 threads
    (dict(cpu_count=2, cpu_util_mean=0.98, workers=workers(1, 0.9, threads=1)), False),  # 3 threads
    (dict(cpu_count=2, cpu_util_mean=0.4, runnable_threads_per_core=5.0), False),  # cores not busy
    (None, False),
])
def test_oversubscribed_cpu(ctx_of, signals, fires):
    finding = oversubscribed_cpu(ctx_of(make_record(shares=INPUT, num_workers=4), signals))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "cpu_oversubscription"
        assert finding.impact >= 0.5


def test_never_prescribes_more_workers(ctx_of):
    signals = dict(cpu_count=2, cpu_util_mean=0.99, workers=workers(4, 0.5, threads=4))
    finding = oversubscribed_cpu(ctx_of(make_record(shares=INPUT, num_workers=4), signals))
    for item in finding.prescriptions:
        if item.setting == "num_workers":
            assert item.suggested < item.current
        if item.setting == "worker_threads":
            assert item.suggested == 1
    assert any(item.setting == "num_workers" for item in finding.prescriptions)
