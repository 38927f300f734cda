"""`AdvancedProfiler`: one cProfile per action, reported as cumulative-sorted function stats.

Contract:
- One ``cProfile.Profile`` per action name. Only one can be enabled at a time (Python ≥ 3.12
  refuses a second one with "Another profiling tool is already active"; earlier versions silently
  replace it), so nested actions form a stack: starting an inner action pauses the outer one,
  stopping it resumes the outer one (Lightning never resumes it). Time spent in a nested action
  is therefore reported under the inner action only; the report says so when it happened.
- If a profiler outside ours is active, the action is not recorded and one warning says why;
  the user's code never sees the error.
- ``summary()`` renders ``pstats`` sorted by cumulative time, limited by
  ``line_count_restriction`` (an int: that many lines; a float in [0, 1]: that fraction), in
  Lightning's "Profile stats for: <action>[ rank: N]" layout. With ``dump_stats`` each action's
  raw stats are also written to ``dirpath/<stage>-<filename>-<rank>-<action>.prof``; that needs
  ``dirpath`` at construction (checked there, not at the end of a long run).
- ``teardown`` forgets the recorded actions, so a Trainer reports each stage separately.
- Pickling and deepcopy work while profiling; the copy keeps the settings (including
  ``dump_stats``, which Lightning drops) and starts with no recordings.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import warnings
from pathlib import Path

from stepscope.profilers._config import config_error
from stepscope.profilers.profiler import Profiler

__all__ = ["AdvancedProfiler"]

_NESTING_NOTE = "Nested actions: time spent inside an inner action is reported under the inner action only."


class AdvancedProfiler(Profiler):
    """cProfile per action.

    Args:
        dirpath: directory of the report file and of ``.prof`` dumps.
        filename: report file name (``.txt`` added); without it the report goes to the console.
        line_count_restriction: functions listed per action: an int count, or a fraction in [0, 1].
        dump_stats: also write each action's raw cProfile stats (``.prof``, for snakeviz etc.).

    Raises:
        ProfilerConfigError: an invalid ``line_count_restriction``, or ``dump_stats`` without dirpath.
        ValueError: stopping an action that was never started, or starting a running one.
    """

    _transient_state = ("profiled_actions", "_active")

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        line_count_restriction: float = 1.0,
        dump_stats: bool = False,
    ) -> None:
        _check_line_count(line_count_restriction)
        if not isinstance(dump_stats, bool):
            raise config_error(f"AdvancedProfiler: dump_stats must be True or False, got {dump_stats!r}.")
        if dump_stats and not dirpath:
            raise config_error(
                "AdvancedProfiler(dump_stats=True) writes one .prof file per action and needs a directory:"
                " pass dirpath=<directory>."
            )
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self._nested_seen = False
        self._warned_foreign = False
        super().__init__(dirpath=dirpath, filename=filename)
        self._restore_transient_state()

    def _restore_transient_state(self) -> None:
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self._active: list[str] = []

    def start(self, action_name: str) -> None:
        if action_name in self._active:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        if self._active:
            self._nested_seen = True
            self.profiled_actions[self._active[-1]].disable()
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            profile = self.profiled_actions[action_name] = cProfile.Profile()
        self._active.append(action_name)
        self._enable(profile, action_name)

    def stop(self, action_name: str) -> None:
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        if not self._active or action_name not in self._active:
            return
        if self._active[-1] != action_name:  # stopped out of order: it is paused already
            self._active.remove(action_name)
            return
        profile.disable()
        self._active.pop()
        if self._active:
            outer = self._active[-1]
            self._enable(self.profiled_actions[outer], outer)

    def _enable(self, profile: cProfile.Profile, action_name: str) -> None:
        try:
            profile.enable()
        except ValueError as exc:  # another profiling tool is active (Python >= 3.12)
            if not self._warned_foreign:
                self._warned_foreign = True
                warnings.warn(
                    f"AdvancedProfiler could not record {action_name!r}: {exc}. Stop the other profiler"
                    " (e.g. python -m cProfile) to record actions.",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def summary(self) -> str:
        stats: dict[str, str] = {}
        for action_name, profile in self.profiled_actions.items():
            if action_name in self._active:
                profile.disable()
            if self.dump_stats:
                self._dump(action_name, profile)
            stats[action_name] = self._render_action(profile)
        text = self._stats_to_str(stats)
        if self._nested_seen and stats:
            text += os.linesep + _NESTING_NOTE + os.linesep
        return text

    def _render_action(self, profile: cProfile.Profile) -> str:
        buffer = io.StringIO()
        try:
            stats = pstats.Stats(profile, stream=buffer)
        except TypeError:  # no function call was recorded
            return "No Python function calls were recorded." + os.linesep
        stats.strip_dirs().sort_stats("cumulative").print_stats(self.line_count_restriction)
        return buffer.getvalue()

    def _dump(self, action_name: str, profile: cProfile.Profile) -> None:
        assert self.dirpath is not None  # checked in __init__
        directory = Path(self.dirpath)
        directory.mkdir(parents=True, exist_ok=True)
        profile.dump_stats(directory / self._prepare_filename(action_name=action_name, extension=".prof"))

    def teardown(self, stage: str | None) -> None:
        for action_name in self._active:
            self.profiled_actions[action_name].disable()
        super().teardown(stage=stage)
        self._restore_transient_state()
        self._nested_seen = False


def _check_line_count(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise config_error(
            f"AdvancedProfiler: line_count_restriction must be an int (number of lines) or a float in"
            f" [0, 1] (fraction of lines), got {value!r}."
        )
    if isinstance(value, int) and value < 0:
        raise config_error(f"AdvancedProfiler: line_count_restriction must be >= 0 lines, got {value}.")
    if isinstance(value, float) and not 0.0 <= value <= 1.0:
        raise config_error(
            f"AdvancedProfiler: a float line_count_restriction is a fraction and must be in [0, 1], got {value}."
        )
