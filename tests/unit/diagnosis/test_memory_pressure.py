from __future__ import annotations

import pytest

from stepscope.analysis.evidence import DeviceMemoryUse

from diagnosis_records import ctx_of, make_record
from stepscope.diagnosis.findings import Severity
from stepscope.diagnosis.rules.memory_pressure import growing_memory, near_capacity, swapping

MiB = 2**20


@pytest.mark.parametrize("rule, signals, trace, fires", [
    (swapping, dict(swap_in_bytes_per_s=50 * MiB, iowait_share=0.3), None, True),
    (swapping, dict(swap_in_bytes_per_s=0.0, swap_out_bytes_per_s=1000.0), None, False),
    (growing_memory, dict(rss_growth_bytes_per_s=200 * MiB), None, True),
    (growing_memory, dict(rss_growth_bytes_per_s=0.2 * MiB), None, False),
    (growing_memory, dict(rss_growth_bytes_per_s=6 * MiB), None, False),  # 3.9 s × 6 MiB/s = 23 MiB: settling, not a leak
    (growing_memory, None, None, False),
    # a ramp that levels off (an allocator's or a cache's warm-up) is not a leak
    (growing_memory, dict(rss_growth_bytes_per_s=200 * MiB, rss_growth_first_half_bytes_per_s=380 * MiB,
                          rss_growth_second_half_bytes_per_s=1 * MiB), None, False),
    (growing_memory, dict(rss_growth_bytes_per_s=200 * MiB, rss_growth_first_half_bytes_per_s=210 * MiB,
                          rss_growth_second_half_bytes_per_s=190 * MiB, rss_growth_basis="anonymous"), None, True),
    (near_capacity, dict(memory_used_share_max=0.95), None, True),
    (near_capacity, None, dict(memory=DeviceMemoryUse(peak_bytes=75 * 2**30, capacity_bytes=80 * 2**30)), True),
    (near_capacity, dict(memory_used_share_max=0.5, gpu_memory_used_share_max=0.6), None, False),
])
def test_memory_rules(rule, signals, trace, fires):
    finding = rule(ctx_of(make_record(step_s=0.1), signals, trace))  # 3.9 s steady
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "memory_pressure"


def test_leak_exhausting_memory_soon_is_high():
    signals = dict(rss_growth_bytes_per_s=100 * MiB, memory_total_bytes=16 * 2**30, memory_used_share_max=0.5)
    finding = growing_memory(ctx_of(make_record(step_s=0.1), signals))
    assert finding.severity >= Severity.HIGH
    assert "runs out" in finding.title
