"""Periodic stalls and the neighbour test: whose CPU stalled the step (synthetic records)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from diagnosis_records import ctx_of, make_record
from stepscope.analysis.bundle import build_evidence
from stepscope.analysis.run.stalls import _per_step, outside_cores_per_step
from stepscope.diagnosis.engine import run_rules
from stepscope.record.samples import SamplesBuilder

TICKS = 100
INTERVAL_NS = 10_000_000  # 10 ms samples on 10 ms steps: the arithmetic stays readable


def samples_beside(record, outside: dict[int, float], tree_cores: float = 1.8, steal: dict[int, float] | None = None,
                   tree_steps: dict[int, float] | None = None):
    """Samples over the record's steps: the tree uses ``tree_cores`` (less what the outside takes),
    ``outside`` maps step index -> cores busy outside the tree during it, ``steal`` -> cores stolen."""
    steps = record.steps
    builder = SamplesBuilder({"cpu_count": 2, "cpus": [0, 1], "clock_ticks_per_s": TICKS, "interval_s": 0.01})
    builder.add_event({"type": "process", "id": 0, "pid": 100, "role": "main"})
    start, end = int(steps.start_ns[0]), int((steps.start_ns + steps.duration_ns).max())
    user = system = idle = iowait = stolen = 0.0
    tree = 0.0
    for ts in range(start, end + INTERVAL_NS, INTERVAL_NS):
        index = int(np.searchsorted(steps.start_ns, ts, side="right") - 1)
        others = outside.get(index, 0.0)
        taken = (steal or {}).get(index, 0.0)
        ours = max(0.0, min((tree_steps or {}).get(index, tree_cores), 2.0 - others - taken))
        seconds = INTERVAL_NS / 1e9
        builder.add({"ts_ns": ts, "cpu_user": [round(user / 2)] * 2, "cpu_system": [0, 0],
                     "cpu_idle": [round(idle / 2)] * 2, "cpu_iowait": [0, 0], "cpu_steal": [round(stolen / 2)] * 2,
                     "proc": {"id": [0], "cpu_ticks": [round(tree)], "rss_bytes": [1], "read_bytes": [-1],
                              "write_bytes": [-1], "read_chars": [-1], "threads": [4], "state": ["R"]}})
        user += (ours + others) * seconds * TICKS * 1000
        idle += max(0.0, 2.0 - ours - others - taken) * seconds * TICKS * 1000
        stolen += taken * seconds * TICKS * 1000
        tree += ours * seconds * TICKS * 1000
    # counters in thousandths of a tick, so rounding does not hide a fraction of a core
    samples = builder.freeze()
    return dataclasses.replace(samples, meta=dataclasses.replace(samples.meta, clock_ticks_per_s=TICKS * 1000))


def every(period: int, seconds: float, steps: int = 60, start: int = 5) -> dict:
    return {index: {"backward": seconds} for index in range(start, steps, period)}


def with_samples(record, samples):
    return dataclasses.replace(record, samples=samples)


def test_per_step_mean_weighs_each_interval_by_its_overlap():
    ts = np.array([0, 10, 20, 30])
    rates = np.array([1.0, 3.0, np.nan])
    steps = make_record(steps=3).steps
    steps = dataclasses.replace(steps, start_ns=np.array([0, 5, 15]), duration_ns=np.array([10, 10, 10]))
    result = _per_step(ts, rates, steps)
    assert result[0] == pytest.approx(1.0) and result[1] == pytest.approx(2.0)
    assert result[2] == pytest.approx(3.0)  # only the known part of the step counts


def test_outside_cores_read_other_processes_and_steal():
    record = make_record(steps=20)
    samples = samples_beside(record, outside={5: 1.0}, steal={9: 0.5})
    outside, tree = outside_cores_per_step(samples, record.steps)
    assert outside[5] == pytest.approx(1.0, abs=0.15) and outside[9] == pytest.approx(0.5, abs=0.15)
    assert outside[12] == pytest.approx(0.0, abs=0.05) and tree[12] == pytest.approx(1.8, abs=0.05)


def test_a_neighbours_bursts_are_the_neighbours_not_the_loops():
    stalls = every(7, 0.01)
    record = make_record(steps=60, added=stalls)
    record = with_samples(record, samples_beside(record, outside={index: 1.0 for index in stalls}))
    ev = build_evidence(record)
    assert ev.stall is not None and ev.stall.neighbour, ev.stall
    assert ev.stall.outside_correlation > 0.9
    findings = run_rules(ev).findings
    assert findings[0].rule_id == "foreign_load.neighbour_bursts", [item.rule_id for item in findings]
    assert findings[0].title.startswith("Other processes used the cores in bursts every ~0.1 s")
    assert not any(item.family == "periodic_stall" for item in findings)


def test_the_loops_own_stall_beside_a_quiet_machine_stays_a_periodic_stall():
    record = make_record(steps=60, added=every(7, 0.01))
    record = with_samples(record, samples_beside(record, outside={}))
    ev = build_evidence(record)
    assert ev.stall is not None and not ev.stall.neighbour
    assert [item.family for item in run_rules(ev).findings][0] == "periodic_stall"


def test_a_busy_neighbour_that_does_not_follow_the_stalls_leaves_them_to_the_loop():
    # a neighbour busy all along (not in bursts): the stalls are the loop's own
    record = make_record(steps=60, added=every(7, 0.01))
    record = with_samples(record, samples_beside(record, outside={index: 0.6 for index in range(60)}))
    ev = build_evidence(record)
    assert ev.stall is not None and not ev.stall.neighbour
    assert any(item.family == "periodic_stall" for item in run_rules(ev).findings)


def test_steal_counts_as_load_outside_the_run():
    record = make_record(steps=30)
    samples = samples_beside(record, outside={}, tree_cores=1.2, steal={index: 0.7 for index in range(30)})
    ev = build_evidence(with_samples(record, samples))
    assert ev.signals.steal_share == pytest.approx(0.35, abs=0.03)
    assert ev.foreign.steal_share == pytest.approx(0.35, abs=0.03)
    finding = next(item for item in run_rules(ev).findings if item.rule_id == "foreign_load.other_processes")
    assert "other virtual machines 35% (hypervisor steal)" in finding.title


def test_the_jobs_other_rank_on_this_machine_is_not_a_neighbour():
    # rank 1 (same machine) burns a core in the stalled steps: rank 0 sees that CPU outside its own
    # tree, but it is the job's, not a neighbour's
    stalls = every(7, 0.01)
    record = make_record(steps=60, added=stalls)
    rank0 = with_samples(record, samples_beside(record, outside={index: 1.0 for index in stalls}))
    rank1 = dataclasses.replace(with_samples(record, samples_beside(record, outside={}, tree_cores=0.0,
                                                                    tree_steps={index: 1.0 for index in stalls})),
                                meta=dataclasses.replace(record.meta, rank=1))
    alone = build_evidence(rank0)
    assert alone.stall.neighbour  # without the job's view, the bursts look like a neighbour's
    in_job = build_evidence(rank0, ranks=(rank0, rank1))
    assert in_job.stall is not None and not in_job.stall.neighbour, in_job.stall
    unsampled = build_evidence(rank0, ranks=(rank0, dataclasses.replace(rank1, samples=None)))
    assert not unsampled.stall.neighbour and "without samples" in unsampled.stall.notes[0]
