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


def sentinel_report():
    """A report whose every number is a distinct sentinel (see test_renderer_only_formats)."""
    from stepscope.analysis.bundle import RunEvidence
    from stepscope.analysis.run.steady import SteadyState, StepStats
    from stepscope.diagnosis.engine import Diagnosis
    from stepscope.record.run import LoaderInfo
    from stepscope.report.model import Report

    import numpy as np

    shares = {"data_wait": 0.1234, "forward": 0.2341, "backward": 0.3412, "optimizer": 0.0456, "other": 0.2557}
    steady = StepStats(count=4321, total_s=1.0, mean_s=0.0101, median_s=0.0111, p90_s=0.0222, max_s=0.0333,
                       min_s=0.001, steps_per_s=12.34, samples_per_s=5678.0, phase_shares=shares,
                       phase_mean_s={name: 0.0 for name in shares}, loader_init_share=0.0)
    warmup = replace(steady, count=7, total_s=0.444, mean_s=0.0555)
    state = SteadyState(step_count=4329, steady_count=4321, warmup_steps=7, excluded=(), mask=np.ones(1, bool),
                        steady=steady, warmup=warmup, total_s=1.0, step_time_s=0.0111, step_time_mean_s=0.0101,
                        step_time_fast_s=0.009, shares=shares, loader_init_share=0.0, fetch_wait_share=0.1234,
                        fetch_wait_p10=0.1, fetch_wait_p90=0.15, batches_per_step=1.0, samples_per_step=96)
    loader = LoaderInfo(loader_id=3, cls="DataLoader", dataset_type="x.SentinelSet", iterable_dataset=False,
                        batch_size=96, num_workers=5, pin_memory=False, prefetch_factor=None,
                        persistent_workers=False, drop_last=False, batches=777, wait_ns=888_000_000)
    meta = RunMeta(target="sentinel_target.py", start_ns=0, end_ns=77_700_000_000, exit_code=42)
    record = RunRecord(meta=meta, steps=StepTable.empty(), loaders=(loader,))
    finding = Finding("input_pipeline.loader_cpu_bound", "input_pipeline", "Sentinel title", Severity.HIGH,
                      impact=0.4567, confidence=0.83,
                      evidence=(Evidence("sentinel_metric", 0.6789, 0.0505, "steps", "ratio", ""),),
                      prescriptions=(Prescription("Sentinel action", "sentinel why", expected_gain=0.1357),))
    from stepscope.analysis.bundle import MfuEstimate

    mfu = MfuEstimate(value=0.1919, low=0.1717, high=0.2121, peak_flops=1e12, dtype="bf16",
                      peak_source="sentinel peak", on_gpu=True, flops_per_step=1e9, step_time_s=0.0111)
    evidence = RunEvidence(record=record, steady=state, mfu=mfu)
    return Report(source="run", evidence=evidence, diagnosis=Diagnosis((finding,)), findings=(finding,))


SENTINELS = ("sentinel_target.py", "4329 steps", "1m17s", "exit 42", "12.34 steps/s", "5,678 samples/s",
             "4321 steps)", "11.1 ms", "22.2 ms", "33.3 ms", "7 step(s)", "444 ms", "55.5 ms",
             "data wait 12.3%", "forward 23.4%", "backward 34.1%", "optimizer 4.6%", "other 25.6%",
             "#3 SentinelSet", "batch_size=96", "num_workers=5", "777 batches", "888 ms",
             "Sentinel title", "45.7%", "83.0%", "sentinel_metric = 67.9%", "threshold 5.1%",
             "Sentinel action", "13.6%", "sentinel why", "MFU 19.2% (range 17.2%–21.2%) of the sentinel peak")


def test_renderer_only_formats():
    """Every number of the report appears once, formatted: the renderer computes nothing of its own."""
    text = " ".join(render_text(sentinel_report()).replace("│", " ").split())
    for sentinel in SENTINELS:
        assert text.count(sentinel) == 1, (sentinel, text)
