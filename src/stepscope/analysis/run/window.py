"""The steady window: the one span every run view averages over.

The steady state (:func:`~stepscope.analysis.run.steady.steady_state`) decides which steps are
warm-up and which are excluded (the FLOP-counted step, torch.profiler windows). Every view of a run
that averages — the sampler's signals, code attribution, collector pauses, periodic stalls, the
loaders' CPU — takes that decision through one :class:`SteadyWindow`, so all of
:class:`~stepscope.analysis.bundle.RunEvidence` covers the same steps.

How a sample belongs to the window, step by step:

1. The window's *span* runs from the start of the first steady step to the end of the last one.
   Warm-up before it and tear-down after it are out.
2. A non-steady step inside the span (an excluded step) is a hole in the window.
3. A sampler *interval* (between two consecutive samples; counters are differenced over it)
   belongs to the window when its midpoint lies in the span and not in a hole. A sampler *instant*
   (a level such as the resident memory, read at one moment) belongs when its timestamp does: a
   sample read after the last step — when the script has already freed its memory — is out even
   when the interval that ends there is in.
4. A run whose steady span holds fewer than :data:`MIN_INTERVALS` sample intervals (a run of a
   fraction of a second) uses every step's span instead, and says so in :attr:`SteadyWindow.basis`
   — a handful of samples is no average.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from stepscope.record.run import StepTable

#: Fewer sampler intervals than this inside the steady span: the window widens to every step.
MIN_INTERVALS = 2

Basis = Literal["steady", "all steps", "samples"]


@dataclass(frozen=True)
class SteadyWindow:
    """The steady steps of a run and the span of time they cover (see the module docstring)."""

    mask: np.ndarray = field(repr=False)  # per step: steady
    start_ns: int
    end_ns: int
    #: (start, end) of the non-steady steps inside the span, sorted by start
    holes: tuple[tuple[int, int], ...] = ()
    basis: Basis = "steady"

    @property
    def span_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    def contains(self, ts_ns: np.ndarray) -> np.ndarray:
        """Whether each timestamp lies in the window (in the span, not in a hole)."""
        ts = np.asarray(ts_ns)
        inside: np.ndarray = (ts >= self.start_ns) & (ts <= self.end_ns)
        if self.holes and inside.any():
            starts = np.array([start for start, _ in self.holes], dtype=np.int64)
            ends = np.array([end for _, end in self.holes], dtype=np.int64)
            index = np.searchsorted(starts, ts, side="right") - 1
            in_hole = (index >= 0) & (ts < ends[np.clip(index, 0, len(ends) - 1)])
            inside &= ~in_hole
        return inside

    def interval_mask(self, ts_ns: np.ndarray) -> np.ndarray:
        """For each interval between consecutive samples, whether its midpoint is in the window."""
        ts = np.asarray(ts_ns, dtype=np.int64)
        if len(ts) < 2:
            return np.zeros(0, dtype=bool)
        return self.contains(ts[:-1] + (ts[1:] - ts[:-1]) // 2)

    def instant_mask(self, ts_ns: np.ndarray) -> np.ndarray:
        """For each sample, whether the moment it was read is in the window."""
        return self.contains(np.asarray(ts_ns, dtype=np.int64))


def steady_window(steps: StepTable, mask: np.ndarray, sample_ts_ns: np.ndarray | None = None) -> SteadyWindow | None:
    """The window of the steady steps ``mask`` of ``steps`` (None without steps).

    With ``sample_ts_ns`` (the sampler's timestamps), a steady span too short to hold
    :data:`MIN_INTERVALS` intervals widens to every step (``basis="all steps"``).
    """
    if not len(steps):
        return None
    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        mask = np.ones(len(steps), dtype=bool)
    window = _window(steps, mask, "steady")
    if sample_ts_ns is not None and len(sample_ts_ns) > 1 \
            and int(window.interval_mask(sample_ts_ns).sum()) < MIN_INTERVALS and not mask.all():
        window = _window(steps, np.ones(len(steps), dtype=bool), "all steps", steady=mask)
    return window


def all_steps_window(steps: StepTable) -> SteadyWindow | None:
    """Every step as the window (for views of a record whose steady state is not known)."""
    if not len(steps):
        return None
    return _window(steps, np.ones(len(steps), dtype=bool), "all steps")


def span_window(start_ns: int, end_ns: int) -> SteadyWindow:
    """A plain span of time (a part of the run, e.g. one epoch of the input profile)."""
    return SteadyWindow(np.zeros(0, dtype=bool), int(start_ns), int(end_ns), (), "steady")


def samples_window(ts_ns: np.ndarray) -> SteadyWindow:
    """The whole sampled time (a run without steps)."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    start, end = (int(ts[0]), int(ts[-1])) if len(ts) else (0, 0)
    return SteadyWindow(np.zeros(0, dtype=bool), start, end, (), "samples")


def _window(steps: StepTable, span_mask: np.ndarray, basis: Basis, steady: np.ndarray | None = None) -> SteadyWindow:
    starts = np.asarray(steps.start_ns, dtype=np.int64)
    ends = starts + np.asarray(steps.duration_ns, dtype=np.int64)
    chosen = np.flatnonzero(span_mask)
    start, end = int(starts[chosen].min()), int(ends[chosen].max())
    inside = (starts >= start) & (ends <= end)
    holes = np.flatnonzero(inside & ~span_mask)
    order = holes[np.argsort(starts[holes], kind="stable")]
    return SteadyWindow(span_mask if steady is None else steady, start, end,
                        tuple((int(starts[i]), int(ends[i])) for i in order), basis)
