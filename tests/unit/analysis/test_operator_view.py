"""The plugin's Operator and Kernel views."""

from __future__ import annotations

from pathlib import Path

import pytest
from reference_traces import SKIP, analysis, close, kineto_trace_names, tb_overview
from trace_builders import kernel, op, runtime, table_of

from stepscope.analysis.trace.op_tree import build_op_tree
from stepscope.analysis.trace.operators import operator_table
from stepscope.traces.links import links_of

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
# Known differences, kept measured: (trace, operator) -> (field, max relative difference, why)
KNOWN = {
    ("hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", "aten::_foreach_add_"): (
        "host_self_us", 0.08, "float-ns trace: the plugin attributes runtime calls differently around rounding overlaps"),
    ("hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", "aten::_foreach_mul_"): (
        "host_self_us", 0.08, "same as above"),
}


@SKIP
@pytest.mark.parametrize("rel", kineto_trace_names())
def test_operator_table_matches_plugin(rel):
    ref = tb_overview(rel)
    rows = {r.name: r for r in analysis(rel).operators.rows}
    for expected in ref["operator_table_top25"]:
        ours = rows[expected["name"]]
        assert ours.calls == expected["calls"]
        known = KNOWN.get((rel, expected["name"]))
        for field in ("device_self_us", "device_total_us", "host_self_us", "host_total_us"):
            tolerance = known[1] if known and known[0] == field else 0.01
            assert close(getattr(ours, field), expected[field], rel_tol=tolerance, abs_tol=1.0), (field, expected)
        assert ours.tc_eligible == expected["tc_eligible"]


@SKIP
@pytest.mark.parametrize("rel", kineto_trace_names())
def test_kernel_table_matches_plugin(rel):
    ref = tb_overview(rel)
    rows = {r.name: r for r in analysis(rel).kernels.rows}
    if ref.get("n_distinct_kernels") is not None:
        assert len(rows) == ref["n_distinct_kernels"]
    for expected in ref.get("kernel_table_top25") or []:
        ours = rows[expected["name"]]
        assert ours.calls == expected["count"]
        for field, key in (("total_us", "sum"), ("max_us", "max"), ("min_us", "min"), ("mean_us", "mean"),
                           ("blocks_per_sm", "blocks_per_sm"), ("occupancy_pct", "occupancy")):
            assert close(getattr(ours, field), expected[key], abs_tol=0.01), (field, expected["name"])


def test_self_and_total_times_hand_made():
    events = [
        op("aten::linear", 0, 100, external_id=1),
        op("aten::addmm", 10, 50, external_id=2),
        runtime("cudaLaunchKernel", 20, 10, correlation=7, external_id=2),
        kernel("gemm", 40, 30, correlation=7, **{"External id": 2}),
        op("aten::div", 70, 20, external_id=3),
        op("aten::div", 72, 10, external_id=4),  # redispatch: folded into the outer aten::div
    ]
    table = table_of(*events)
    links = links_of(table)
    result = {r.name: r for r in operator_table(links, build_op_tree(links)).rows}
    assert result["aten::linear"].host_self_us == 100 - 50 - 20
    assert result["aten::addmm"].host_self_us == 50 - 10
    assert result["aten::addmm"].device_self_us == 30
    assert result["aten::linear"].device_total_us == 30 and result["aten::linear"].device_self_us == 0
    assert result["aten::div"].calls == 1 and result["aten::div"].host_self_us == 20
    assert result["aten::addmm"].tc_eligible


def test_group_by_shape_on_recorded_trace():
    from stepscope.analysis.trace.rank_analysis import analyze_rank
    from stepscope.traces.load import load_trace

    trace = load_trace(DATA / "cpu_train.pt.trace.json.gz")
    by_name = analyze_rank(trace).operators
    by_shape = analyze_rank(trace, group_by_shape=True).operators
    assert by_shape.grouped_by_shape and len(by_shape.rows) > len(by_name.rows)
    mm = [r for r in by_shape.rows if r.name == "aten::addmm"]
    assert all(r.input_shape and r.input_shape.startswith("[[") for r in mm)
    assert sum(r.calls for r in mm) == next(r.calls for r in by_name.rows if r.name == "aten::addmm")
    for row in by_name.rows:
        assert row.host_self_us <= row.host_total_us + 1e-6
    # with_stack=True: stacks come from the python_function frames around the first call
    addmm = next(r for r in by_name.rows if r.name == "aten::addmm")
    assert addmm.call_stack and "record.py" in addmm.call_stack and ";" in addmm.call_stack
