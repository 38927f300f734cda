"""Run diff rows, setup changes and finding changes from synthetic records."""

from __future__ import annotations

from dataclasses import replace


from stepscope.analysis.compare_stats import FASTER, NO_BOUND, SLOWER, WITHIN_NOISE
from stepscope.analysis.run.diff import FindingBrief, diff_runs, finding_changes, setup_changes
from stepscope.record.run import Override, Overrides, RunRecord
from stepscope.report.diff_view import headline, render_diff_html, render_run_diff
from html_records import HOSTILE
from records import make_record, noisy_record


def _record(count: int, wait_ns: float, compute_ns: float, seed: int, **meta) -> RunRecord:
    return noisy_record(count, wait_ns, compute_ns, seed, **meta)


def test_a_faster_loader_is_named_with_its_interval_and_setup_change():
    a = _record(200, 8e6, 2e6, 1)
    b = _record(200, 1e6, 2e6, 2)
    loader = replace(b.loaders[0], num_workers=6)
    b = replace(b, loaders=(loader,), facts=replace(b.facts, overrides=Overrides((Override("dataloader.num_workers", 6, 1),))))
    diff = diff_runs(a, b, label_a="A", label_b="B")
    step, wait, forward = diff.row("step_time"), diff.row("data_wait"), diff.row("forward")
    assert step.diff.verdict == FASTER and wait.diff.verdict == FASTER and forward.diff.verdict == WITHIN_NOISE
    assert wait.diff.high < -0.8 and wait.share_a > 0.7
    assert diff.row("samples_per_s").diff.verdict == FASTER
    changes = {change.what: (change.a, change.b) for change in diff.setup}
    assert changes == {"DataLoader 0 num_workers": ("2", "6"), "--set dataloader.num_workers": ("–", "6")}
    assert headline(diff).startswith("B is faster: step time")


def test_identical_setups_are_within_noise_and_list_nothing():
    a, b = _record(150, 3e6, 3e6, 1), _record(150, 3e6, 3e6, 2)
    diff = diff_runs(a, b, label_a="A", label_b="B")
    assert all(row.diff.verdict == WITHIN_NOISE for row in diff.rows), [(r.metric, r.diff.verdict) for r in diff.rows]
    assert diff.setup == () and diff.findings == ()


def test_setup_changes_cover_versions_threads_env_and_commit():
    a = make_record(20)
    b = replace(a, meta=replace(a.meta, torch_version="2.13.0", intra_op_threads=1, git_commit="a" * 40,
                                env={"OMP_NUM_THREADS": "1"}, argv=("train.py", "--lr", "1e-3")))
    changes = {change.what: (change.a, change.b) for change in setup_changes(a, b)}
    assert changes == {"arguments": ("--lr 3e-4", "--lr 1e-3"), "git commit": ("–", "a" * 12),
                       "torch": ("–", "2.13.0"), "torch threads": ("–", "1"), "$OMP_NUM_THREADS": ("–", "1")}


def test_findings_appear_disappear_and_change_severity():
    a = [FindingBrief("input_pipeline.cpu_bound", "Input", "high"), FindingBrief("gc.pauses", "GC", "low")]
    b = [FindingBrief("input_pipeline.cpu_bound", "Input", "medium"), FindingBrief("compute.low_mfu", "MFU", "high")]
    got = {(c.rule_id, c.change) for c in finding_changes(a, b)}
    assert got == {("input_pipeline.cpu_bound", "less severe"), ("compute.low_mfu", "appeared"),
                   ("gc.pauses", "disappeared")}


def test_few_steps_have_no_bound_and_a_slower_run_is_slower():
    a, b = _record(6, 3e6, 3e6, 1), _record(6, 3e6, 9e6, 2)
    assert diff_runs(a, b, label_a="A", label_b="B").row("step_time").diff.verdict == NO_BOUND
    a, b = _record(100, 3e6, 3e6, 1), _record(100, 3e6, 9e6, 2)
    diff = diff_runs(a, b, label_a="A", label_b="B")
    assert diff.row("step_time").diff.verdict == SLOWER and diff.row("forward").diff.verdict == SLOWER


def test_renderers_escape_what_came_from_the_runs():
    a = _record(50, 3e6, 3e6, 1)
    b = replace(_record(50, 3e6, 3e6, 2), meta=replace(a.meta, argv=("train.py", HOSTILE), env={"TORCH_X": HOSTILE}))
    diff = diff_runs(a, b, label_a=HOSTILE, label_b="B",
                     findings_b=[FindingBrief("x.y", HOSTILE, "high")])
    page = render_diff_html(diff, record_a=a, record_b=b)
    assert "<script>document" not in page and '<b id="injected">' not in page and "&lt;/script&gt;" in page
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(render_run_diff(diff))
    text = console.export_text()
    assert "\x1b[31m" not in text and "[bold red]rich[/]" in text


def test_repeats_on_each_side_compare_over_runs():
    from stepscope.analysis.run.diff import diff_groups

    side_a = [_record(60, 3e6, 3e6, seed) for seed in range(3)]
    side_b = [_record(60, 3e6, 4.5e6, seed) for seed in range(3, 6)]
    diff = diff_groups(side_a, side_b, label_a="A", label_b="B")
    assert (diff.runs_a, diff.runs_b) == (3, 3) and "repeats" in diff.floor_source
    assert diff.row("step_time").diff.verdict == SLOWER and diff.row("forward").diff.verdict == SLOWER
    assert diff.row("data_wait").diff.verdict == WITHIN_NOISE
    mixed = diff_groups(side_a[:1] + [_record(60, 3e6, 3e6, 9, torch_version="9.9")], side_b, label_a="A", label_b="B")
    assert any("differ among themselves in torch" in note for note in mixed.notes)


def test_a_busy_machine_names_nothing_faster_or_slower():
    a, b = _record(100, 3e6, 3e6, 1), _record(100, 3e6, 9e6, 2)
    diff = diff_runs(a, b, label_a="A", label_b="B", busy_b=0.4)
    assert all(row.diff.verdict not in (FASTER, SLOWER) for row in diff.rows)
    assert any("machine was busy" in note for note in diff.notes)
