from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from stepscope.analysis.evidence import StepShares, SyncsAndCopies

from diagnosis_records import ctx_of, make_record
from stepscope.diagnosis.engine import Diagnosis, merge_findings
from stepscope.diagnosis.rules import _common as common
from stepscope.diagnosis.rules.communication import exposed_collectives
from stepscope.diagnosis.rules.host_device_sync import sync_and_copies
from stepscope.diagnosis.rules.straggler import slow_rank
from stepscope.record.run import StepTable


@pytest.mark.parametrize("trace, fires", [
    (dict(device="NVIDIA A100", syncs=SyncsAndCopies(sync_share=0.12, syncs_per_step=3.0)), True),
    (dict(device="NVIDIA A100", shares=StepShares(memcpy=0.2), syncs=SyncsAndCopies(pageable_memcpy_share=0.2)), True),
    (dict(device="NVIDIA A100", shares=StepShares(memcpy=0.01), syncs=SyncsAndCopies(sync_share=0.01)), False),
    (dict(device=None, syncs=SyncsAndCopies(sync_share=0.5)), False),  # CPU-only trace: no device to sync with
    (None, False),
])
def test_sync_and_copies(trace, fires):
    finding = sync_and_copies(ctx_of(make_record(), trace=trace))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "host_device_sync"


def test_pageable_copies_prescribe_pinned_memory():
    trace = dict(device="NVIDIA A100", shares=StepShares(memcpy=0.2), syncs=SyncsAndCopies(pageable_memcpy_share=0.2))
    finding = sync_and_copies(ctx_of(make_record(num_workers=2), trace=trace))
    assert any(item.setting == "pin_memory" and item.suggested is True for item in finding.prescriptions)


@pytest.mark.parametrize("trace, fires, impact", [
    (dict(shares=StepShares(communication=0.4), comm_overlap=0.25, exposed_communication=0.3), True, 0.3),
    (dict(shares=StepShares(communication=0.2)), True, 0.2),
    (dict(shares=StepShares(communication=0.05)), False, None),
    (None, False, None),
])
def test_exposed_collectives(trace, fires, impact):
    finding = exposed_collectives(ctx_of(make_record(), trace=trace))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "communication"
        assert finding.impact == pytest.approx(impact)


def rank(index: int, data_wait: float) -> object:
    return make_record(rank=index, shares={"data_wait": data_wait, "forward": 0.3, "backward": 0.3})


@pytest.mark.parametrize("waits, fires", [
    ((0.05, 0.05, 0.30, 0.05), True),
    ((0.05, 0.05, 0.052, 0.05), False),
    ((0.05,), False),
])
def test_slow_rank(waits, fires):
    ranks = tuple(rank(index, wait) for index, wait in enumerate(waits))
    finding = slow_rank(ctx_of(ranks[0], ranks=ranks))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "straggler"
        assert finding.rank == 2
        assert "Rank 2" in finding.title


def test_backward_skew_is_not_a_straggler():
    # all-reduce equalises backward: skew there says nothing about who is slow (TraceML #252)
    ranks = tuple(make_record(rank=index, shares={"forward": 0.3, "backward": 0.3 + 0.3 * (index == 1)})
                  for index in range(3))
    assert slow_rank(ctx_of(ranks[0], ranks=ranks)) is None


def _found(rule_id: str, family: str, impact: float, rank: int | None = None, causes: tuple[str, ...] = ()):
    return common.finding(rule_id, family, rule_id, impact, 0.9, [], [], rank=rank, cause_families=causes)


def test_a_job_s_findings_rank_by_cost_with_a_straggler_before_its_own_cause():
    straggler = _found("straggler.slow_rank", "straggler", 0.25, rank=1, causes=("outside_model",))
    loading = _found("input_pipeline.loader_cpu_bound", "input_pipeline", 0.64)
    chore = _found("outside_model.other_dominates", "outside_model", 0.29)
    merged = merge_findings([(0, Diagnosis((loading, straggler))), (1, Diagnosis((loading, chore, straggler)))])
    # every rank loses more to its loading than the job loses to rank 1's chore: loading first; the
    # chore is why rank 1 straggles, and the straggler (the job's view of it) comes before it
    assert [item.rule_id for item in merged] == [
        "input_pipeline.loader_cpu_bound", "straggler.slow_rank", "outside_model.other_dominates"]
    assert merged[2].cause_of == "straggler.slow_rank" and merged[0].ranks == (0, 1)


def _waiting_in_collectives(record, seconds: float):
    """``record`` with ``seconds`` of every step spent waiting in collectives (added to the step)."""
    columns = record.steps.columns()
    columns["communication_ns"] = np.full(len(record.steps), int(seconds * 1e9))
    columns["duration_ns"] = columns["duration_ns"] + columns["communication_ns"]
    columns["start_ns"] = 10**9 + np.concatenate(([0], np.cumsum(columns["duration_ns"])[:-1]))
    return replace(record, steps=StepTable.from_columns(columns))


def test_a_straggler_costs_the_job_what_the_others_wait_beyond_its_own_wait():
    # rank 1 loads 2.5 ms a step longer; rank 0 waits 1.5 ms for it in collectives, rank 1 0.2 ms
    ranks = tuple(_waiting_in_collectives(make_record(rank=index, shares={
        "data_wait": 0.05 + 0.25 * index, "forward": 0.3, "backward": 0.3}), 0.0015 if index == 0 else 0.0002)
        for index in range(2))
    evidence = ctx_of(ranks[0], ranks=ranks)
    finding = slow_rank(evidence)
    assert finding is not None and finding.rank == 1
    step = max(item.steady.step_time_mean_s for item in evidence.ranks)
    lost = next(item.value for item in finding.evidence if item.metric == "lost_s_per_step")
    assert lost == pytest.approx(0.0025, abs=1e-4)
    assert finding.impact == pytest.approx((0.0015 - 0.0002) / step, abs=0.002)  # not lost / step


def _straggler_asleep(on_cpu: float, tree_cores: tuple[float, float]):
    """Rank 1 spends 30 % of its step in "other" (on a CPU ``on_cpu`` of it), rank 0 waits for it in
    collectives; their process trees use ``tree_cores`` of the 2 cores."""
    shares = ({"data_wait": 0.1, "forward": 0.45, "backward": 0.45},
              {"data_wait": 0.1, "forward": 0.3, "backward": 0.3})  # the rest, 30 %, is "other"
    ranks = tuple(_waiting_in_collectives(make_record(rank=index, shares=shares[index]), 0.004 if index == 0 else 0.0002)
                  for index in range(2))
    evidence = ctx_of(ranks[0], ranks=ranks)
    job = tuple(replace(item, on_cpu={"other": on_cpu}, tree_cores=tree_cores[item.rank], machine_cores=2)
                for item in evidence.ranks)
    return slow_rank(replace(evidence, ranks=job)), job


def test_a_straggler_asleep_while_the_job_keeps_the_cores_busy_states_its_lower_end():
    """Asleep (5 % on CPU) while both ranks' trees keep 1.8 of 2 cores busy: taking the sleep out
    gives back at most the idle 10 % and its on-CPU part; the cost (what rank 0 waits) stands, with
    that lower end beside it."""
    finding, job = _straggler_asleep(0.05, (0.9, 0.9))
    assert finding is not None and finding.rank == 1
    step = max(item.steady.step_time_mean_s for item in job)
    charged = finding.impact * step
    low = finding.extra["impact_low"]
    assert low["value"] == pytest.approx(0.1 + charged * 0.05 / (2 * step), abs=1e-3)
    assert "90% of its machine's cores busy" in low["why"]
    assert any(item.metric == "straggler_cost_low" for item in finding.evidence)


def test_a_straggler_beside_idle_cores_has_no_lower_end_and_its_computing_counts_over_the_cores():
    idle, _ = _straggler_asleep(0.05, (0.3, 0.3))  # 70 % of the cores idle: nothing bounds the cost
    assert idle is not None and "impact_low" not in idle.extra
    computing, _ = _straggler_asleep(1.0, (0.9, 0.9))  # on a CPU throughout: its time frees a core
    assert computing.extra["impact_low"]["value"] == pytest.approx(0.1 + computing.impact / 2, abs=1e-3)


def _floor(share: float, step_s: float):
    from stepscope.analysis.run.loader_floor import LoaderFloor

    return LoaderFloor(loader_id=1, workers=1, batches=40, wall_s=share * step_s, cpu_s=share * step_s, runq_s=0.0,
                       blocked_s=0.0, floor_s=share * step_s, share=share, step_s=step_s, pace_share=share, busy=0.9,
                       runq_measured=True)


def test_a_straggler_s_own_work_saves_at_most_what_lies_above_its_loader_floor():
    """Rank 1's chore (30 % of its step, rank 0 waiting for it, charged 21 %): with rank 1's workers
    measured at 85 % of its step, taking the chore out makes rank 1 wait for its own data; the job
    saves at most the 15 % above that floor, as rank 1's own finding of the chore says (blind w016 of
    seed 1650520568)."""
    finding, job = _straggler_asleep(0.05, (0.3, 0.3))
    assert finding is not None and finding.impact > 0.2
    step = job[1].steady.step_time_mean_s
    floored = tuple(replace(item, floor=_floor(0.85, step) if item.rank == 1 else None) for item in job)
    shares = ({"data_wait": 0.1, "forward": 0.45, "backward": 0.45}, {"data_wait": 0.1, "forward": 0.3, "backward": 0.3})
    ranks = tuple(_waiting_in_collectives(make_record(rank=index, shares=shares[index]), 0.004 if index == 0 else 0.0002)
                  for index in range(2))
    capped = slow_rank(replace(ctx_of(ranks[0], ranks=ranks), ranks=floored))
    assert capped is not None and capped.impact == pytest.approx(0.15, abs=1e-4)
    assert capped.extra["capped_by_loader"] == pytest.approx(0.15, abs=1e-4)
    assert capped.extra["impact_uncapped"] == finding.impact
    assert capped.title.endswith("(at most 15% to gain: rank 1's DataLoader sets the pace)"), capped.title
    assert "Rank 1's DataLoader sets a floor" in capped.summary
    assert capped.extra["impact_low"]["value"] == pytest.approx(0.05, abs=1e-4)  # the cap less the pace's margin
    # a floor above which the chore fits whole changes nothing
    loose = tuple(replace(item, floor=_floor(0.5, step) if item.rank == 1 else None) for item in job)
    assert slow_rank(replace(ctx_of(ranks[0], ranks=ranks), ranks=loose)).impact == finding.impact


def test_a_straggler_waiting_for_its_own_data_is_not_capped_by_that_loader():
    ranks = tuple(rank(index, wait) for index, wait in enumerate((0.05, 0.30)))
    evidence = ctx_of(ranks[0], ranks=ranks)
    plain = slow_rank(evidence)
    step = evidence.ranks[1].steady.step_time_mean_s
    floored = tuple(replace(item, floor=_floor(0.9, step)) for item in evidence.ranks)
    finding = slow_rank(replace(evidence, ranks=floored))
    assert finding is not None and finding.extra.get("phase") == "data_wait" and "capped_by_loader" not in finding.extra
    assert finding.impact == plain.impact


def test_a_straggler_claims_its_slow_phase_beside_the_others_wait():
    """On the slow rank the straggler's cost is its slow phase: a chore outside the model claimed as a
    data wait too would absorb that rank's own loader finding in the partition of the step (blind
    w016 of seed 1650520568: rank 1's CPU-bound loading vanished from the job's report)."""
    chore, _ = _straggler_asleep(1.0, (0.3, 0.3))
    assert chore.claims == ("communication", "other")
    loading = slow_rank(ctx_of(rank(0, 0.05), ranks=(rank(0, 0.05), rank(1, 0.30))))
    assert loading.claims == ("communication", "data_wait")
    from stepscope.diagnosis.engine import _partition_costs

    loader = common.finding("input_pipeline.loader_cpu_bound", "input_pipeline", "loading", 0.1, 0.9, [], [],
                            claims=("data_wait",))
    evidence = ctx_of(rank(1, 0.1))
    kept, absorbed = _partition_costs([replace(chore, impact=0.3), loader], evidence)
    assert [item.rule_id for item in kept] == ["straggler.slow_rank", "input_pipeline.loader_cpu_bound"] and not absorbed
