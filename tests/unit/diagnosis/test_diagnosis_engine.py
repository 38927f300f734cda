from __future__ import annotations

import numpy as np
import pytest

from diagnosis_records import ctx_of, make_record
from stepscope.diagnosis.context import build_context
from stepscope.diagnosis.engine import DiagnosisContext, diagnose
from stepscope.diagnosis.findings import FAMILIES, Finding, Severity
from stepscope.diagnosis.rules import RULES
from stepscope.diagnosis.rules.healthy import verdict

INPUT = {"data_wait": 0.6, "forward": 0.2, "backward": 0.12, "optimizer": 0.05}


def test_steady_state_excludes_warmup_and_counted_step():
    record = make_record(steps=10, extra={"flops": {"step_index": 4, "flops": 1}})
    stats = build_context(record).stats
    assert list(np.flatnonzero(~stats.mask)) == [0, 4]
    assert stats.warmup_steps == 1


def test_engine_exposes_the_builder():
    from stepscope.diagnosis import engine

    assert engine.build_context is build_context


def test_build_context_stats():
    ctx = build_context(make_record(steps=20, step_s=0.01, shares=INPUT))
    assert ctx.stats.steady_count == 19
    assert ctx.stats.data_wait_share == pytest.approx(0.6)
    assert ctx.stats.step_time_s == pytest.approx(0.01)


def test_diagnose_ranks_input_bound_run():
    ctx = ctx_of(make_record(shares=INPUT, num_workers=0), dict(cpu_count=2, main_cpu_util=1.0, cpu_util_mean=0.6))
    findings = diagnose(ctx)
    assert findings[0].family == "input_pipeline"
    assert all(item.family in FAMILIES for item in findings)
    assert findings == sorted(findings, key=lambda item: -item.impact)


def test_healthy_run_gets_the_verdict_first():
    record = make_record(extra={"flops": {"step_index": 3, "flops": 5e8}, "cpu_matmul_peak_flops": 1e11})
    findings = diagnose(ctx_of(record))
    assert findings[0].family == "healthy"
    assert findings[0].severity == Severity.INFO
    assert all(item.severity <= Severity.LOW for item in findings)


def test_no_verdict_when_a_real_finding_exists():
    findings = diagnose(ctx_of(make_record(shares=INPUT)))
    assert all(item.family != "healthy" for item in findings)


def test_broken_rule_does_not_hide_others():
    def broken(ctx):
        raise RuntimeError("bug")

    findings = diagnose(ctx_of(make_record(shares=INPUT)), rules=(broken, *RULES))
    assert findings[0].family == "input_pipeline"


def test_diagnose_computes_stats_when_absent():
    findings = diagnose(DiagnosisContext(record=make_record(shares=INPUT)))
    assert findings[0].family == "input_pipeline"


def test_empty_context_is_silent():
    assert diagnose(DiagnosisContext()) == []


def test_verdict_names_minor_findings():
    minor = Finding("x.y", "compute", "Something small", Severity.LOW, 0.02, 0.5)
    finding = verdict(ctx_of(make_record()), (minor,))
    assert "Something small" in finding.summary
    assert finding.family == "healthy"


def test_findings_round_trip_through_dict():
    ctx = ctx_of(make_record(shares=INPUT, num_workers=0), dict(cpu_count=2, main_cpu_util=1.0))
    for finding in diagnose(ctx):
        assert Finding.from_dict(finding.to_dict()) == finding
