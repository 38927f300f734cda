from __future__ import annotations

import pytest

from stepscope.analysis.evidence import StepShares, SyncsAndCopies

from diagnosis_records import ctx_of, make_record
from stepscope.diagnosis.rules.communication import exposed_collectives
from stepscope.diagnosis.rules.host_device_sync import sync_and_copies
from stepscope.diagnosis.rules.straggler import slow_rank


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
