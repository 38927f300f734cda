"""The terminal summary over empty, typical and pathological reports."""

from __future__ import annotations

from dataclasses import replace

import pytest

from records import make_record, summary_text
from records import report_of as build_report
from stepscope.analysis.run.loader_floor import LoaderFloor
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.record.run import RunMeta, RunRecord, StepTable
from stepscope.report.render.terminal import phase_bar


def render_text(report) -> str:
    return summary_text(report, width=100)


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
    assert text.startswith("stepscope · ")
    assert "Run directory: runs/x" in text


def test_the_verdict_and_its_best_action_come_first():
    """A ten-second read: the top finding's title, its cost and its best action are the first lines
    after the header; the run's numbers follow."""
    lines = render_text(pathological_report()).splitlines()
    assert lines[2].startswith("1. [HIGH] [red]markup[/red] in a title")
    assert lines[3].strip().startswith("costs ~100.0% of step time · input_pipeline · confidence")
    assert lines[4].strip() == "→ do [b]this[/b]"
    assert next(index for index, line in enumerate(lines) if line.startswith("Run ")) > 4


def test_empty_report_says_nothing_was_captured():
    assert "no steps were captured" in render_text(empty_report())


def test_typical_report_shows_rates_phases_and_loaders():
    text = render_text(typical_report())
    assert "steps/s" in text and "samples/s" in text
    assert "data wait 40.0%" in text
    assert "num_workers=2" in text and "pin_memory=True" in text and "prefetch_factor=2" in text


def test_rows_with_nothing_to_say_are_left_out():
    """No MFU line for a run whose model barely computes, no prefetch_factor without workers, no GPU
    line (nor NVML's note) on a run that used no GPU."""
    from stepscope.analysis.bundle import MfuEstimate

    record = make_record(40)
    loader = replace(record.loaders[0], num_workers=0, prefetch_factor=None, pin_memory=False)
    report = build_report(replace(record, loaders=(loader,)))
    mfu = MfuEstimate(value=0.00004, low=0.00003, high=0.00005, peak_flops=1e11, dtype="fp32",
                      peak_source="measured fp32 matmul peak of this CPU", on_gpu=False, flops_per_step=1e3,
                      step_time_s=0.01)
    report = replace(report, summary=replace(report.summary, mfu=mfu, mfu_shown=False))
    text = render_text(report)
    (loader_line,) = [line for line in text.splitlines() if line.startswith("DataLoader")]
    assert "MFU" not in text
    assert "prefetch_factor" not in loader_line and "persistent_workers" not in loader_line
    assert "pin_memory" not in loader_line and "num_workers=0" in loader_line
    assert "GPU" not in text


def test_timed_workers_show_their_time_per_batch_and_the_floor_it_sets():
    from stepscope.pipeline.views import loader_line
    from stepscope.report.render.lines import loader_line as line_text

    record = make_record(40)
    loader = record.loaders[0]
    floor = LoaderFloor(loader_id=loader.loader_id, workers=2, batches=30, wall_s=0.0282, cpu_s=0.0011,
                        runq_s=0.0011, blocked_s=0.026, floor_s=0.0136, share=0.44, step_s=0.0309, pace_share=0.46, busy=0.8,
                        runq_measured=True)
    text = line_text(loader_line(loader, floor))
    assert text.endswith("· a worker takes 28.2 ms per batch (26.0 ms off CPU): at best a step every 13.6 ms"), text
    other = line_text(loader_line(loader, replace(floor, loader_id=loader.loader_id + 1)))
    assert "a worker takes" not in other  # another loader's floor is not this one's


def test_a_file_gets_whole_cells_and_no_padding():
    """Not a terminal: no line ends in spaces, and the trace tables' names are whole."""
    import io

    from stepscope.report.render import Output, render

    buffer = io.StringIO()
    render(typical_report(), "text", Output(stream=buffer, run_dir="runs/x"))
    assert buffer.getvalue() and all(line == line.rstrip() for line in buffer.getvalue().splitlines())


def test_warm_up_is_shown_apart_from_the_steady_state():
    record = make_record(40)
    columns = {name: column.copy() for name, column in record.steps.columns().items()}
    columns["duration_ns"][0] += 49_000  # a slow first step: 50 µs instead of 1 µs
    columns["other_ns"][0] += 49_000
    columns["start_ns"][1:] += 49_000
    text = " ".join(render_text(build_report(replace(record, steps=StepTable.from_columns(columns)))).split())
    assert "1 warm-up step(s) shown apart, 50.0 µs" in text
    assert "(38 steady steps;" in text  # 40 less the warm-up step and the FLOP-counted step
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
    from stepscope.diagnosis.engine import Diagnosis
    from stepscope.report.model import Report
    from stepscope.report.run_view import LoaderLine, MfuLine, RunSummary, StepTimes

    shares = {"data_wait": 0.1234, "forward": 0.2341, "backward": 0.3412, "optimizer": 0.0456, "other": 0.2557}
    steady = StepTimes(count=4321, mean_s=0.0101, median_s=0.0111, p90_s=0.0222, max_s=0.0333, steps_per_s=12.34,
                       samples_per_s=5678.0, phase_shares=shares, phase_mean_s={name: 0.0 for name in shares})
    loader = LoaderLine(loader_id=3, dataset_type="x.SentinelSet", batch_size=96, num_workers=5, prefetch_factor=None,
                        persistent_workers=False, pin_memory=False, drop_last=False, batches=777, wait_ns=888_000_000)
    meta = RunMeta(target="sentinel_target.py", start_ns=0, end_ns=77_700_000_000, exit_code=42)
    finding = Finding("input_pipeline.loader_cpu_bound", "input_pipeline", "Sentinel title", Severity.HIGH,
                      impact=0.4567, confidence=0.83,
                      evidence=(Evidence("sentinel_metric", 0.6789, 0.0505, "steps", "ratio", ""),),
                      prescriptions=(Prescription("Sentinel action", "sentinel why", expected_gain=0.1357),))
    mfu = MfuLine(value=0.1919, low=0.1717, high=0.2121, dtype="bf16", peak_source="sentinel peak")
    summary = RunSummary(
        target=meta.target, argv=(), rank=0, world_size=1, wall_s=meta.wall_s, exit_code=42, step_source="optimizer",
        inference=False, training_in_children=False, total_steps=4329, warmup_steps=7, steady_steps=4321,
        excluded_steps=(), steady=steady, warmup_s=0.444, measured_phases=tuple(shares), samples_per_step=96,
        fetch_wait_share=0.1234, mfu=mfu, mfu_shown=True, mfu_note=None, compile=None, gc=None, loaders=(loader,),
        overrides=None, skipped=None, machine=None)
    evidence = RunEvidence(record=RunRecord(meta=meta, steps=StepTable.empty()))
    return Report(source="run", focus_rank=0, evidence=evidence, diagnosis=Diagnosis((finding,)), findings=(finding,),
                  summary=summary, meta=meta)


SENTINELS = ("sentinel_target.py", "4329 steps", "1m17s", "exit 42", "12.34 steps/s", "5,678 samples/s",
             "4321 steady steps", "11.1 ms", "22.2 ms", "33.3 ms", "7 warm-up step(s)", "444 ms",
             "data wait 12.3%", "forward 23.4%", "backward 34.1%", "optimizer 4.6%", "other 25.6%",
             "#3 SentinelSet", "batch_size=96", "num_workers=5", "777 batches", "888 ms",
             "Sentinel title", "45.7%", "83.0%", "sentinel_metric = 67.9%", "threshold 5.1%",
             "Sentinel action", "13.6%", "sentinel why", "MFU 19.2% (range 17.2%–21.2%) of the sentinel peak")


def test_renderer_only_formats():
    """Every number of the report appears once, formatted: the renderer computes nothing of its own."""
    text = " ".join(render_text(sentinel_report()).replace("│", " ").split())
    for sentinel in SENTINELS:
        assert text.count(sentinel) == 1, (sentinel, text)


@pytest.mark.parametrize("span, text", [
    ((0.12, 0.36), "expected to save 12.0%–36.0% of the step (estimate, not verified)"),
    ((0.0, 0.236), "expected to save up to 23.6% of the step (estimate, not verified)"),
    ((-0.05, 0.2), "expected to save up to 20.0% of the step (estimate, not verified: it may not help)")])
def test_an_expected_gain_reads_its_range_or_only_its_upper_end(span, text):
    """A range cut to "0 to the ceiling" (the DataLoader's floor bounds it, its low end is unknown)
    reads as an upper end, not as a gain that may be nothing."""
    from stepscope.report.render.lines import gain_line

    assert gain_line(Prescription("do it", expected_gain=span[1], expected_range=span)) == text
