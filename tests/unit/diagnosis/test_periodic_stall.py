from __future__ import annotations

import pytest

from diagnosis_records import ctx_of, make_record
from stepscope.diagnosis.rules.periodic_stall import recurring_slow_steps


def every(period: int, phase: str, seconds: float, steps: int = 60, start: int = 5) -> dict:
    return {index: {phase: seconds} for index in range(start, steps, period)}


@pytest.mark.parametrize("kwargs, fires, phase", [
    (dict(added=every(10, "other", 0.05)), True, "other"),  # checkpoint every 10 steps
    (dict(added=every(7, "forward", 0.04)), True, "forward"),  # evaluation every 7 steps
    (dict(loader_init={i: 0.08 for i in range(12, 60, 12)}, num_workers=2), True, "loader_init"),
    (dict(added={13: {"other": 0.05}, 41: {"other": 0.05}}), False, None),  # two spikes: no pattern
    (dict(added=every(10, "other", 0.002)), False, None),  # too small to matter
    (dict(added={i: {"other": 0.05} for i in (5, 6, 20, 33, 34, 35, 51)}), False, None),  # irregular
])
def test_recurring_slow_steps(kwargs, fires, phase):
    finding = recurring_slow_steps(ctx_of(make_record(steps=60, **kwargs)))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "periodic_stall"
        assert dict((item.metric, item.value) for item in finding.evidence)["stall_phase"] == phase


def test_period_and_cost():
    finding = recurring_slow_steps(ctx_of(make_record(steps=60, added=every(10, "other", 0.05))))
    assert finding.extra["period_steps"] == 10
    # 6 stalls of 50 ms over 59 steady steps of 10 ms + 300 ms
    assert finding.impact == pytest.approx(0.3 / (0.59 + 0.3), abs=0.02)
    assert "Every 10 steps" in finding.title


def test_epoch_restarts_prescribe_persistent_workers():
    record = make_record(steps=60, num_workers=2, loader_init={i: 0.08 for i in range(12, 60, 12)})
    finding = recurring_slow_steps(ctx_of(record))
    assert finding.prescriptions[0].setting == "persistent_workers"


def test_worker_round_robin_is_not_a_stall():
    # 4 workers deliver in turn: every 4th batch waits; the input pipeline's pattern
    record = make_record(steps=60, num_workers=4, added=every(4, "data_wait", 0.05))
    assert recurring_slow_steps(ctx_of(record)) is None
    record = make_record(steps=60, num_workers=2, added=every(4, "data_wait", 0.05))
    assert recurring_slow_steps(ctx_of(record)) is not None


def test_a_few_aligned_spikes_are_not_a_period():
    # 3 spikes two steps apart in a 60-step run: a period of 2 would predict ~30
    record = make_record(steps=60, added={20: {"forward": 0.03}, 22: {"forward": 0.03}, 24: {"forward": 0.03}})
    assert recurring_slow_steps(ctx_of(record)) is None


def test_the_models_phases_stall_on_exact_step_counts():
    # 6, 7, 6, 8 ... steps apart: a timer or another process, not an evaluation every N steps
    jittered = {index: {"backward": 0.04} for index in (5, 11, 18, 24, 32, 38, 45, 51, 58)}
    assert recurring_slow_steps(ctx_of(make_record(steps=60, added=jittered))) is None
    # the same jitter outside the model (a time-based checkpoint or log) is still a period
    timed = {index: {"other": 0.04} for index in jittered}
    finding = recurring_slow_steps(ctx_of(make_record(steps=60, added=timed)))
    assert finding is not None and finding.extra["period_steps"] in (6, 7)


def test_restarted_workers_short_epochs_are_the_boundary_s_and_their_catch_up_keeps_the_workers():
    # workers started anew every 6 steps: the epoch-start steps wait 50 ms for the first batch, and three
    # steps later the new worker, not caught up yet, holds the step 20 ms more
    starts = range(6, 60, 6)
    waits = {**{step: {"data_wait": 0.05} for step in starts}, **{step + 3: {"data_wait": 0.02} for step in starts}}
    kwargs = dict(steps=63, num_workers=1, loader_init={step: 0.002 for step in starts}, added=waits)
    evidence = ctx_of(make_record(**kwargs))
    stall = evidence.stall
    # the starts' own wait is the epoch boundary's: the stall is the catch-up steps alone
    assert (stall.phase, stall.period_steps) == ("data_wait", 6) and not set(stall.slow_steps) & set(starts)
    finding = recurring_slow_steps(evidence)
    assert finding.prescriptions[0].setting == "persistent_workers" and "catching up" in finding.summary
    assert finding.impact < 0.2
    # kept workers: the same waits every 3 steps are a data source's, the starts included
    kept = ctx_of(make_record(**kwargs, persistent=True))
    assert (kept.stall.phase, kept.stall.period_steps) == ("data_wait", 3) and set(starts) <= set(kept.stall.slow_steps)
    assert recurring_slow_steps(kept).prescriptions[0].action.startswith("Raise prefetch_factor")
