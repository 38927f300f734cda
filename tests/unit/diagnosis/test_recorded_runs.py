"""Recorded runs whose diagnosis once went wrong (``tests/data/runs/README.md``)."""

from __future__ import annotations

from pathlib import Path

from stepscope.pipeline.diagnose import diagnose
from stepscope.pipeline.inputs import load_run

RUNS = Path(__file__).resolve().parents[2] / "data" / "runs"


def test_starved_workers_on_a_saturated_run_queue_are_oversubscription_not_storage():
    run_dir = RUNS / "oversubscribed-mean-below-saturation"
    report = diagnose(load_run(run_dir))
    assert report.evidence.signals is not None and report.evidence.signals.cpu_util_mean < 0.85  # the mean alone says "not saturated"
    families = [finding.family for finding in report.findings]
    assert families[0] == "cpu_oversubscription", [finding.title for finding in report.findings]
    assert "storage_io" not in families


def test_a_minor_input_wait_does_not_hide_a_low_mfu():
    run_dir = RUNS / "small-batch-minor-input-wait"
    report = diagnose(load_run(run_dir))
    top = report.findings[0]
    assert top.family == "compute" and top.severity.name in ("HIGH", "CRITICAL"), [f.title for f in report.findings]
    minor = [finding for finding in report.findings if finding.family == "input_pipeline"]
    assert minor and minor[0].severity.name == "LOW"
    assert "healthy" not in {finding.family for finding in report.findings}
