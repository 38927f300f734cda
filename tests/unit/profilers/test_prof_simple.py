"""SimpleProfiler: timing, errors, Lightning's table layout, the Total note, copying."""

from __future__ import annotations

import copy
import math
import pickle
import time
from collections import defaultdict

import pytest

from stepscope.errors import UsageError
from stepscope.profilers import SimpleProfiler
from stepscope.profilers.simple import make_simple_report, render_simple_report

DURATIONS = {"a": [1.0, 2.0], "bb": [0.5], "ccc": [1.5, 0.25, 0.25]}

EXTENDED_TABLE = """FIT Profiler Report

------------------------------------------------------------------------------------------------------------------
|  Action       |  Mean duration (s)    |  Num calls            |  Total time (s)       |  Percentage %         |
------------------------------------------------------------------------------------------------------------------
|  Total        |  -                    |  6                    |  7.0                  |  100 %                |
------------------------------------------------------------------------------------------------------------------
|  a    |  1.5                  |  2                    |  3.0                  |  42.857               |
|  ccc  |  0.66667              |  3                    |  2.0                  |  28.571               |
|  bb   |  0.5                  |  1                    |  0.5                  |  7.1429               |
------------------------------------------------------------------------------------------------------------------
"""
PLAIN_TABLE = """FIT Profiler Report

------------------------------------------------------------------
|  Action       |  Mean duration (s)    |  Total time (s)       |
------------------------------------------------------------------
|  a    |  1.5                  |  3.0                  |
|  ccc  |  0.66667              |  2.0                  |
|  bb   |  0.5                  |  0.5                  |
------------------------------------------------------------------
"""
TOTAL_NOTE = "Total = wall-clock time since the profiler was created (7.0 s).\n"


def _profiler_with(durations, extended, fake_clock):
    profiler = SimpleProfiler(extended=extended)  # created at t=100
    profiler._stage = "fit"
    profiler.recorded_durations = defaultdict(list, {k: list(v) for k, v in durations.items()})
    fake_clock.advance(7.0)
    return profiler


@pytest.mark.parametrize(("extended", "table"), [(True, EXTENDED_TABLE), (False, PLAIN_TABLE)])
def test_summary_table_layout(extended, table, fake_clock):
    text = _profiler_with(DURATIONS, extended, fake_clock).summary()
    assert text.expandtabs() == table + TOTAL_NOTE


@pytest.mark.parametrize("extended", [True, False])
def test_table_is_character_for_character_lightnings(extended, fake_clock, monkeypatch):
    simple = pytest.importorskip("lightning.pytorch.profilers.simple")
    ours = _profiler_with(DURATIONS, extended, fake_clock).summary()
    theirs = simple.SimpleProfiler(extended=extended)
    theirs._stage = "fit"
    theirs.start_time = 100.0
    theirs.recorded_durations = defaultdict(list, DURATIONS)
    monkeypatch.setattr(simple.time, "perf_counter", lambda: 107.0)
    assert ours == theirs.summary() + TOTAL_NOTE


def test_nested_actions_are_explained(fake_clock):
    profiler = SimpleProfiler()
    with profiler.profile("outer"):
        fake_clock.advance(1.0)
        with profiler.profile("inner"):
            fake_clock.advance(3.0)
    text = profiler.summary()
    assert "The rows add up to 175 % of Total because actions nest" in text
    assert "|  Total\t|  -              \t|  2              \t|  4.0" in text


def test_empty_report_says_nothing_was_recorded(fake_clock):
    for extended in (True, False):  # Lightning raises from max() when not extended
        profiler = SimpleProfiler(extended=extended)
        profiler._stage = "test"
        assert profiler.summary() == "TEST Profiler Report\n\nNo actions were recorded.\n"


def test_durations_are_measured_with_perf_counter(fake_clock):
    profiler = SimpleProfiler()
    for seconds in (0.02, 0.01):
        with profiler.profile("sleep"):
            fake_clock.advance(seconds)
    assert profiler.recorded_durations["sleep"] == [pytest.approx(0.02), pytest.approx(0.01)]


def test_real_durations_are_never_shorter_than_the_work():
    # only a lower bound: a loaded machine may overrun a sleep by any amount, never cut it short
    profiler = SimpleProfiler()
    for seconds in (0.02, 0.01):
        with profiler.profile("sleep"):
            time.sleep(seconds)
    measured = profiler.recorded_durations["sleep"]
    assert len(measured) == 2 and measured[0] >= 0.02 and measured[1] >= 0.01


def test_start_stop_api_matches_profile(fake_clock):
    profiler = SimpleProfiler()
    profiler.start("x")
    fake_clock.advance(2.5)
    profiler.stop("x")
    assert profiler.recorded_durations == {"x": [2.5]}


@pytest.mark.parametrize("use_context", [True, False])
def test_value_errors_have_lightnings_messages(use_context):
    profiler = SimpleProfiler()
    with pytest.raises(ValueError, match=r"Attempting to stop recording an action \(never\) which was never started\."):
        profiler.stop("never")
    profiler.start("twice")
    with pytest.raises(ValueError, match="Attempted to start twice which has already started."):
        if use_context:
            with profiler.profile("twice"):
                pass
        else:
            profiler.start("twice")
    with pytest.raises(ValueError, match=r"an action \(gone\) which was never started"):
        with profiler.profile("gone"):
            profiler.stop("gone")  # stopped inside the block: the block's own stop fails


def test_report_sums_with_fsum():
    values = [0.1] * 10 + [1e16, -1e16]
    report = make_simple_report({"x": values}, wall_time_s=10.0, stage=None, extended=True)
    assert report.rows[0].total_s == math.fsum(values) != sum(values)


def test_report_is_pure_data_and_rendering_is_separate():
    report = make_simple_report(DURATIONS, wall_time_s=7.0, stage="fit", extended=True)
    assert [row.action for row in report.rows] == ["a", "ccc", "bb"]
    assert report.total_calls == 6 and report.share_sum_percent == pytest.approx(78.571, rel=1e-4)
    assert render_simple_report(report).expandtabs() == EXTENDED_TABLE + TOTAL_NOTE


def test_durations_accumulate_across_stages(console):
    profiler = SimpleProfiler()
    for stage in ("fit", "test"):
        profiler.setup(stage)
        with profiler.profile(f"{stage}_action"):
            pass
        profiler.describe()
    assert set(profiler.recorded_durations) == {"fit_action", "test_action"}
    assert console.getvalue().count("Profiler Report") == 2


def test_deepcopy_and_pickle_while_profiling(tmp_path):
    profiler = SimpleProfiler(dirpath=tmp_path, filename="test")
    profiler._prepare_streams()
    with profiler.profile("running"):
        clone = copy.deepcopy(profiler)
        restored = pickle.loads(pickle.dumps(profiler))
    for other in (clone, restored):
        assert "running" in other.current_actions and other.filename == "test"
        other.stop("running")
        with other.profile("again"):
            pass
        assert len(other.recorded_durations["again"]) == 1
    profiler.describe()
    copy.deepcopy(profiler)  # after describe, as in Lightning


def test_subclass_overriding_start_is_honoured_by_profile():
    seen = []

    class Logged(SimpleProfiler):
        def start(self, action_name):
            seen.append(action_name)
            super().start(action_name)

    profiler = Logged()
    with profiler.profile("x"):
        pass
    assert seen == ["x"] and len(profiler.recorded_durations["x"]) == 1


def test_invalid_extended_is_a_usage_error():
    with pytest.raises(UsageError, match="extended must be True or False"):
        SimpleProfiler(extended="yes")  # type: ignore[arg-type]
