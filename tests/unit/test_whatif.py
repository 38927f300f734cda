"""What-if comparison: candidates from prescriptions, interleaving, medians, noise bounds (fake trials)."""

from __future__ import annotations

import pytest

from stepscope.whatif import BASELINE, Candidate, TrialResult, agrees, best_change, compare, trial_order, verdict


def trial(name: str, step_ms: float | None, repeat: int = 0, batch: int | None = 8) -> TrialResult:
    if step_ms is None:
        return TrialResult(name, repeat, None, None, None, exit_code=1, error="exit 1")
    steps_per_s = 1000.0 / step_ms
    return TrialResult(name, repeat, step_ms / 1000.0, steps_per_s * batch if batch else None, steps_per_s, 30)


WORKERS = Candidate("dataloader.num_workers=2", {"dataloader.num_workers": 2}, "input_pipeline.loader_cpu_bound",
                    expected_gain=0.5)
PINNED = Candidate("dataloader.pin_memory=true", {"dataloader.pin_memory": True})


def test_faster_beyond_noise_with_bounds_from_the_extremes():
    trials = [trial(BASELINE, 20), trial(BASELINE, 22), trial(BASELINE, 21),
              trial(WORKERS.name, 10), trial(WORKERS.name, 11), trial(WORKERS.name, 12)]
    base, workers = compare(trials, [WORKERS])
    assert base.verdict == BASELINE and base.runs == 3 and base.unit == "samples/s"
    assert base.step_time_s == pytest.approx(0.021) and base.throughput == pytest.approx(8000 / 21)
    assert workers.verdict == "faster"
    assert workers.speedup == pytest.approx(21 / 11)
    assert workers.speedup_low == pytest.approx(20 / 12)  # slowest candidate against fastest baseline
    assert workers.speedup_high == pytest.approx(22 / 10)
    assert workers.step_time_min_s == pytest.approx(0.010) and workers.step_time_max_s == pytest.approx(0.012)
    assert workers.expected_gain == 0.5
    assert best_change([base, workers]) is workers


def test_overlapping_ranges_are_within_noise_and_no_best():
    trials = [trial(BASELINE, 20), trial(BASELINE, 24), trial(PINNED.name, 21), trial(PINNED.name, 25)]
    rows = compare(trials, [PINNED])
    assert rows[1].verdict == "within noise"
    assert best_change(rows) is None


def test_slower_single_and_failed():
    assert verdict([10.0, 11.0], [20.0, 21.0]) == "slower"
    assert verdict([30.0], [20.0, 21.0]) == "no noise bound"
    assert verdict([], [20.0]) == "failed"
    rows = compare([trial(BASELINE, 20), trial(BASELINE, 21), trial(WORKERS.name, None),
                    trial(WORKERS.name, 10)], [WORKERS])
    assert rows[1].failed == 1 and rows[1].verdict == "no noise bound"
    rows = compare([trial(BASELINE, 20), trial(WORKERS.name, None)], [WORKERS])
    assert rows[1].verdict == "failed" and rows[1].speedup is None


def test_batch_size_changes_compare_samples_not_steps():
    bigger = Candidate("dataloader.batch_size=16", {"dataloader.batch_size": 16})
    trials = [trial(BASELINE, 10), trial(BASELINE, 10.5),
              TrialResult(bigger.name, 0, 0.015, 16 / 0.015, 1 / 0.015), TrialResult(bigger.name, 1, 0.016, 1000.0,
                                                                                    1 / 0.016)]
    rows = compare(trials, [bigger])
    assert rows[1].unit == "samples/s" and rows[1].verdict == "faster"  # slower steps, more samples/s
    no_samples = compare([trial(BASELINE, 10, batch=None), trial(WORKERS.name, 5, batch=None)], [WORKERS])
    assert no_samples[1].unit == "steps/s" and no_samples[1].speedup == pytest.approx(2.0)


def test_trials_are_interleaved_and_rotated():
    order = trial_order([BASELINE, "a", "b"], 3)
    assert order == [(0, BASELINE), (0, "a"), (0, "b"), (1, "a"), (1, "b"), (1, BASELINE),
                     (2, "b"), (2, BASELINE), (2, "a")]


def test_agreement_of_one_outside_observation_uses_the_trials_noise():
    trials = [trial(BASELINE, 20), trial(BASELINE, 22), trial(WORKERS.name, 10), trial(WORKERS.name, 11)]
    row = compare(trials, [WORKERS])[1]  # speed-up 21/10.5 = 2.0, bounds 20/11 .. 22/10
    assert row.speedup == pytest.approx(2.0)
    low, high = row.speedup_low * 2.0 / row.speedup_high, row.speedup_high * 2.0 / row.speedup_low
    assert agrees(2.0, row) and agrees(low * 1.001, row) and agrees(high * 0.999, row)
    assert not agrees(low * 0.99, row) and not agrees(high * 1.01, row) and not agrees(1.0, row)
    assert not agrees(2.0, compare([trial(BASELINE, 20)], [WORKERS])[1])  # no figure: no agreement


def _render_text(result):
    """``stepscope try``'s terminal output of ``result`` (stdout)."""
    import sys

    from stepscope.pipeline.commands import whatif_view
    from stepscope.report.render import Output, render

    render(whatif_view(result), "text", Output(stream=sys.stdout))


def test_text_output_shows_the_table_the_best_change_and_what_is_not_tried(capsys, monkeypatch):
    render = _render_text
    from stepscope.whatif import CodeChange, WhatIf

    monkeypatch.setenv("COLUMNS", "120")
    trials = [trial(BASELINE, 20), trial(BASELINE, 22), trial(WORKERS.name, 10), trial(WORKERS.name, 11)]
    rows = compare(trials, [WORKERS])
    render(WhatIf("train.py", 30, 2, rows, (CodeChange("Make each sample cheaper", "input_pipeline.x"),),
                  best=best_change(rows).name))
    out = capsys.readouterr().out
    assert "dataloader.num_workers=2" in out and "faster" in out and "×2.00" in out and "×2.00 (0.91" not in out
    assert "best: dataloader.num_workers=2 — ×2.00 samples/s (bounds ×1.82–×2.20); " \
           "stepscope run --set dataloader.num_workers=2 …" in out
    assert "not tried (no --set for it): Make each sample cheaper [input_pipeline.x]" in out


def test_a_piped_table_keeps_whole_cells_at_80_columns(capsys, monkeypatch):
    """``stepscope try > file`` with COLUMNS=80 cut the headers to ``samples…``, ``speed-…``; a
    file gets the table's full width."""
    render = _render_text
    from stepscope.whatif import WhatIf

    monkeypatch.setenv("COLUMNS", "80")
    trials = [trial(BASELINE, 20), trial(BASELINE, 22), trial(WORKERS.name, 10), trial(WORKERS.name, 11)]
    rows = compare(trials, [WORKERS])
    render(WhatIf("a_rather_long_training_script_name.py", 30, 2, rows, (), best=best_change(rows).name))
    out = capsys.readouterr().out
    (header,) = [line for line in out.splitlines() if "setting" in line]
    assert "…" not in header and header.split() == ["setting", "step", "time", "samples/s", "speed-up", "expected",
                                                     "verdict"]
    assert "a_rather_long_training_script_name.py" in out and "baseline" in out
    assert all(line == line.rstrip() for line in out.splitlines())
