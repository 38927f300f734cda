"""The HTML report as text: self-contained, escaped, down-sampled with a notice, over every kind of report."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest

from stepscope.analysis.trace.trace_evidence import analyze_traces
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.record.run import RunMeta, RunRecord, StepTable
from html_records import HOSTILE, PAYLOAD, synthetic_run
from records import make_record
from records import report_of as build_report
from stepscope.pipeline.trace_views import trace_views
from stepscope.report.render import html_charts as charts
from stepscope.report.render.html import json_for_script, render_html, text

TRACES = Path(__file__).parents[2] / "data" / "traces"
#: anything that would make the page fetch something
EXTERNAL = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:|//|ftp:)|url\(\s*["']?(?:https?:|//)|@import""",
                      re.IGNORECASE)


def empty_report():
    return build_report(RunRecord(meta=RunMeta(target="empty.py"), steps=StepTable.empty()))


def typical_report():
    return build_report(make_record(40))


def sampled_report():
    return build_report(synthetic_run(300))


def hostile_report():
    report = build_report(synthetic_run(60, hostile=True))
    finding = Finding(rule_id="x.y", family="input_pipeline", title=HOSTILE, severity=Severity.HIGH, impact=0.5,
                      confidence=1.0, evidence=(Evidence(HOSTILE, HOSTILE, None, source=HOSTILE),),
                      prescriptions=(Prescription(HOSTILE, why=HOSTILE, cost=HOSTILE),), summary=HOSTILE,
                      extra={"note": HOSTILE})
    return replace(report, findings=(finding, *report.findings))


def trace_report():
    return build_report(traces=analyze_traces(TRACES / "cpu_train.pt.trace.json.gz"))


REPORTS = [empty_report, typical_report, sampled_report, hostile_report, trace_report]


@pytest.mark.parametrize("factory", REPORTS)
def test_page_is_one_self_contained_file(factory):
    page = render_html(factory()).text
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<style>" in page and "<script>" in page and 'id="verdict"' in page
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    assert "default-src 'none'" in page  # the page may not fetch anything even if something slipped in
    data = re.search(r'<script type="application/json" id="stepscope-data">(.*?)</script>', page, re.S)
    assert data is not None
    orjson.loads(data.group(1))


def test_run_page_shows_verdict_steps_phase_split_and_machine():
    page = render_html(sampled_report()).text
    for part in ('id="steps"', "Phase split of the steady state", 'id="system"', 'class="chart heatmap"',
                 "GPU utilisation", "DataLoader workers", "Disk", "Memory", "class=\"finding"):
        assert part in page, part
    assert "band warmup" in page and "band excluded" in page  # warm-up and the FLOP-counted step marked


def test_trace_page_has_overview_operator_and_kernel_tables_and_memory():
    page = render_html(trace_report()).text
    assert "Overview: step time breakdown per step" in page
    assert 'data-table="ops-r0"' in page
    assert "Memory: " in page
    tables = orjson.loads(re.search(r'id="stepscope-data">(.*?)</script>', page, re.S).group(1))["tables"]
    assert tables["ops-r0"]["rows"] and tables["ops-r0"]["columns"][0]["key"] == "name"


def test_run_with_a_profiler_window_shows_its_trace_views():
    window = trace_views(analyze_traces(TRACES / "cpu_train.pt.trace.json.gz"), from_window=True)
    report = replace(sampled_report(), traces=window)
    page = render_html(report).text
    assert 'id="system"' in page and 'data-table="ops-r0"' in page


def test_hostile_strings_are_escaped_everywhere():
    page = render_html(hostile_report()).text
    body, _, data = page.partition('<script type="application/json"')
    assert PAYLOAD not in page
    assert "<img" not in page.lower()
    assert page.lower().count("<script") == 2  # the data block and the page's own script
    assert "&lt;/script&gt;&lt;img src=x" in body
    assert "\x1b" not in page and "\\x1b[31mansi" in body
    assert "[bold red]rich[/]" in body  # shown as written, not interpreted
    assert "</" not in data.split("</script>")[0]


def test_trace_operator_names_are_escaped_in_the_embedded_json():
    report = trace_report()
    rank = report.traces.ranks[0]
    rows = (replace(rank.operators[0], name=HOSTILE), *rank.operators[1:])
    rank = replace(rank, operators=rows, operators_shown=rows)  # the rows the view holds for the page's table
    report = replace(report, traces=replace(report.traces, ranks=(rank,)))
    page = render_html(report).text
    data = re.search(r'id="stepscope-data">(.*?)</script>', page, re.S).group(1)
    assert "<" not in data and ">" not in data and "&" not in data
    assert HOSTILE in [row[0] for row in orjson.loads(data)["tables"]["ops-r0"]["rows"]]


@pytest.mark.parametrize("value", ["</script><script>alert(1)</script>", "a & b < c > d", "\u2028\u2029", "<!--"])
def test_json_for_script_cannot_close_the_script(value):
    encoded = json_for_script({"v": value})
    assert not set("<>&\u2028\u2029") & set(encoded)
    assert orjson.loads(encoded)["v"] == value


def test_text_escapes_cuts_and_shows_control_characters():
    assert text('<a href="x">') == "&lt;a href=&quot;x&quot;&gt;"
    assert text("\x1b[31m") == "\\x1b[31m"
    assert len(text("x" * 5000)) == 300


def test_a_long_run_is_down_sampled_with_a_notice_and_stays_small():
    report = build_report(synthetic_run(20_000))
    page = render_html(report)
    assert any("steps are drawn as" in notice for notice in page.notices)
    assert any("minimum and maximum" in notice for notice in page.notices)
    assert all(notice.split(":")[0] in page.text or notice[:40] in page.text for notice in page.notices)
    assert len(page.text) < 1_000_000


def test_step_bars_keep_the_slowest_step_of_each_bucket():
    durations = np.full(10_000, 10, dtype=np.int64)
    durations[4321] = 5000
    start = np.r_[0, np.cumsum(durations)[:-1]]
    bars = charts.step_bars(start, durations, {"other": durations}, max_bars=100)
    assert bars.per_bar == 100 and len(bars.start_ns) == 100
    assert bars.slowest_ns.max() == 5000 and bars.slowest_ns[43] == 5000
    assert bars.phases["other"][43] == pytest.approx((99 * 10 + 5000) / 100)


def test_min_max_points_keep_peaks_and_oscillation():
    t = np.arange(100_000, dtype=np.int64)
    values = np.where(t % 2 == 0, 0.0, 1.0)
    values[77_777] = 9.0
    axis = charts.TimeAxis(0, 100_000)
    kept_t, kept = charts.min_max_points(t, values, axis, columns=500)
    assert len(kept) <= 1000
    assert kept.max() == 9.0 and kept.min() == 0.0
    assert (kept[:-1] != kept[1:]).mean() > 0.9  # still swings between low and high


def test_heatmap_is_an_embedded_png():
    axis = charts.TimeAxis(0, 1000)
    svg = charts.heatmap(np.arange(0, 1000, 10), np.random.default_rng(0).random((100, 64)), axis,
                         [f"cpu{i}" for i in range(64)])
    assert 'href="data:image/png;base64,' in svg
    assert len(svg) < 60_000


def test_html_only_formats_the_report():
    """The numbers of a report of sentinel values appear, formatted as the report holds them."""
    from test_terminal import sentinel_report

    page = render_html(sentinel_report()).text
    for sentinel in ("sentinel_target.py", "12.34 steps/s", "5,678 samples/s", "median 11.1 ms", "p90 22.2 ms",
                     "max 33.3 ms", "7 step(s)", "Sentinel title", "costs ~45.7% of step time", "confidence 83.0%",
                     "MFU <b>19.2% (17.2%–21.2%, bf16)",
                     "sentinel_metric = 67.9%", "threshold 5.1%", "Sentinel action", "~13.6% of the step",
                     "sentinel why", "data wait 12.3%", "forward 23.4%", "backward 34.1%", "optimizer 4.6%",
                     "other 25.6%", "batch_size=96", "num_workers=5"):
        assert sentinel in page, sentinel


def test_the_page_reads_in_the_terminal_order_verdict_first():
    page = render_html(sampled_report()).text
    assert page.index('id="verdict"') < page.index('id="run"') < page.index('id="steps"') < page.index('id="system"')
