"""Skipped samples (`stepscope.data.SkipBadSamples`) in the record, report.json, terminal and HTML."""

from __future__ import annotations

from dataclasses import replace

from records import make_record, summary_text
from records import report_of as build_report
from stepscope.record.run import SkippedSamples
from stepscope.record.store import load_record, save_record
from stepscope.report.render.html import render_html
from stepscope.report.render.lines import skipped_line

SKIPS = (SkippedSamples("shards", 7, (1, 4, 2)), SkippedSamples("<b>captions</b>", 3, (3,)))


def skipping_record(count: int = 40, skips=SKIPS, rank: int = 0):
    record = make_record(count, rank=rank)  # 8 samples per step
    return replace(record, facts=replace(record.facts, skipped_samples=skips))


def test_counts_round_trip_through_the_record_file(tmp_path):
    save_record(skipping_record(), tmp_path / "record.json.gz")
    assert load_record(tmp_path / "record.json.gz").facts.skipped_samples == SKIPS


def test_a_record_without_counts_loads_with_none_and_the_report_says_nothing():
    report = build_report(make_record(40))
    assert report.summary.skipped is None
    assert report.to_dict()["summary"]["skipped_samples"] is None


def test_report_json_has_the_total_and_its_share_of_delivered_samples():
    summary = build_report(skipping_record()).to_dict()["summary"]["skipped_samples"]
    assert summary["total"] == 10 and summary["delivered"] == 320
    assert summary["share"] == 10 / 320
    assert summary["datasets"][0] == {"dataset": "shards", "total": 7, "by_process": (1, 4, 2)}


def test_unknown_batch_sizes_give_no_share():
    record = skipping_record()
    samples = record.steps.samples.copy()
    samples[3] = -1
    record = replace(record, steps=replace(record.steps, samples=samples))
    summary = build_report(record).summary.skipped
    assert summary.delivered is None and summary.share is None
    assert skipped_line(summary) == ("10 failed to load, replaced by the next sample · "
                                     "shards 7 (main 1, worker 0 4, worker 1 2) · <b>captions</b> 3")


def test_every_rank_of_a_job_is_counted():
    first, second = skipping_record(rank=0), skipping_record(rank=1, skips=(SkippedSamples("shards", 5, (0, 5)),))
    first, second = (replace(record, meta=replace(record.meta, world_size=2)) for record in (first, second))
    summary = build_report(ranks=(first, second)).summary.skipped
    assert summary.total == 15 and summary.delivered == 640


def test_terminal_summary_has_a_skipped_samples_row():
    text = summary_text(build_report(skipping_record()))
    assert ("Skipped     10 failed to load, replaced by the next sample (3.1% of 320 delivered) · "
            "shards 7 (main 1, worker 0 4, worker 1 2) · <b>captions</b> 3") in text


def test_html_header_shows_the_skips_escaped():
    page = render_html(build_report(skipping_record())).text
    assert "skipped samples: 10 failed to load" in page
    assert "&lt;b&gt;captions&lt;/b&gt; 3" in page and "<b>captions</b>" not in page
