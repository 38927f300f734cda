"""The summary for loop shapes other than DataLoader + optimizer: ranks, unmeasured phases, no steps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from records import make_record, summary_text
from records import report_of as build_report
from stepscope.analysis.run.steady import steady_state
from stepscope.record.run import CaptureFacts, RunMeta, RunRecord, StepTable


def render_text(report) -> str:
    return summary_text(report, width=200)


def manual_sgd_record(count: int = 20) -> RunRecord:
    """Forward, backward and a hand-written update; no DataLoader, no optimizer."""
    columns = {
        "start_ns": 10_000 + np.arange(count, dtype=np.int64) * 1000,
        "duration_ns": np.full(count, 1000), "forward_ns": np.full(count, 400),
        "backward_ns": np.full(count, 500), "other_ns": np.full(count, 100),
    }
    return RunRecord(meta=RunMeta(target="main.py", step_source="backward"), steps=StepTable.from_columns(columns))


def test_the_header_names_the_rank_of_a_multi_rank_run():
    record = make_record(20)
    record = replace(record, meta=replace(record.meta, rank=1, world_size=2))
    assert "rank 1 of 2" in render_text(build_report(record))
    assert "rank 0 of" not in render_text(build_report(make_record(20)))


def test_phases_not_measured_read_a_dash_not_zero():
    record = manual_sgd_record()
    state = steady_state(record)
    assert state is not None and state.measured_phases == ("forward", "backward", "other")
    text = render_text(build_report(record))
    assert "data wait –" in text and "optimizer –" in text
    assert "forward 40.0%" in text and "backward 50.0%" in text
    assert "one per backward()" in text
    assert "data wait 0.0%" not in text and "optimizer 0.0%" not in text


def test_a_run_without_steps_says_how_to_mark_a_step_and_shows_no_phases():
    report = build_report(RunRecord(meta=RunMeta(target="loop.py"), steps=StepTable.empty()))
    text = render_text(report)
    assert "session.step()" in text and "stepscope.profile()" in text
    assert "wait 0.0%" not in text and "Phases" not in text  # nothing measured: no phase row
    assert report.to_dict()["summary"]["measured_phases"] == []


def test_inference_is_said():
    record = manual_sgd_record()
    record = replace(record, meta=replace(record.meta, step_source="forward"),
                     facts=CaptureFacts(inference=True, model_forwards=20, model_forwards_no_grad=20))
    text = render_text(build_report(record))
    assert "inference" in text and "one per model forward" in text
    assert build_report(record).to_dict()["summary"]["inference"] is True


def test_the_batch_size_shown_is_the_mode_not_the_largest_step():
    record = make_record(20)
    samples = record.steps.samples.copy()
    samples[5] = 16  # an extra next(iter(loader)) in one step
    record = replace(record, steps=replace(record.steps, samples=samples))
    text = render_text(build_report(record))
    assert "batch 8" in text and "batch 16" not in text


def test_training_in_children_is_said_instead_of_diagnosing_the_parent():
    record = make_record(20)
    record = replace(record, facts=CaptureFacts(child_pids=(7, 8), children_cpu_s=9.0, main_cpu_s=1.0,
                                                training_in_children=True),
                     warnings=("the training ran in 2 child process(es) the script started",))
    report = build_report(record)
    assert not any(item.impact_measured and item.impact > 0 for item in report.findings)
    assert report.to_dict()["summary"]["training_in_children"] is True
    text = render_text(report)
    assert "training ran in 2 child process" in text
    if not report.findings:
        assert "not diagnosed: the training ran in child processes" in text
