"""Trace diff numbers equal HTA TraceDiff.compare_traces on HTA's reference trace pairs."""

from __future__ import annotations

import json

import pytest

from stepscope.analysis.trace.trace_diff import trace_diff
from stepscope.errors import UsageError
from stepscope.traces.load import load_trace
from support import SHARED_DIR

TRACES = SHARED_DIR / "traces"
PAIRS = {
    "trace_diff": ("hta/trace_diff/control/control.json.gz", "hta/trace_diff/test/test.json.gz"),
    "trace_compare": ("hta/trace_compare/base/base.json.gz", "hta/trace_compare/test/test.json.gz"),
}


def _expected(pair: str, engine: str) -> dict[str, dict]:
    data = json.loads((TRACES / "expected" / f"{pair}.pair.hta.json").read_text())
    rows = data["runs"][engine]["results"]["trace_diff.compare_traces"]["rows"]
    return {row["name"]: row for row in rows}


@pytest.fixture(scope="module")
def diffs():
    if not TRACES.is_dir():
        pytest.skip("the shared reference traces are not here")
    out = {}
    for pair, (a, b) in PAIRS.items():
        out[pair] = trace_diff(load_trace(TRACES / a).events, load_trace(TRACES / b).events)
    return out


@pytest.mark.parametrize("engine", ["hta_pypi", "hta_head"])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_counts_and_durations_equal_hta(diffs, pair, engine):
    expected = _expected(pair, engine)
    got = {op.name: op for op in diffs[pair].ops}
    assert set(got) == set(expected)
    for name, row in expected.items():
        op = got[name]
        assert (op.count_a, op.total_us_a, op.count_b, op.total_us_b) == (
            row["Control_counts"], row["Control_total_duration"], row["Test_counts"], row["Test_total_duration"]), name
        assert op.diff_count == row["diff_counts"] and op.diff_us == row["diff_duration"]
        sign = "+" if op.diff_count > 0 else "-" if op.diff_count < 0 else "="
        assert sign == row["counts_change_categories"]


def test_categories_steps_and_order(diffs):
    diff = diffs["trace_diff"]
    assert diff.iterations_a == (diff.iterations_a[0],) and diff.step_us_a and diff.step_us_b
    assert [op.diff_us for op in diff.ops] == sorted((op.diff_us for op in diff.ops), reverse=True)
    counts = diff.to_dict()["counts"]
    assert sum(counts.values()) == len(diff.ops) == 432
    assert counts["added"] == sum(1 for op in diff.ops if op.count_a == 0)
    assert all(op.per_call_change is None or op.count_a and op.count_b for op in diff.ops)


def test_device_filter_and_bad_iterations():
    a = load_trace(TRACES / PAIRS["trace_diff"][0]).events
    b = load_trace(TRACES / PAIRS["trace_diff"][1]).events
    gpu = trace_diff(a, b, device="gpu")
    cpu = trace_diff(a, b, device="cpu")
    assert gpu.ops and cpu.ops and all(op.gpu for op in gpu.ops) and not any(op.gpu for op in cpu.ops)
    with pytest.raises(UsageError, match="not in the trace"):
        trace_diff(a, b, iterations_a=(1,))
    with pytest.raises(UsageError, match="device"):
        trace_diff(a, b, device="tpu")
