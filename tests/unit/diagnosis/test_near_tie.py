"""Near ties: a verdict whose measured cost barely exceeds the next cause's shows the confidence such
verdicts earned on the blind evaluation, not its rule's, and names the rival
(``stepscope.diagnosis.near_tie``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from diagnosis_records import ctx_of, make_record
from stepscope.diagnosis import engine
from stepscope.diagnosis.engine import (EXPLAINS_LITTLE_CONFIDENCE, Diagnosis, diagnose_job, merge_findings,
                                        ranked_by_measured_cost, run_rules)
from stepscope.diagnosis.near_tie import NEAR_TIE_CONFIDENCE, NEAR_TIE_MARGIN, mark_near_tie
from stepscope.diagnosis.rules._common import finding

SHARES = {"data_wait": 0.6, "forward": 0.2, "backward": 0.12, "optimizer": 0.05}


def _wait(impact: float, family: str = "input_pipeline", rule_id: str = "input_pipeline.loader_cpu_bound", **kw):
    return finding(rule_id, family, "the step waits for data", impact, 0.9, [], [], claims=("data_wait",), **kw)


def _sync(impact: float, **kw):
    return finding("host_device_sync.syncs", "host_device_sync", "syncs", impact, 0.9, [], [], claims=("compute",),
                   **kw)


def _rule(item):
    return lambda ev: item


def _diagnosed(*found):
    """The findings as the engine ranks, calibrates and caps them, on a run with room for every claim."""
    rules = tuple(_rule(item) for item in found)
    return run_rules(ctx_of(make_record(shares=SHARES)), rules=rules, verdict=False).findings


def test_a_near_tie_caps_the_verdict_and_names_the_runner_up():
    top, second = _diagnosed(_wait(0.30), _sync(0.28))
    assert top.confidence == NEAR_TIE_CONFIDENCE and top.rule_confidence == 0.9
    assert second.confidence == 0.96  # the calibration is of the verdict: the finding below keeps its own
    assert top.extra["near_tie"] == {"rule_id": "host_device_sync.syncs", "family": "host_device_sync",
                                     "impact": 0.28, "margin": 0.02}
    note = next(item for item in top.evidence if item.metric == "runner_up_margin")
    assert (note.value, note.threshold, note.source, note.unit) == (0.02, NEAR_TIE_MARGIN, "diagnosis", "ratio")
    assert "host_device_sync" in note.scope and "28.0%" in note.scope
    assert top.summary.startswith("Borderline: the host_device_sync finding costs 28.0% of the step, 2.0 points less")
    assert "11 times in 16" in top.summary and "stepscope try" in top.summary


def test_a_clear_margin_keeps_the_confidence():
    top, _ = _diagnosed(_wait(0.30), _sync(0.30 - NEAR_TIE_MARGIN))
    assert top.confidence == 0.96 and "near_tie" not in top.extra
    assert not any(item.metric == "runner_up_margin" for item in top.evidence) and "Borderline" not in top.summary


def test_a_near_tie_that_also_explains_little_keeps_the_lower_cap():
    top, _ = _diagnosed(_wait(0.15), _sync(0.14))
    assert top.confidence == EXPLAINS_LITTLE_CONFIDENCE
    assert top.extra["explains_little"] and top.extra["near_tie"]["margin"] == 0.01


@pytest.mark.parametrize("rival", [
    pytest.param(_wait(0.29, rule_id="input_pipeline.loader_starved"), id="same family: the same fix"),
    pytest.param(_sync(0.29, impact_basis="estimate: its measured cost x the unwaited share"), id="an estimate"),
    pytest.param(_sync(0.29, impact_basis="estimate: memory runs out", risk=True), id="a risk"),
])
def test_only_a_measured_cost_of_another_family_is_a_rival(rival):
    """An estimate or a risk ranks below every measured cost whatever its size, and a finding of the
    same family has the same fix: none is a rival, so the next cause (20 points less) decides."""
    found = _diagnosed(_wait(0.30), rival, _other(0.1))
    assert found[0].rule_id == "input_pipeline.loader_cpu_bound"
    assert found[0].confidence == 0.96 and "near_tie" not in found[0].extra


def _other(impact: float):
    return finding("outside_model.other_dominates", "outside_model", "outside the model", impact, 0.9, [], [],
                   claims=("step",))


def test_the_rival_is_the_costliest_of_another_family_past_the_same_one():
    top = _diagnosed(_wait(0.30), _wait(0.29, rule_id="input_pipeline.loader_starved"), _sync(0.27))[0]
    assert top.extra["near_tie"]["family"] == "host_device_sync" and top.extra["near_tie"]["margin"] == 0.03


def _job_finding(rule_id: str, family: str, impact: float, rank: int | None = None, causes: tuple[str, ...] = ()):
    return replace(finding(rule_id, family, rule_id, impact, 0.9, [], [], rank=rank, cause_families=causes),
                   confidence=0.96, rule_confidence=0.9)


def test_a_straggler_ahead_of_its_own_cause_is_no_tie():
    """The straggler is listed before the slow rank's finding that causes it (one problem, the job's
    view first) though it may cost less: neither that order nor that pair is a tie of two causes."""
    straggler = _job_finding("straggler.slow_rank", "straggler", 0.30, rank=1, causes=("outside_model",))
    chore = _job_finding("outside_model.other_dominates", "outside_model", 0.31)
    loading = _job_finding("input_pipeline.loader_cpu_bound", "input_pipeline", 0.05)
    merged = merge_findings([(0, Diagnosis((straggler, loading))), (1, Diagnosis((chore, straggler, loading)))])
    assert [item.rule_id for item in merged[:2]] == ["straggler.slow_rank", "outside_model.other_dominates"]
    assert merged[1].cause_of == "straggler.slow_rank"
    assert merged[0].confidence == 0.96 and "near_tie" not in merged[0].extra
    # first by its cost, the straggler's own cause is still no rival; an unrelated cost is
    cheaper = replace(chore, impact=0.29)
    alone = merge_findings([(0, Diagnosis((straggler, loading))), (1, Diagnosis((cheaper, straggler, loading)))])
    assert alone[0].rule_id == "straggler.slow_rank" and "near_tie" not in alone[0].extra
    rival = _job_finding("garbage_collection.collector_pauses", "garbage_collection", 0.28)
    tied = merge_findings([(0, Diagnosis((straggler, rival))), (1, Diagnosis((cheaper, straggler, rival)))])
    assert tied[0].rule_id == "straggler.slow_rank"
    assert tied[0].extra["near_tie"]["family"] == "garbage_collection" and tied[0].confidence == NEAR_TIE_CONFIDENCE


def test_a_critical_path_ranking_is_no_tie():
    """A trace's findings rank by their share of the critical path: the kept runs, all run records,
    say nothing of how often a close path share names the right cause."""
    top = replace(_wait(0.30), path_share=0.4, confidence=0.96)
    second = replace(_sync(0.29), path_share=0.39, confidence=0.96)
    assert not ranked_by_measured_cost(top)
    assert mark_near_tie((top, second), ranked_by_measured_cost) == (top, second)


def test_a_job_marks_its_verdict_and_each_rank_once(monkeypatch):
    """The ranks' findings are merged unmarked: the job's verdict carries one sentence and one
    evidence item, and each rank's own diagnosis is marked as it would be alone."""
    monkeypatch.setattr(engine, "RULES", (_rule(_wait(0.30)), _rule(_sync(0.28))))
    records = tuple(make_record(rank=index, shares=SHARES) for index in range(2))
    job = diagnose_job([(index, ctx_of(record, ranks=records)) for index, record in enumerate(records)])
    top = job.findings[0]
    assert top.ranks == (0, 1) and top.confidence == NEAR_TIE_CONFIDENCE
    assert top.summary.count("Borderline") == 1
    assert sum(item.metric == "runner_up_margin" for item in top.evidence) == 1
    for diagnosis in job.per_rank:
        assert diagnosis.findings[0].extra["near_tie"]["margin"] == 0.02
        assert diagnosis.findings[0].summary.count("Borderline") == 1


def _with_low_end(item, low: float):
    return replace(item, extra={**item.extra, "impact_low": {"value": low, "why": "without the peers' wait"}})


def test_a_cost_whose_lower_end_does_not_clear_the_next_cause_is_a_near_tie():
    """A cost stated with a lower end (the foreign-load finding: the intra-op threads' wait comes
    back only in part) ranks by its value but is checked by its lower end too."""
    top, second = _diagnosed(_with_low_end(_wait(0.45), 0.20), _sync(0.30))
    assert top.rule_id == "input_pipeline.loader_cpu_bound" and second.rule_id == "host_device_sync.syncs"
    assert top.confidence == NEAR_TIE_CONFIDENCE and top.extra["near_tie"]["margin"] == -0.1
    note = next(item for item in top.evidence if item.metric == "runner_up_margin")
    assert note.value == -0.1 and "lower end, 20.0% of the step" in note.scope
    assert "its cost's lower end, 20.0% of the step (without the peers' wait), is below the host_device_sync " \
           "finding's 30.0%" in top.summary
    close, _ = _diagnosed(_with_low_end(_wait(0.45), 0.33), _sync(0.30))
    assert close.confidence == NEAR_TIE_CONFIDENCE and "only 3.0 points above" in close.summary


def test_a_lower_end_that_clears_the_next_cause_keeps_the_confidence():
    top, _ = _diagnosed(_with_low_end(_wait(0.45), 0.36), _sync(0.30))
    assert top.confidence == 0.96 and "near_tie" not in top.extra and "Borderline" not in top.summary


def test_a_straggler_s_lower_end_meets_the_next_cause_past_its_own_costlier_cause():
    """The slow rank's own finding may cost more than the straggler listed before it (one problem):
    it is neither the rival nor a reason to skip the check; the next unrelated cause is."""
    straggler = replace(_job_finding("straggler.slow_rank", "straggler", 0.40, rank=1, causes=("outside_model",)),
                        extra={"impact_low": {"value": 0.14, "why": "asleep while the cores loaded data"}})
    chore = _job_finding("outside_model.other_dominates", "outside_model", 0.46)
    loading = _job_finding("input_pipeline.loader_cpu_bound", "input_pipeline", 0.22)
    merged = merge_findings([(0, Diagnosis((straggler, loading))), (1, Diagnosis((chore, straggler, loading)))])
    assert [item.rule_id for item in merged] == ["straggler.slow_rank", "outside_model.other_dominates",
                                                 "input_pipeline.loader_cpu_bound"]
    top = merged[0]
    assert top.confidence == NEAR_TIE_CONFIDENCE and top.extra["near_tie"]["family"] == "input_pipeline"
    assert top.extra["near_tie"]["margin"] == pytest.approx(-0.08)
    assert "its cost's lower end, 14.0% of the step (asleep while the cores loaded data), is below" in top.summary


def _with_high_end(item, high: float):
    return replace(item, extra={**item.extra, "impact_high": {"value": high, "why": "the whole data wait"}})


def test_a_next_cause_whose_upper_end_reaches_the_verdict_is_a_near_tie():
    """A cost priced on part of what its cause took (a loader's reads on the blocked part of the data
    wait) states its upper end: the verdict is checked against it, and against its lower end too."""
    top, second = _diagnosed(_wait(0.45), _with_high_end(_sync(0.30), 0.42))
    assert top.confidence == NEAR_TIE_CONFIDENCE and top.extra["near_tie"]["margin"] == 0.03
    assert "is only 3.0 points above the host_device_sync finding's upper end, 42.0% (the whole data wait)" \
        in top.summary
    clear, _ = _diagnosed(_wait(0.45), _with_high_end(_sync(0.30), 0.38))
    assert clear.confidence == 0.96 and "near_tie" not in clear.extra
    both, _ = _diagnosed(_with_low_end(_wait(0.45), 0.36), _with_high_end(_sync(0.30), 0.38))
    assert both.confidence == NEAR_TIE_CONFIDENCE and both.extra["near_tie"]["margin"] == -0.02
    assert "its cost's lower end, 36.0% of the step (without the peers' wait), is below the host_device_sync " \
           "finding's upper end, 38.0% (the whole data wait)" in both.summary
