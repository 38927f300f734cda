"""HTA idle-time breakdown per stream: reference traces and an exact hand-made case."""

from __future__ import annotations

import pytest
from reference_traces import SKIP, close, hta_results, kineto_trace_names, loaded
from trace_builders import kernel, runtime, table_of

from stepscope.analysis.trace.idle_time import idle_time_breakdown
from stepscope.traces.links import links_of


@SKIP
@pytest.mark.parametrize("rel", kineto_trace_names())
def test_idle_time_matches_hta(rel):
    results, errors = hta_results(rel)
    trace = loaded(rel)
    ours = idle_time_breakdown(links_of(trace.events), trace.rank)
    if "idle_time_breakdown" not in results:
        assert errors  # HTA failed (no GPU rows): we have no stream either
        assert ours.streams == ()
        return
    got = {(s.stream, c): (s.idle_us[c], s.ratio[c]) for s in ours.streams for c in s.idle_us}
    for row in results["idle_time_breakdown"]["by_stream"]:
        idle, ratio = got[(row["stream"], row["idle_category"])]
        assert close(idle, row["idle_time"], abs_tol=0.01), row
        if row["idle_time_ratio"] is None:
            assert ratio is None
        else:
            assert ratio == pytest.approx(row["idle_time_ratio"], abs=0.006)
    for row in results["idle_time_breakdown"]["interval_stats"]:
        stream = next(s for s in ours.streams if s.stream == row["stream"])
        stats = stream.interval_stats[row["idle_category"]]
        assert stats["count"] == row["count"]
        assert close(stats["mean"], row["mean"], abs_tol=0.01)


def test_idle_categories_hand_made():
    table = table_of(
        runtime("cudaLaunchKernel", 0, 2, correlation=1),
        kernel("k1", 5, 10, correlation=1),  # ends at 15
        runtime("cudaLaunchKernel", 1, 2, correlation=2),
        kernel("k2", 20, 10, correlation=2),  # gap 5, launched early -> kernel_wait
        runtime("cudaLaunchKernel", 3, 2, correlation=3),
        kernel("k3", 100, 10, correlation=3),  # gap 70, launched early -> other
        runtime("cudaLaunchKernel", 150, 2, correlation=4),
        kernel("k4", 160, 10, correlation=4),  # runtime at 150 > prev end 110 -> host_wait (gap 50)
    )
    result = idle_time_breakdown(links_of(table), 0)
    (stream,) = result.streams
    assert stream.idle_us == {"host_wait": 50.0, "kernel_wait": 5.0, "other": 70.0}
    assert stream.ratio["other"] == pytest.approx(70 / 125)
