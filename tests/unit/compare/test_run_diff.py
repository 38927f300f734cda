"""Run diff rows, setup changes and finding changes from synthetic records."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np

from stepscope.analysis.compare_stats import FASTER, NO_BOUND, SLOWER, WITHIN_NOISE
from stepscope.analysis.run.diff import FindingBrief, diff_runs, finding_changes, setup_changes
from stepscope.pipeline.compare import headline, origin, run_view
from stepscope.record.run import CaptureFacts, Compilation, CompileFacts, Override, Overrides, RunRecord, StepTable
from stepscope.report.render import Output, render
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
    from stepscope.report.render.diff_html import page

    html = page(run_view(diff, records=(a, b)))
    assert "<script>document" not in html and '<b id="injected">' not in html and "&lt;/script&gt;" in html
    stream = io.StringIO()
    render(run_view(diff), "text", Output(stream=stream, width=120))
    text = stream.getvalue()
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


def test_a_busy_machine_judges_against_the_floor_measured_under_load():
    """Load on one side widens the floor to ×5: a tripling is not called, a 17× change is."""
    a, b = _record(100, 3e6, 3e6, 1), _record(100, 3e6, 15e6, 2)  # step ×3
    diff = diff_runs(a, b, label_a="A", label_b="B", busy_b=0.4)
    assert diff.row("step_time").diff.verdict == WITHIN_NOISE and diff.floor == 4.0
    assert any("machine was busy" in note and "×5.0" in note for note in diff.notes)
    assert "measured under load" in diff.floor_source
    straggler = _record(100, 0.05e6, 0.29e6, 3)  # 29.3 → 1.71 ms in the report: here 6.0 → 0.35 ms, ÷17
    fixed = diff_runs(a, straggler, label_a="A", label_b="B", busy_a=0.31)
    assert fixed.row("step_time").diff.verdict == FASTER and headline(fixed).startswith("B is faster")
    quiet = diff_runs(a, b, label_a="A", label_b="B", busy_b=0.05)  # below the busy share: the default ×1.4
    assert quiet.row("step_time").diff.verdict == SLOWER and quiet.floor is None


def _with_long_steps(record: RunRecord, positions: list[int], extra_ns: float, *, compile_ns: bool) -> RunRecord:
    """``record`` with ``extra_ns`` added to the steps at ``positions`` (in the compile phase, with a
    recompilation reported inside the step, or in "other": work outside the model)."""
    columns = {name: np.array(column, copy=True) for name, column in record.steps.columns().items()}
    column = "compile_ns" if compile_ns else "other_ns"
    columns[column] = columns[column].astype(np.int64)
    for position in positions:
        columns[column][position] += int(extra_ns)
        columns["duration_ns"][position] += int(extra_ns)
    columns["start_ns"] = np.concatenate([[0], np.cumsum(columns["duration_ns"])[:-1]]).astype(np.int64)
    steps = StepTable.from_columns(columns)
    compilations = tuple(Compilation(f"0/{index + 1}", "f", "forward", "model.py", 10,
                                     int(steps.start_ns[position]) + 10, int(extra_ns), "x.size()[0] == 8")
                         for index, position in enumerate(positions)) if compile_ns else ()
    facts = replace(record.facts, compile=CompileFacts(compilations=compilations)) if compile_ns else record.facts
    return replace(record, steps=steps, facts=facts)


def test_a_mean_moved_by_a_few_long_steps_says_so_and_names_them():
    """Both medians equal, the mean +90 %: seven steady-state recompilations of 40 steps' time each."""
    a = _record(300, 1e6, 4e6, 1, spread=0.02)
    b = _with_long_steps(_record(300, 1e6, 4e6, 2, spread=0.02), [60, 100, 140, 180, 220, 260, 290], 40 * 5.01e6,
                         compile_ns=True)
    diff = diff_runs(a, b, label_a="A", label_b="B", floor=0.02)
    step, shape = diff.row("step_time").diff, diff.shape
    assert step.verdict == SLOWER and step.change > 0.8
    assert shape.median.verdict == WITHIN_NOISE and abs(shape.median.change) < 0.02
    assert shape.source == "long steps" and shape.long_b.count == 7 and shape.long_a.count == 0
    assert [(cause, count) for cause, count, _ in shape.long_b.causes] == [("torch.compile recompilation", 7)]
    assert abs(shape.tail_change - step.change) < 0.05
    said = origin(diff)
    assert said.startswith("the mean step's change (+") and "7 long steps in B" in said
    assert "torch.compile recompilation" in said and "the typical step did not change" in said
    assert "from 7 long steps in B" in headline(diff)
    assert diff.to_dict()["step_shape"]["source"] == "long steps"


def test_a_slower_typical_step_is_said_and_a_checkpoint_is_named():
    a = _record(200, 1e6, 4e6, 1, spread=0.02)
    b = _with_long_steps(_record(200, 1e6, 8e6, 2, spread=0.02), [50, 150], 0.5e9, compile_ns=False)
    diff = diff_runs(a, b, label_a="A", label_b="B", floor=0.02)
    shape = diff.shape
    assert shape.median.verdict == SLOWER and shape.source in ("typical step", "both")
    assert shape.long_b.count == 2 and "a checkpoint, evaluation or logging" in shape.long_b.causes[0][0]
    assert origin(diff).startswith("the typical step changed")


def test_edited_local_sources_are_named_in_the_setup():
    a = make_record(20)
    a = replace(a, meta=replace(a.meta, source_hashes={"train.py": "1" * 16, "model.py": "2" * 16}))
    b = replace(a, meta=replace(a.meta, source_hashes={"train.py": "1" * 16, "model.py": "3" * 16,
                                                       "layers.py": "4" * 16}))
    changes = {change.what: (change.a, change.b) for change in setup_changes(a, b)}
    assert changes == {"source model.py": ("2" * 12, "3" * 12), "source layers.py": ("–", "4" * 12)}
    view = run_view(diff_runs(a, b, label_a="A", label_b="B")).runs
    assert view.sources_changed == ("model.py", "layers.py")
    stream = io.StringIO()
    render(run_view(diff_runs(a, b, label_a="A", label_b="B")), "text", Output(stream=stream, width=120))
    assert "local source changed: model.py, layers.py" in stream.getvalue()
