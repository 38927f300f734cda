"""HTA CUDA launch statistics."""

from __future__ import annotations

import pytest
from reference_traces import SKIP, close, hta_results, kineto_trace_names, loaded
from trace_builders import kernel, runtime, table_of

from stepscope.analysis.trace.launch_stats import launch_stats
from stepscope.traces.links import links_of


@SKIP
@pytest.mark.parametrize("rel", kineto_trace_names())
def test_launch_stats_match_hta(rel):
    results, _ = hta_results(rel)
    trace = loaded(rel)
    ours = launch_stats(links_of(trace.events), trace.rank)
    ref = next(iter(results["cuda_kernel_launch_stats"].values()))
    summary = ours.summary()
    assert summary["count"] == ref["summary"]["n"]
    if not ours.count:
        return
    assert summary["short_gpu_kernels"] == ref["summary"]["n_short_gpu_kernels(gpu<cpu,cpu<=50us)"]
    assert summary["runtime_outliers"] == ref["summary"]["n_runtime_outliers(cpu>50us)"]
    assert summary["launch_delay_outliers"] == ref["summary"]["n_launch_delay_outliers(delay>100us)"]
    for ours_key, ref_key in (("cpu_duration_us", "cpu_duration"), ("gpu_duration_us", "gpu_duration"), ("launch_delay_us", "launch_delay")):
        assert close(summary[ours_key]["sum"], ref["summary"][ref_key]["sum"])
        assert close(summary[ours_key]["p50"], ref["summary"][ref_key]["p50"], abs_tol=1.0)
    # row by row, in correlation order
    columns = ref["rows"]["columns"]
    data = ref["rows"]["data"]
    assert [row[columns.index("correlation")] for row in data] == ours.correlation.tolist()


def test_launch_delay_hand_made():
    table = table_of(
        runtime("cudaLaunchKernel", 0, 4, correlation=1), kernel("k", 10, 2, correlation=1),
        runtime("cudaLaunchKernel", 20, 60, correlation=2), kernel("k", 50, 1, correlation=2),
        runtime("cuLaunchKernel", 100, 4, correlation=3), kernel("triton_k", 110, 2, correlation=3),
    )
    stats = launch_stats(links_of(table), 0)
    assert stats.correlation.tolist() == [1, 2]  # cuLaunchKernel is not counted (as in HTA)
    assert stats.launch_delay.tolist() == [6.0, 0.0]  # clipped at 0
    assert stats.summary()["runtime_outliers"] == 1
    assert stats.summary()["short_gpu_kernels"] == 1
