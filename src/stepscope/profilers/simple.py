"""`SimpleProfiler`: wall-clock duration of every action, reported as Lightning's table.

Contract:
- ``start``/``stop`` time actions with ``time.perf_counter``; starting a running action or
  stopping one that is not running raises ``ValueError`` with Lightning's messages. Durations
  accumulate in ``recorded_durations[action]`` (a list per action, summed with ``math.fsum``)
  for the profiler's whole life, across Trainer stages, as in Lightning.
- The report (:func:`make_simple_report`, pure) has, per action, the mean, the number of calls,
  the total and the share of Total, sorted by share (extended) or by mean (not extended).
  Total is the wall-clock time since the profiler was created.
- The text (:func:`render_simple_report`) is Lightning's table, character for character, followed
  by a note saying what Total means and, when actions nest, that the rows add up to more than it
  (Lightning issue #15334). With no actions recorded it says so (Lightning prints only the
  title, or raises when not extended).
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from stepscope.profilers.profiler import Profiler

__all__ = ["SimpleProfiler", "SimpleReport", "SimpleReportRow", "make_simple_report", "render_simple_report"]

_perf_counter = time.perf_counter


@dataclass(frozen=True)
class SimpleReportRow:
    action: str
    mean_s: float
    calls: int
    total_s: float
    share_percent: float


@dataclass(frozen=True)
class SimpleReport:
    stage: str | None
    extended: bool
    rows: tuple[SimpleReportRow, ...]
    total_calls: int
    wall_time_s: float

    @property
    def share_sum_percent(self) -> float:
        return math.fsum(row.share_percent for row in self.rows)


def make_simple_report(
    durations: dict[str, list[float]], wall_time_s: float, stage: str | None, extended: bool
) -> SimpleReport:
    """Summarise recorded durations; rows sorted by share (extended) or mean, descending."""
    rows = []
    for action, values in durations.items():
        if not values:
            continue
        total = math.fsum(values)
        share = 100.0 * total / wall_time_s if wall_time_s > 0 else 0.0
        rows.append(SimpleReportRow(action, total / len(values), len(values), total, share))
    rows.sort(key=(lambda row: row.share_percent) if extended else (lambda row: row.mean_s), reverse=True)
    return SimpleReport(stage, extended, tuple(rows), sum(row.calls for row in rows), wall_time_s)


def render_simple_report(report: SimpleReport) -> str:
    """Lightning's SimpleProfiler table, then our note on what Total means."""
    sep = os.linesep
    out = (f"{report.stage.upper()} " if report.stage is not None else "") + f"Profiler Report{sep}"
    if not report.rows:
        return out + f"{sep}No actions were recorded.{sep}"
    width = max(len(row.action) for row in report.rows)

    def line(*cells: str) -> str:
        first, rest = cells[0], cells[1:]
        return f"{sep}|  {first:<{width}s}\t|" + "".join(f"  {cell:<15}\t|" for cell in rest)

    if report.extended:
        header = line("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
    else:
        header = line("Action", "Mean duration (s)", "Total time (s)")
    rule = f"{sep}{'-' * len(header.expandtabs())}"
    out += rule + header + rule
    if report.extended:
        out += line("Total", "-", f"{report.total_calls}", f"{report.wall_time_s:.5}", "100 %") + rule
        for row in report.rows:
            cells = (f"{row.mean_s:.5}", f"{row.calls}", f"{row.total_s:.5}", f"{row.share_percent:.5}")
            out += line(row.action, *cells)
    else:
        for row in report.rows:
            out += line(row.action, f"{row.mean_s:.5}", f"{row.total_s:.5}")
    out += rule + sep
    return out + _render_note(report)


def _render_note(report: SimpleReport) -> str:
    sep = os.linesep
    note = f"Total = wall-clock time since the profiler was created ({report.wall_time_s:.5} s)."
    share_sum = report.share_sum_percent
    if share_sum > 100.5:
        note += (
            f"{sep}The rows add up to {share_sum:.0f} % of Total because actions nest: time spent in an"
            f" inner action is also counted in every action around it."
        )
    return note + sep


class _TimedScope:
    """``profile()``'s context manager for SimpleProfiler: the timing inlined, no extra calls."""

    __slots__ = ("_profiler", "_name")

    def __init__(self, profiler: SimpleProfiler, name: str) -> None:
        self._profiler = profiler
        self._name = name

    def __enter__(self) -> str:
        name = self._name
        current = self._profiler.current_actions
        if name in current:
            raise ValueError(f"Attempted to start {name} which has already started.")
        current[name] = _perf_counter()
        return name

    def __exit__(self, *exc_info: object) -> None:
        end = _perf_counter()
        profiler = self._profiler
        try:
            begin = profiler.current_actions.pop(self._name)
        except KeyError:
            raise ValueError(
                f"Attempting to stop recording an action ({self._name}) which was never started."
            ) from None
        profiler.recorded_durations[self._name].append(end - begin)


class SimpleProfiler(Profiler):
    """Records the duration of each action; reports mean and total per action.

    Args:
        dirpath: directory of the report file (see :class:`Profiler`).
        filename: report file name (``.txt`` added); without it the report goes to the console.
        extended: add the number of calls and the percentage of Total per action.

    Raises:
        ProfilerConfigError: ``extended`` is not a bool.
        ValueError: starting an action that is running, or stopping one that is not.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None, extended: bool = True) -> None:
        if not isinstance(extended, bool):
            from stepscope.profilers._config import config_error

            raise config_error(f"SimpleProfiler: extended must be True or False, got {extended!r}.")
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: defaultdict[str, list[float]] = defaultdict(list)
        self.extended = extended
        self.start_time = _perf_counter()
        super().__init__(dirpath=dirpath, filename=filename)

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self.current_actions[action_name] = _perf_counter()

    def stop(self, action_name: str) -> None:
        end = _perf_counter()
        if action_name not in self.current_actions:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        self.recorded_durations[action_name].append(end - self.current_actions.pop(action_name))

    def _make_scope(self, action_name: str) -> object:
        cls = type(self)
        if cls.start is SimpleProfiler.start and cls.stop is SimpleProfiler.stop:
            return _TimedScope(self, action_name)
        return super()._make_scope(action_name)

    def report(self) -> SimpleReport:
        """The report data as of now (pure data; :meth:`summary` renders it)."""
        wall = _perf_counter() - self.start_time
        return make_simple_report(self.recorded_durations, wall, self._stage, self.extended)

    def summary(self) -> str:
        return render_simple_report(self.report())
