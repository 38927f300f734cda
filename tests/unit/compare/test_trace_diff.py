"""Trace diff numbers equal HTA TraceDiff.compare_traces on HTA's reference trace pairs.

The small ``trace_compare`` pair is vendored (always tested); the A100/V100 ``trace_diff`` pair
(35 + 33 MB of JSON) is in the larger shared set and is tested when that set is present (marked
``reference_shared``, as the other shared-set tests).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from stepscope.analysis.trace.trace_diff import trace_diff
from stepscope.errors import UsageError
from stepscope.traces.load import load_trace
from support import REPO_ROOT

# as tests/unit/analysis/reference_traces.py finds the two sets
VENDORED = REPO_ROOT / "tests" / "data" / "traces" / "reference"
SHARED = Path(os.environ.get("STEPSCOPE_REFERENCE_TRACES") or REPO_ROOT.parent / "shared" / "traces")

PAIRS = {
    "trace_diff": ("hta/trace_diff/control/control.json.gz", "hta/trace_diff/test/test.json.gz"),
    "trace_compare": ("hta/trace_compare/base/base.json.gz", "hta/trace_compare/test/test.json.gz"),
}


def _root(pair: str) -> Path | None:
    for root in (VENDORED, SHARED):
        if all((root / rel).is_file() for rel in PAIRS[pair]) and (root / "expected" / f"{pair}.pair.hta.json").is_file():
            return root
    return None


def _pairs() -> list:
    out = []
    for pair in PAIRS:
        root = _root(pair)
        if root == VENDORED:
            out.append(pair)
        elif root is not None:
            out.append(pytest.param(pair, marks=pytest.mark.reference_shared, id=pair))
    return out


def _expected(pair: str, engine: str) -> dict[str, dict]:
    root = _root(pair)
    assert root is not None
    data = json.loads((root / "expected" / f"{pair}.pair.hta.json").read_text())
    rows = data["runs"][engine]["results"]["trace_diff.compare_traces"]["rows"]
    return {row["name"]: row for row in rows}


@functools.cache
def _diff(pair: str, **options):
    root = _root(pair)
    assert root is not None
    a, b = PAIRS[pair]
    return trace_diff(load_trace(root / a).events, load_trace(root / b).events, **options)


@pytest.mark.parametrize("engine", ["hta_pypi", "hta_head"])
@pytest.mark.parametrize("pair", _pairs())
def test_counts_and_durations_equal_hta(pair, engine):
    expected = _expected(pair, engine)
    got = {op.name: op for op in _diff(pair).ops}
    assert set(got) == set(expected)
    for name, row in expected.items():
        op = got[name]
        assert (op.count_a, op.total_us_a, op.count_b, op.total_us_b) == (
            row["Control_counts"], row["Control_total_duration"], row["Test_counts"], row["Test_total_duration"]), name
        assert op.diff_count == row["diff_counts"] and op.diff_us == row["diff_duration"]
        sign = "+" if op.diff_count > 0 else "-" if op.diff_count < 0 else "="
        assert sign == row["counts_change_categories"]


def test_categories_steps_and_order():
    diff = _diff("trace_compare")
    assert diff.iterations_a == (diff.iterations_a[0],) and diff.step_us_a and diff.step_us_b
    assert [op.diff_us for op in diff.ops] == sorted((op.diff_us for op in diff.ops), reverse=True)
    counts = diff.to_dict()["counts"]
    assert sum(counts.values()) == len(diff.ops) == len(_expected("trace_compare", "hta_pypi"))
    assert counts["added"] == sum(1 for op in diff.ops if op.count_a == 0)
    assert all(op.per_call_change is None or op.count_a and op.count_b for op in diff.ops)


@pytest.mark.parametrize("pair", _pairs())
def test_device_filter_and_bad_iterations(pair):
    gpu, cpu = _diff(pair, device="gpu"), _diff(pair, device="cpu")
    assert gpu.ops and cpu.ops and all(op.gpu for op in gpu.ops) and not any(op.gpu for op in cpu.ops)
    assert {op.name for op in _diff(pair).ops} == {op.name for op in (*gpu.ops, *cpu.ops)}
    root = _root(pair)
    a, b = (load_trace(root / rel).events for rel in PAIRS[pair])
    with pytest.raises(UsageError, match="not in the trace"):
        trace_diff(a, b, iterations_a=(99999,))
    with pytest.raises(UsageError, match="device"):
        trace_diff(a, b, device="tpu")
