"""Recorded runs whose diagnosis once went wrong (``tests/data/runs/README.md``)."""

from __future__ import annotations

from pathlib import Path

from stepscope.record.store import attach_samples, load_record
from stepscope.report.model import build_report

RUNS = Path(__file__).resolve().parents[2] / "data" / "runs"


def test_starved_workers_on_a_saturated_run_queue_are_oversubscription_not_storage():
    run_dir = RUNS / "oversubscribed-mean-below-saturation"
    report = build_report(attach_samples(load_record(run_dir, with_samples=False), run_dir))
    assert report.signals is not None and report.signals.cpu_util_mean < 0.85  # the mean alone says "not saturated"
    families = [finding.family for finding in report.findings]
    assert families[0] == "cpu_oversubscription", [finding.title for finding in report.findings]
    assert "storage_io" not in families
