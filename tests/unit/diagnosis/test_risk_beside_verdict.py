"""A risk (memory running out) stands beside the speed verdict: the top finding says why the run is
slow; what may end it is a line of its own — unless nothing is slow, when it comes first."""

from __future__ import annotations

from diagnosis_records import ctx_of, make_record
from records import summary_text
from stepscope.diagnosis.engine import Diagnosis, rank_findings, risk_of, run_rules
from stepscope.diagnosis.findings import Finding, Severity
from stepscope.record.run import RunMeta, RunRecord, StepTable
from stepscope.analysis.bundle import RunEvidence
from stepscope.report.model import Report

MiB = 2**20
#: a heap growing 100 MiB/s with 8 GiB left: memory runs out in ~1.4 min
LEAK = dict(rss_growth_bytes_per_s=100 * MiB, memory_total_bytes=16 * 2**30, memory_used_share_max=0.5)


def test_a_slow_input_pipeline_is_the_verdict_and_the_leak_its_risk():
    record = make_record(step_s=0.1, shares={"data_wait": 0.6, "forward": 0.2, "backward": 0.1})
    findings = run_rules(ctx_of(record, LEAK)).findings
    families = [item.family for item in findings]
    assert families[0] == "input_pipeline", families
    leak = next(item for item in findings if item.family == "memory_pressure")
    assert leak.severity >= Severity.HIGH and leak.extra["urgent"]
    assert risk_of(findings) is leak
    assert "memory runs out in ~1 min" == leak.extra["risk"]


def test_with_nothing_slow_the_risk_comes_first_then_the_healthy_verdict():
    record = make_record(step_s=0.1, shares={"data_wait": 0.01, "forward": 0.6, "backward": 0.35})
    findings = run_rules(ctx_of(record, LEAK)).findings
    assert [item.family for item in findings[:2]] == ["memory_pressure", "healthy"]
    assert risk_of(findings) is None  # it is the verdict: no second line


def _finding(rule_id: str, impact: float, basis: str = "measured", **extra) -> Finding:
    family = rule_id.split(".")[0]
    return Finding(rule_id, family, f"title of {rule_id}", Severity.HIGH, impact=impact, confidence=0.8,
                   impact_basis=basis, extra=extra)


def test_a_risk_ranks_below_every_estimate_of_step_time_and_above_small_measured_costs():
    leak = _finding("memory_pressure.growing_memory", 0.5, "estimate: memory runs out", urgent=True,
                    risk="memory runs out in ~3 min")
    estimate = _finding("compute.low_mfu", 0.1, "estimate: a model")
    small = _finding("garbage_collection.collector_pauses", 0.02)
    large = _finding("input_pipeline.loader_cpu_bound", 0.2)
    assert rank_findings([leak, small, estimate, large]) == [large, estimate, leak, small]


def test_the_report_shows_the_risk_on_its_own_line_and_in_json():
    speed = _finding("input_pipeline.loader_cpu_bound", 0.4)
    leak = _finding("memory_pressure.growing_memory", 0.5, "estimate", urgent=True, risk="memory runs out in ~3 min")
    meta = RunMeta(target="train.py", start_ns=0, end_ns=10**9, exit_code=0)
    report = Report(source="run", focus_rank=0, evidence=RunEvidence(record=RunRecord(meta=meta, steps=StepTable.empty())),
                    diagnosis=Diagnosis((speed, leak)), findings=(speed, leak), meta=meta)
    assert report.risk is not None and report.risk.finding == 2
    text = summary_text(report, width=200)
    assert "Risk: memory runs out in ~3 min (finding 2: title of memory_pressure.growing_memory)" in text
    assert text.index("title of input_pipeline") < text.index("Risk:")
    assert report.to_dict()["risk"] == {"what": "memory runs out in ~3 min", "finding": 2,
                                        "rule_id": "memory_pressure.growing_memory",
                                        "title": "title of memory_pressure.growing_memory"}
