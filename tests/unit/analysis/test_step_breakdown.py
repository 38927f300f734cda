"""The plugin's Overview (steps, category breakdown) and GPU summary metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from reference_traces import SKIP, analysis, close, kineto_trace_names, tb_overview
from trace_builders import kernel, op, runtime, table_of

from stepscope.analysis.trace.step_breakdown import CATEGORIES, find_steps, step_breakdown
from stepscope.traces.links import links_of

PLUGIN_NAMES = {"CPU Exec": "CpuOp"}
DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


@SKIP
@pytest.mark.parametrize("rel", kineto_trace_names())
def test_overview_matches_plugin(rel):
    ref = tb_overview(rel)
    ours = analysis(rel).steps
    assert ref is not None
    assert list(ours.step_names) == ref["steps_names"]
    for category in (*CATEGORIES, "Total"):
        assert close(ours.mean_us[category], ref["avg_costs_us"][PLUGIN_NAMES.get(category, category)], abs_tol=1.0), category
    for ours_step, ref_step in zip(ours.per_step_us, ref["step_costs_us"]):
        assert close(ours_step["Total"], ref_step["Total"], abs_tol=1.0)


@SKIP
@pytest.mark.parametrize("rel", kineto_trace_names())
def test_gpu_summary_matches_plugin(rel):
    ref = tb_overview(rel)
    summary = {item["title"]: item["value"] for item in ref.get("gpu_summary") or []}
    devices = analysis(rel).devices
    for title, attr in (("GPU Utilization", "utilization"), ("Est. SM Efficiency", "sm_efficiency"),
                        ("Est. Achieved Occupancy", "achieved_occupancy")):
        if title in summary:
            value = getattr(devices[0], attr)
            assert value is not None
            assert close(100 * value, float(summary[title].split()[0]), abs_tol=0.011), title
    if ref.get("tc_used_ratio") is not None and devices:
        assert close(devices[0].tc_share_plugin, ref["tc_used_ratio"], abs_tol=1e-4)


def _step(n, ts, dur):
    return op(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")


def test_priority_and_device_retiming():
    events = [
        _step(1, 0, 100),
        op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 30, cat="user_annotation"),
        op("aten::mm", 40, 20, external_id=5),
        runtime("cudaLaunchKernel", 45, 5, correlation=1, external_id=5),
        kernel("gemm", 50, 80, correlation=1),  # runs past the host step end: step ends at 130
        _step(2, 100, 50),
        op("aten::relu", 110, 10, external_id=6),
        runtime("cudaLaunchKernel", 112, 3, correlation=2, external_id=6),
        kernel("relu", 140, 5, correlation=2),
    ]
    table = table_of(*events)
    steps = find_steps(links_of(table))
    assert steps.start.tolist() == [0, 130] and steps.end.tolist() == [130, 150]
    result = step_breakdown(links_of(table), steps)
    first = result.per_step_us[0]
    assert first["Kernel"] == 80 and first["DataLoader"] == 30 and first["Runtime"] == 5
    assert first["CPU Exec"] == 5  # aten::mm 40-60 minus its runtime call (45-50) and the kernel (from 50)
    assert sum(first[c] for c in CATEGORIES) == pytest.approx(first["Total"])


def test_cpu_trace_without_steps_has_one_synthetic_step():
    from stepscope.traces.load import load_trace

    trace = load_trace(DATA / "cpu_plain.pt.trace.json")
    steps = find_steps(links_of(trace.events))
    assert steps.synthetic and steps.names == ("0",)
    result = step_breakdown(links_of(trace.events), steps)
    assert result.share("CPU Exec") > 0.5
    assert "no ProfilerStep" in result.notes[0]


def test_recorded_cpu_training_trace():
    from stepscope.analysis.trace.rank_analysis import analyze_rank
    from stepscope.traces.load import load_trace

    item = analyze_rank(load_trace(DATA / "cpu_train.pt.trace.json.gz"))
    assert len(item.steps.step_names) == 4
    for step in item.steps.per_step_us:
        assert sum(step[c] for c in CATEGORIES) == pytest.approx(step["Total"], rel=1e-9)
        assert step["DataLoader"] > 0 and step["CPU Exec"] > 0 and step["Kernel"] == 0
    assert item.temporal is None and item.devices == ()


def test_steps_out_of_order_follow_the_plugin_walk():
    # file order 2, 1 with overlapping spans: the plugin's walk over runtimes and steps decides
    events = [
        _step(2, 100, 100),
        _step(1, 0, 120),
        runtime("cudaLaunchKernel", 10, 5, correlation=1), kernel("a", 20, 30, correlation=1),
        runtime("cudaLaunchKernel", 110, 5, correlation=2), kernel("b", 130, 100, correlation=2),
        runtime("cudaLaunchKernel", 150, 5, correlation=3), kernel("c", 240, 10, correlation=3),
    ]
    steps = find_steps(links_of(table_of(*events)))
    assert steps.names == ("2",) and steps.device_ops == (2, 0) and steps.removed_tail == 1
    assert steps.start.tolist() == [100.0] and steps.end.tolist() == [250.0]
