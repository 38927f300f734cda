"""analyze_traces / TraceAnalysis / TraceEvidence, multi-rank comparison, findings through the engine."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stepscope.analysis.evidence import TraceEvidence
from stepscope.analysis.trace.stragglers import RankSummary, compare_ranks
from stepscope.analysis.trace.trace_evidence import analyze_traces
from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.engine import diagnose
from stepscope.diagnosis.findings import Evidence, Finding, Severity
from stepscope.errors import InputError, UsageError

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


def _rank_copy(tmp_path: Path, rank: int, name: str) -> Path:
    doc = json.loads(gzip.decompress((DATA / "cpu_train.pt.trace.json.gz").read_bytes()))
    doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": 2}
    out = tmp_path / name
    out.write_bytes(json.dumps(doc).encode())
    return out


def test_single_trace_evidence():
    analysis = analyze_traces(DATA / "cpu_train.pt.trace.json.gz")
    evidence = analysis.evidence()
    assert isinstance(evidence, TraceEvidence)
    assert evidence.steps == 4 and evidence.device is None
    assert 0 < evidence.shares.dataloader < 1 and evidence.device_use.utilization is None
    assert evidence.host.python is not None and evidence.step_time_s > 0
    doc = analysis.to_dict()
    json.dumps(doc)  # plain JSON types only
    assert doc["schema"] == "stepscope.analyze/1" and doc["ranks"][0]["overview"]["steps"]


def test_directory_of_ranks(tmp_path):
    _rank_copy(tmp_path, 1, "b.json")
    _rank_copy(tmp_path, 0, "a.json")
    analysis = analyze_traces(tmp_path)
    assert [r.rank for r in analysis.ranks] == [0, 1]
    assert all(r.rank_source == "distributedInfo" for r in analysis.ranks)
    assert len(analysis.comparison.ranks) == 2
    assert analysis.evidence(1).rank == 1
    with pytest.raises(UsageError):
        analysis.evidence(5)


def test_mismatched_ranks(tmp_path):
    _rank_copy(tmp_path, 0, "a.json")
    _rank_copy(tmp_path, 0, "b.json")
    with pytest.raises(InputError, match="also claimed"):
        analyze_traces(tmp_path)


def test_straggler_rule():
    summaries = [RankSummary(r, 1000.0, None, None, (10.0, 12.0, 11.0)) for r in range(3)]
    summaries.append(RankSummary(3, 1000.0, None, None, (200.0, 250.0, 11.0)))
    result = compare_ranks(summaries)
    assert result.stragglers == (3,) and result.flagged_steps == {3: 2}
    assert compare_ranks(summaries[:1]).stragglers == ()


def _dataloader_rule(context: RunEvidence):
    share = context.trace.shares.dataloader if context.trace else None
    if share is None or share <= 0.001:
        return None
    return Finding(
        rule_id="test.loader", family="input_pipeline", title="Loader-bound", severity=Severity.HIGH,
        impact=share, confidence=0.9, evidence=(Evidence("dataloader_share", share, 0.001, source="trace"),),
    )


def test_evidence_feeds_diagnosis_engine():
    analysis = analyze_traces(DATA / "cpu_train.pt.trace.json.gz")
    findings = diagnose(RunEvidence(trace=analysis.evidence()), rules=(_dataloader_rule,))
    assert [f.rule_id for f in findings] == ["test.loader"]
    assert findings[0].impact == pytest.approx(analysis.evidence().shares.dataloader)


def test_each_ranks_event_table_is_freed_when_its_analysis_returns(tmp_path, monkeypatch):
    """The table and the views cached on it form cycles: the analysis frees them itself (one
    collection of the youngest generation), before the next rank loads."""
    import gc
    import weakref

    from stepscope.analysis.trace import trace_evidence

    tables: list[weakref.ref] = []
    alive_at_next_load: list[bool] = []
    original = trace_evidence.load_trace

    def spy(*args, **kwargs):
        alive_at_next_load.extend(ref() is not None for ref in tables)
        trace = original(*args, **kwargs)
        tables.append(weakref.ref(trace.events))
        return trace

    monkeypatch.setattr(trace_evidence, "load_trace", spy)
    for rank in (0, 1):
        _rank_copy(tmp_path, rank, f"rank{rank}.json")
    assert gc.isenabled()
    analysis = analyze_traces(tmp_path, jobs=1)
    assert len(analysis.ranks) == 2 and len(tables) == 2
    assert alive_at_next_load == [False] and all(ref() is None for ref in tables)
    assert gc.isenabled()
