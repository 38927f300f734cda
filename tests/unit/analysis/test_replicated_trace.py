"""The big-trace path, scaled down: a trace replicated N times (as the benchmark builds its
500 MB input) decodes in many small chunks and gives N times the counts of the original."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from stepscope.analysis.trace.rank_analysis import analyze_rank
from stepscope.traces import decode
from stepscope.traces.load import load_trace

ROOT = Path(__file__).resolve().parents[3]
TRAIN = ROOT / "tests" / "data" / "traces" / "cpu_train.pt.trace.json.gz"


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_analyze", ROOT / "benchmarks" / "bench_analyze.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replicated_trace_scales_linearly(tmp_path, monkeypatch):
    bench = _bench_module()
    size = len(__import__("gzip").decompress(TRAIN.read_bytes()))
    # one copy of the events, written compact, is ~0.76 of the original's JSON: three copies reach 1.9 of it
    out = bench.make_synthetic(TRAIN, 1.9 * size / 1e6, tmp_path / "big.json")
    monkeypatch.setattr(decode, "CHUNK_BYTES", 32 * 1024)
    big = analyze_rank(load_trace(out))
    one = analyze_rank(load_trace(TRAIN))
    copies = len(big.steps.step_names) // len(one.steps.step_names)
    assert copies == 3 and len(big.steps.step_names) == 3 * len(one.steps.step_names)
    calls = {r.name: r.calls for r in one.operators.rows}
    for row in big.operators.rows[:20]:
        assert row.calls == copies * calls[row.name]
    assert big.steps.mean_us["Total"] == pytest.approx(one.steps.mean_us["Total"], rel=0.02)
