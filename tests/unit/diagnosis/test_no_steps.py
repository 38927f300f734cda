"""A run without steps (or whose training ran in child processes) gets no share-of-step findings."""

from __future__ import annotations

from dataclasses import replace

from stepscope.diagnosis.engine import run_rules
from stepscope.diagnosis.findings import Severity
from stepscope.record.run import CaptureFacts, RunMeta, RunRecord, StepTable
from diagnosis_records import ctx_of, make_record

MiB = 2**20
#: Signals that make every sampler-based rule fire on a run with steps.
BUSY = dict(rss_growth_bytes_per_s=6 * MiB, memory_total_bytes=16 * 2**30, memory_used_share_max=0.5,
            cpu_count=2, cpu_util_mean=1.0, saturated_cores=2, runnable_threads_per_core=3.0, iowait_share=0.2,
            swap_in_bytes_per_s=4 * MiB)


def no_steps_record() -> RunRecord:
    return RunRecord(meta=RunMeta(target="launcher", cpu_count_logical=2), steps=StepTable.empty())


def test_a_run_without_steps_has_no_measured_findings_and_no_verdict():
    diagnosis = run_rules(ctx_of(no_steps_record(), BUSY))
    assert diagnosis.complete
    assert all(not item.impact_measured or item.impact == 0 for item in diagnosis.findings)
    assert not any(item.family == "healthy" for item in diagnosis.findings)


def test_memory_growth_without_steps_reports_its_rate_only():
    diagnosis = run_rules(ctx_of(no_steps_record(), dict(rss_growth_bytes_per_s=6 * MiB)))
    growth = [item for item in diagnosis.findings if item.rule_id == "memory_pressure.growing_memory"]
    assert len(growth) == 1
    assert growth[0].impact == 0 and growth[0].severity == Severity.LOW
    assert "6 MiB/s" in growth[0].title


def test_parent_steps_are_not_diagnosed_when_children_trained():
    record = make_record(shares={"data_wait": 0.44, "forward": 0.5})  # input-bound evaluation in the parent
    assert any(item.family == "input_pipeline" for item in run_rules(ctx_of(record)).findings)
    record = replace(record, facts=CaptureFacts(child_pids=(101, 102), children_cpu_s=8.0, main_cpu_s=2.0,
                                                training_in_children=True))
    findings = run_rules(ctx_of(record)).findings
    assert not any(item.impact_measured and item.impact > 0 for item in findings)
