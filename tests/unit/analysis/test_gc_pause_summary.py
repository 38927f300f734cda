"""GC pause summary over the steady state."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from records import make_record
from stepscope.analysis.run.gc_pauses import summarize_gc_pauses
from stepscope.record.run import PHASES, GcPauses


def with_pauses(rows):
    """rows: (step, duration_ns, generation, phase)."""
    pauses = GcPauses(
        enabled=True, start_ns=np.arange(len(rows), dtype=np.int64),
        duration_ns=np.array([row[1] for row in rows], dtype=np.int64),
        generation=np.array([row[2] for row in rows], dtype=np.int64),
        collected=np.full(len(rows), 3, dtype=np.int64), uncollectable=np.zeros(len(rows), dtype=np.int64),
        step=np.array([row[0] for row in rows], dtype=np.int64),
        phase=np.array([PHASES.index(row[3]) for row in rows], dtype=np.int64))
    return replace(make_record(4), gc_pauses=pauses)


def test_share_counts_by_generation_largest_and_pauses_per_step():
    record = with_pauses([(0, 100, 0, "other"), (1, 50, 0, "forward"), (2, 300, 2, "other"), (-1, 999, 2, "other")])
    summary = summarize_gc_pauses(record, np.ones(4, dtype=bool))
    assert summary.measured and summary.count == 3
    assert summary.share_of_step_time == pytest.approx(450 / 4000)
    assert summary.pauses_per_step == pytest.approx(0.75)
    assert [(item.generation, item.count) for item in summary.by_generation] == [(0, 2), (2, 1)]
    assert summary.largest.generation == 2 and summary.largest.step == 2 and summary.largest.phase == "other"
    assert summary.by_phase_s == pytest.approx({"forward": 50e-9, "other": 400e-9})
    assert summary.collected == 9
    assert summary.to_dict()["largest"]["duration_s"] == pytest.approx(300e-9)


def test_steps_outside_the_mask_are_left_out():
    record = with_pauses([(0, 100, 0, "other"), (3, 200, 1, "other")])
    summary = summarize_gc_pauses(record, np.array([False, True, True, True]))
    assert summary.count == 1 and summary.total_s == pytest.approx(200e-9)


def test_unmeasured_is_not_zero():
    summary = summarize_gc_pauses(make_record(4), np.ones(4, dtype=bool))
    assert not summary.measured and summary.share_of_step_time is None and summary.pauses_per_step is None
