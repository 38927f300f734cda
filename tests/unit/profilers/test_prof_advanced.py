"""AdvancedProfiler: cProfile per action, nesting, dumps, validation, copying."""

from __future__ import annotations

import copy
import pickle
import pstats
import sys
import time

import pytest

from stepscope.errors import UsageError
from stepscope.profilers import AdvancedProfiler


def busy_outer() -> int:
    return sum(range(2000))


def busy_inner() -> int:
    return sum(range(1000))


def _functions(profiler: AdvancedProfiler, action: str) -> set[str]:
    return {name for (_file, _line, name) in pstats.Stats(profiler.profiled_actions[action]).stats}


def test_nested_actions_do_not_fail_and_outer_resumes():
    profiler = AdvancedProfiler()
    with profiler.profile("outer"):
        with profiler.profile("inner"):
            busy_inner()
        busy_outer()  # after the inner action stopped: Lightning's outer stays disabled here
    assert "busy_outer" in _functions(profiler, "outer")
    assert "busy_inner" in _functions(profiler, "inner")
    assert "busy_inner" not in _functions(profiler, "outer")
    assert profiler.summary().rstrip().endswith(
        "Nested actions: time spent inside an inner action is reported under the inner action only."
    )


def test_out_of_order_stop_keeps_the_inner_action_running():
    profiler = AdvancedProfiler()
    profiler.start("a")
    profiler.start("b")
    profiler.stop("a")
    busy_inner()
    profiler.stop("b")
    assert "busy_inner" in _functions(profiler, "b")


def test_durations_match_sleep():
    profiler = AdvancedProfiler()
    with profiler.profile("sleep"):
        time.sleep(0.05)
    stats = pstats.Stats(profiler.profiled_actions["sleep"])
    inline = sum(entry[2] for entry in stats.stats.values())
    # a lower bound only: a loaded machine may overrun a sleep by any amount, never cut it short
    # (cProfile's timer may round a little below the requested time)
    assert inline >= 0.045


def test_summary_layout_with_rank_header_and_line_limit():
    profiler = AdvancedProfiler(line_count_restriction=2)
    profiler.setup("fit", local_rank=1)
    with profiler.profile("work"):
        busy_outer()
        busy_inner()
    text = profiler.summary()
    lines = text.splitlines()
    assert lines[0] == "FIT Profiler Report"
    assert lines[1] == "Profile stats for: work rank: 1"
    assert "Ordered by: cumulative time" in text
    assert "due to restriction <2>" in text


def test_value_errors():
    profiler = AdvancedProfiler()
    with pytest.raises(ValueError, match=r"Attempting to stop recording an action \(x\) which was never started"):
        profiler.stop("x")
    profiler.start("x")
    with pytest.raises(ValueError, match="Attempted to start x which has already started"):
        profiler.start("x")
    profiler.stop("x")
    profiler.stop("x")  # a second stop of a known action is harmless, as in Lightning


def test_describe_writes_report_file(console, tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="profiler")
    with profiler.profile("test"):
        busy_inner()
    profiler.describe()
    text = (tmp_path / "profiler.txt").read_text()
    assert text.startswith("Profiler Report") and "busy_inner" in text
    assert profiler.profiled_actions == {}  # teardown forgets recordings


def test_dump_stats_writes_prof_files_with_sanitized_names(console, tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, dump_stats=True)
    for action in ("test", 'bad/\\:*?"<>|\n\r\tname'):
        with profiler.profile(action):
            busy_inner()
    profiler.describe()
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == ["bad_name.prof", "test.prof"]
    assert pstats.Stats(str(tmp_path / "test.prof")).total_calls > 0


def test_dump_stats_needs_dirpath_at_construction():
    with pytest.raises(UsageError, match=r"dump_stats=True\) writes one .prof file per action and needs a directory"):
        AdvancedProfiler(dump_stats=True)
    with pytest.raises(ValueError):  # also a ValueError
        AdvancedProfiler(dump_stats=True, filename="x")


@pytest.mark.parametrize("value", [-1, 1.5, -0.1, "all", True, None])
def test_line_count_restriction_is_validated(value):
    with pytest.raises(UsageError, match="line_count_restriction"):
        AdvancedProfiler(line_count_restriction=value)


def test_deepcopy_and_pickle_while_profiling_keep_settings(tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="f", line_count_restriction=5, dump_stats=True)
    with profiler.profile("running"):
        clones = [copy.deepcopy(profiler), pickle.loads(pickle.dumps(profiler))]
    for clone in clones:
        assert (clone.dirpath, clone.filename, clone.line_count_restriction, clone.dump_stats) == (tmp_path, "f", 5, True)
        assert clone.profiled_actions == {}
        with clone.profile("fresh"):
            busy_inner()
        assert "busy_inner" in _functions(clone, "fresh")


def test_empty_action_is_reported_plainly():
    profiler = AdvancedProfiler()
    profiler.profiled_actions["never_ran"] = __import__("cProfile").Profile()
    assert "No Python function calls were recorded." in profiler.summary()


def test_foreign_profiler_is_warned_about_not_raised():
    """Python >= 3.12 refuses a second active cProfile: a warning, never an error in the loop.
    Before 3.12 the second profiler takes over the hook and records the action."""
    import cProfile

    foreign = cProfile.Profile()
    foreign.enable()
    try:
        profiler = AdvancedProfiler()
        if sys.version_info >= (3, 12):
            with pytest.warns(RuntimeWarning, match="could not record"):
                with profiler.profile("x"):
                    pass
        else:
            with profiler.profile("x"):
                sorted(range(10))
    finally:
        foreign.disable()
    if sys.version_info < (3, 12):
        assert "sorted" in profiler.summary()
