"""The input pipeline over time: epochs (or thirds), and the cold-data signature."""

from __future__ import annotations

from dataclasses import replace

import pytest

from diagnosis_records import ctx_of, make_record
from stepscope.analysis.bundle import StorageSigns
from stepscope.analysis.run.input_profile import InputProfile, InputSegment, cold_start, input_profile
from stepscope.diagnosis.engine import run_rules
from stepscope.diagnosis.rules.storage_io import cold_data

MiB = 2**20
SHARES = {"data_wait": 0.1, "forward": 0.5, "backward": 0.3}


def segment(first, steps, wait_s, reads, step_s=0.01):
    return InputSegment(first, steps, "epoch", wait_s, step_s, reads, 0.0, 0.3)


def test_epochs_come_from_the_workers_start_else_thirds():
    # workers start anew at steps 0, 30 and 60 (loader_init): three epochs
    record = make_record(steps=90, shares=SHARES, num_workers=2, loader_init={0: 0.02, 30: 0.02, 60: 0.02})
    profile = input_profile(record)
    assert [(item.first_step, item.steps, item.kind) for item in profile.segments] == \
        [(0, 30, "epoch"), (30, 30, "epoch"), (60, 30, "epoch")]
    assert profile.segments[1].fetch_wait_s == pytest.approx(0.001)  # worker start-up left out
    thirds = input_profile(make_record(steps=90, shares=SHARES))
    assert [item.kind for item in thirds.segments] == ["third"] * 3


def test_cold_start_needs_a_slower_first_epoch_and_reads_that_fall():
    record = make_record(steps=90, shares=SHARES, num_workers=2)
    cold = InputProfile((segment(0, 30, 0.006, 900 * MiB), segment(30, 30, 0.002, 1 * MiB),
                         segment(60, 30, 0.002, 0.0)))
    found = cold_start(cold, record)
    assert found is not None and found.wait_ratio == pytest.approx(3.0)
    assert found.excess_s == pytest.approx(0.12)  # 4 ms more over 30 steps
    assert found.later_wait_share == pytest.approx(0.2)
    # slower first epoch with no reads: not storage (a warm-up, a JIT, a cache being built)
    assert cold_start(InputProfile((segment(0, 30, 0.006, 0.0), segment(30, 30, 0.002, 0.0))), record) is None
    # reads that do not fall: every epoch reads from disk alike, nothing is "cold"
    assert cold_start(InputProfile((segment(0, 30, 0.006, 900 * MiB), segment(30, 30, 0.002, 800 * MiB))),
                      record) is None
    # the same wait in every epoch: CPU-bound loading, not cold data
    assert cold_start(InputProfile((segment(0, 30, 0.002, 900 * MiB), segment(30, 30, 0.002, 0.0))), record) is None


def test_cold_data_is_storage_whatever_the_cores_did_and_says_what_is_left_once_warm():
    record = make_record(steps=90, shares={"data_wait": 0.3, "forward": 0.4, "backward": 0.2}, num_workers=2,
                         added={index: {"data_wait": 0.006} for index in range(1, 30)})  # the cold epoch
    # all cores busy: the loaders' CPU is not conclusive, which alone would be "CPU-bound or storage"
    ev = ctx_of(record, dict(cpu_count=2, data_wait_cpu_util=0.2, cpu_util_mean=0.97))
    profile = InputProfile((segment(0, 30, 0.009, 900 * MiB), segment(30, 30, 0.003, 0.0),
                            segment(60, 30, 0.003, 0.0)))
    ev = replace(ev, storage=StorageSigns(None, True, 3.0, profile, cold_start(profile, record)))
    finding = cold_data(ev)
    assert finding.family == "storage_io" and "first epoch" in finding.title and "900 → 0 MiB/s" in finding.title
    assert finding.partial and "that part is not storage" in finding.summary
    families = [item.family for item in run_rules(ev).findings]
    assert "storage_io" in families and "input_pipeline" in families  # the warm 30 % stays reported


def test_no_cold_finding_without_the_signature():
    ev = ctx_of(make_record(steps=90, shares=SHARES, num_workers=2), dict(cpu_count=2, cpu_util_mean=0.5))
    assert cold_data(ev) is None
