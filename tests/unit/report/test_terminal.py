"""The terminal summary over empty, typical and pathological reports."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console

from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.record.run import RunMeta, RunRecord, StepTable
from stepscope.report.model import build_report
from stepscope.report.terminal import phase_bar, print_summary
from records import make_record


def render_text(report) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=100, color_system=None, _environ={})
    print_summary(report, "runs/x", console=console)
    return buffer.getvalue()


def empty_report():
    return build_report(RunRecord(meta=RunMeta(target="empty.py"), steps=StepTable.empty()))


def typical_report():
    return build_report(make_record(40))


def pathological_report():
    record = make_record(5)
    record = replace(record, meta=replace(record.meta, target="[bold red]evil[/] <script>.py"),
                     warnings=("[link=http://x]click[/link]",))
    finding = Finding(rule_id="x.y", family="input_pipeline", title="[red]markup[/red] in a title",
                      severity=Severity.HIGH, impact=1.0, confidence=1.0,
                      evidence=(Evidence("m", float("inf"), None), Evidence("n", "[/]", 3)),
                      prescriptions=(Prescription("do [b]this[/b]", why="because"),))
    return replace(build_report(record), findings=(finding,) * 5)


@pytest.mark.parametrize("factory", [empty_report, typical_report, pathological_report])
def test_summary_renders(factory):
    text = render_text(factory())
    assert "stepscope" in text
    assert "Verdict" in text


def test_empty_report_says_nothing_was_captured():
    assert "no steps were captured" in render_text(empty_report())


def test_typical_report_shows_rates_phases_and_loaders():
    text = render_text(typical_report())
    assert "steps/s" in text and "samples/s" in text
    assert "data wait 40.0%" in text
    assert "num_workers=2" in text and "pin_memory=True" in text


def test_warm_up_is_shown_apart_from_the_steady_state():
    record = make_record(40)
    columns = {name: column.copy() for name, column in record.steps.columns().items()}
    columns["duration_ns"][0] += 49_000  # a slow first step: 50 µs instead of 1 µs
    columns["other_ns"][0] += 49_000
    columns["start_ns"][1:] += 49_000
    text = render_text(build_report(replace(record, steps=StepTable.from_columns(columns))))
    assert "Warm-up     1 step(s), 50.0 µs (mean 50.0 µs) — shown apart" in text
    assert "(steady state: 38 steps)" in text  # 40 less the warm-up step and the FLOP-counted step
    assert "max 1.00 µs" in text  # the slow step is not in the steady statistics


def test_strings_from_scripts_are_not_interpreted_as_markup():
    text = render_text(pathological_report())
    assert "[bold red]evil[/] <script>.py" in text
    assert "[red]markup[/red] in a title" in text
    assert "do [b]this[/b]" in text
    assert "(+2 more in report.json)" in text


@pytest.mark.parametrize("shares", [
    {"data_wait": 1.0},
    {"data_wait": 0.333, "forward": 0.333, "backward": 0.334},
    {"data_wait": 0.0, "other": 0.0},
])
def test_phase_bar_has_exact_width(shares):
    assert len(phase_bar(shares, width=40).plain) == (40 if sum(shares.values()) > 0.99 else 0)
