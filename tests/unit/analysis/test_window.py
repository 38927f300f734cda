"""The steady window: one span for every averaging view of a run."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.run import signals as sig
from stepscope.analysis.run.window import all_steps_window, samples_window, steady_window
from stepscope.record.run import StepTable
from stepscope.record.samples import ProcessInfo

from unit.analysis.test_signals import anon_rows, make


def steps(count: int, step_ns: int = 100) -> StepTable:
    start = np.arange(count, dtype=np.int64) * step_ns
    return StepTable.from_columns({"start_ns": start, "duration_ns": np.full(count, step_ns),
                                   "other_ns": np.full(count, step_ns)})


def test_the_span_starts_after_warm_up_and_excluded_steps_are_holes():
    table = steps(10)
    mask = np.ones(10, dtype=bool)
    mask[:2] = False  # warm-up
    mask[5] = False  # the FLOP-counted step
    window = steady_window(table, mask)
    assert (window.start_ns, window.end_ns) == (200, 1000)
    assert window.holes == ((500, 600),)
    assert window.contains(np.array([150, 250, 550, 650, 1001])).tolist() == [False, True, False, True, False]
    assert window.basis == "steady"


def test_intervals_belong_by_their_midpoint_instants_by_their_moment():
    window = steady_window(steps(10), np.r_[False, np.ones(9, dtype=bool)])
    ts = np.array([0, 180, 300, 1000, 1200])
    assert window.interval_mask(ts).tolist() == [False, True, True, False]  # midpoints 90, 240, 650, 1100
    assert window.instant_mask(ts).tolist() == [False, True, True, True, False]


def test_a_steady_span_without_sampler_intervals_widens_to_every_step_and_says_so():
    table = steps(10, step_ns=10)  # 100 ns of steps
    mask = np.r_[False, False, np.ones(8, dtype=bool)]
    window = steady_window(table, mask, sample_ts_ns=np.array([0, 5, 30]))
    assert window.basis == "all steps" and (window.start_ns, window.end_ns) == (0, 100)
    assert window.mask.tolist() == mask.tolist()  # the steps the step views count stay the steady ones


def test_without_steady_steps_every_step_counts_and_without_steps_the_samples():
    assert steady_window(steps(3), np.zeros(3, dtype=bool)).mask.all()
    assert steady_window(steps(0), np.zeros(0, dtype=bool)) is None
    assert all_steps_window(steps(4)).basis == "all steps"
    window = samples_window(np.array([5, 9]))
    assert (window.start_ns, window.end_ns, window.basis) == (5, 9, "samples")


def test_memory_read_after_the_last_step_is_not_a_point_of_the_trend():
    """The script frees its memory after its last step; the sample read then must not bend the
    trend of a leak into "levels off" (the zoo's memory-leak scenario lost its finding so)."""
    count = 21
    dt = 100_000_000  # the sampler's 10 Hz
    anon = [100 + 10 * index for index in range(count - 1)] + [20]  # the last sample: after the end, freed
    rows = anon_rows(0, range(count), rss=lambda k: anon[k] << 20, anon=lambda k: anon[k] << 20)
    samples = make(count, processes=[ProcessInfo(0, 10, role="main")], proc_rows=rows)
    ts = samples.ts_ns
    table = StepTable.from_columns({"start_ns": np.array([ts[0]]), "duration_ns": np.array([ts[-2] - ts[0] + dt // 2]),
                                    "other_ns": np.array([1])})
    signals = sig.compute_signals(samples, table, all_steps_window(table))
    assert signals.rss_growth_second_half_bytes_per_s >= 0.9 * signals.rss_growth_first_half_bytes_per_s
    with_the_last = sig.memory_trend(samples, np.ones(count, dtype=bool))  # what the interval join took
    assert with_the_last["rss_growth_second_half_bytes_per_s"] < 0.5 * with_the_last["rss_growth_first_half_bytes_per_s"]
