"""`run --verify`: what is tried, within which budget, and how the measurements change the verdict
(fake trials; the real ones are in tests/integration/test_whatif_zoo.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from stepscope import verify
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity
from stepscope.whatif import BASELINE, Candidate, TrialResult, compare


def finding(rule_id: str, family: str, *prescriptions: Prescription, impact: float = 0.5) -> Finding:
    return Finding(rule_id, family, f"{family} title", Severity.HIGH, impact, 0.9,
                   (Evidence("x", 1.0),), tuple(prescriptions))


WORKERS = Prescription("DataLoader(num_workers=2)", "why", "num_workers", 0, 2, expected_gain=0.5,
                       set={"dataloader.num_workers": 2}, expected_range=(0.38, 0.62))
PERSISTENT = Prescription("DataLoader(persistent_workers=True)", "", "persistent_workers", False, True)
CHEAPER = Prescription("Make each sample cheaper to produce")
INPUT = finding("input_pipeline.loader_cpu_bound", "input_pipeline", WORKERS, PERSISTENT, CHEAPER)


def test_prescriptions_first_then_their_combination_then_what_an_engineer_would_try():
    setup = verify.Setup(cores=2, threads=2, workers=0)
    names = [item.name for item in verify.candidates([INPUT], setup)]
    assert names[:3] == ["dataloader.num_workers=2", "dataloader.persistent_workers=true",
                         "dataloader.num_workers=2 dataloader.persistent_workers=true"]
    # the workers with one intra-op thread in the training process: the pair a careful engineer tries
    assert "dataloader.num_workers=2 torch.num_threads=1" in names
    assert "dataloader.num_workers=1 torch.num_threads=1" in names or len(names) == verify.MAX_CANDIDATES
    assert len(names) <= verify.MAX_CANDIDATES and len(set(names)) == len(names)
    assert [change.action for change in verify.code_changes([INPUT])] == ["Make each sample cheaper to produce"]


def test_variants_are_ordered_by_the_models_predicted_gain():
    predicted = {(1, 2): 0.05, (1, 1): 0.2, (2, 2): 0.0, (2, 1): 0.35}
    setup = verify.Setup(cores=2, threads=2, workers=0, predict_gain=lambda k, t: predicted.get((k, t)))
    bare = finding("input_pipeline.loader_cpu_bound", "input_pipeline", CHEAPER)  # no --set prescription
    names = [item.name for item in verify.candidates([bare], setup)]
    assert names[0] == "dataloader.num_workers=2 torch.num_threads=1"
    assert verify.candidates([bare], setup)[0].expected_gain == 0.35


def test_the_budget_keeps_the_first_candidates_and_at_least_two_rounds():
    assert verify.plan(4, trial_s=5.0, budget_s=75.0) == (4, 3)  # 5 names × 3 rounds × 5 s
    assert verify.plan(4, trial_s=5.0, budget_s=60.0) == (4, 2)  # more candidates before more rounds
    assert verify.plan(4, trial_s=5.0, budget_s=30.0) == (2, 2)
    assert verify.plan(4, trial_s=30.0, budget_s=60.0) == (0, 0)  # not even one candidate twice
    assert verify.BUDGET_MIN_S <= verify.default_budget(3.0, 0.02, 40) <= verify.BUDGET_MAX_S


def trials(name: str, *step_ms: float) -> list[TrialResult]:
    return [TrialResult(name, index, ms / 1e3, 16e3 / ms, 1e3 / ms, 30) for index, ms in enumerate(step_ms)]


def verification(*rows: tuple[str, tuple[float, ...]]) -> verify.Verification:
    found = verify.candidates([INPUT], verify.Setup(cores=2, threads=2, workers=0))
    chosen = [item for item in found if item.name in {name for name, _ in rows}]
    results = trials(BASELINE, 40, 41, 42) + [item for name, times in rows for item in trials(name, *times)]
    comparisons = compare(results, chosen)
    faster = [row for row in comparisons if row.verdict == "faster"]
    best = max(faster, key=lambda row: row.speedup or 0).name if faster else None
    return verify.Verification(40, 3, 60.0, 50.0, tuple(comparisons), best, ())


def test_a_prescription_measured_within_noise_is_withdrawn_and_the_best_goes_first():
    result = verification(("dataloader.num_workers=2", (39, 43, 44)),  # within noise of 40-42
                          ("dataloader.persistent_workers=true", (30, 31, 32)))
    (updated,) = verify.apply([INPUT], result)
    first, *rest = updated.prescriptions
    assert first.action == PERSISTENT.action and not first.withdrawn
    assert first.measured_gain["median"] == pytest.approx(1 - 31 / 41, abs=1e-3)
    assert first.measured_gain["low"] < first.measured_gain["median"] < first.measured_gain["high"]
    withdrawn = next(item for item in rest if item.action == WORKERS.action)
    assert withdrawn.withdrawn and withdrawn.measured_gain is not None
    assert rest[-1].action == WORKERS.action  # withdrawn last; the code change keeps its place before it


def test_the_best_measured_change_is_added_when_no_prescription_was_it():
    result = verification(("dataloader.num_workers=2", (39, 43, 44)),
                          ("dataloader.num_workers=2 torch.num_threads=1", (20, 21, 22)))
    result = verify.Verification(result.steps, result.repeats, result.budget_s, result.elapsed_s,
                                 result.comparisons, "dataloader.num_workers=2 torch.num_threads=1", ())
    (updated,) = verify.apply([INPUT], result)
    added = updated.prescriptions[0]
    assert added.set == {"dataloader.num_workers": 2, "torch.num_threads": 1}
    assert added.action == "DataLoader(num_workers=2) and torch.set_num_threads(1) in the training process"
    assert added.measured_gain["median"] == pytest.approx(1 - 21 / 41, abs=1e-3)


def test_verification_round_trips_and_report_json_carries_set_measured_gain_and_withdrawn(tmp_path):
    result = verification(("dataloader.num_workers=2", (39, 43, 44)), ("dataloader.persistent_workers=true", (30, 31, 32)))
    verify.save(result, tmp_path)
    again = verify.load(tmp_path)
    assert again is not None and again.comparisons == result.comparisons and again.best == result.best
    (updated,) = verify.apply([INPUT], again)
    data = json.loads(json.dumps(updated.to_dict()))
    by_action = {item["action"]: item for item in data["prescriptions"]}
    workers = by_action[WORKERS.action]
    assert workers["set"] == {"dataloader.num_workers": 2} and workers["withdrawn"] is True
    assert workers["expected_gain"] == {"low": 0.38, "high": 0.62, "estimate": 0.5}
    assert set(by_action[PERSISTENT.action]["measured_gain"]) == {"median", "low", "high", "trials"}
    assert Finding.from_dict(data) == updated  # report schema 3 reads back
    old = dict(data, prescriptions=[{"action": "a", "expected_gain": 0.2}])  # schema 2: a number
    assert Finding.from_dict(old).prescriptions[0].expected_gain == 0.2


def test_a_damaged_verification_file_is_no_verification(tmp_path):
    (tmp_path / verify.VERIFICATION_FILE).write_text("{not json")
    assert verify.load(tmp_path) is None


# -- real trials that fail or hang (scripts without torch: a trial fails or hangs in about a second) --
FAILING_SCRIPT = 'print("loading the data")\nraise RuntimeError("dataset path not set")\n'
HANGING_SCRIPT = """import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open("pids.txt", "a") as out:
    out.write(f"{os.getpid()} {os.getpgid(0)} {helper.pid}\\n")
while True:
    time.sleep(1)
"""
TWO_WORKERS = Candidate("dataloader.num_workers=2", {"dataloader.num_workers": 2}, INPUT.rule_id, WORKERS.action)


def test_when_every_trial_fails_nothing_is_verified_and_the_line_says_how_and_where(tmp_path):
    from stepscope.report.run_view import verification_view
    from stepscope.report.render.lines import verification_line

    (tmp_path / "train.py").write_text(FAILING_SCRIPT)
    # a trial of ~4 s in a budget of 20 s: one candidate against the baseline, twice each
    result = verify.verify(["--", "train.py"], [TWO_WORKERS], tmp_path / "verify", steps=5, budget_s=20.0,
                           trial_s=4.0, cwd=str(tmp_path))
    line = verification_line(verification_view(result.to_dict()))
    assert "beyond noise" not in line and not line.startswith("Verified"), line
    assert line.startswith("Not verified: all 4 trials failed, nothing was measured: exit 1: RuntimeError: "
                           "dataset path not set (baseline round 1, dataloader.num_workers=2 round 1, "), line
    assert f"logs in {tmp_path / 'verify' / 'logs'}" in line
    assert len(result.failures) == 4 and all(Path(item["log"]).is_file() for item in result.failures)
    assert [row.verdict for row in result.comparisons] == ["failed", "failed"] and result.best is None
    (updated,) = verify.apply([INPUT], result)  # a failed trial measures nothing: nothing withdrawn
    assert not any(item.withdrawn or item.measured_gain for item in updated.prescriptions)
    again = verify.load(verify.save(result, tmp_path).parent)
    assert again is not None and (again.failures, again.failed) == (result.failures, result.failed)


@pytest.mark.timeout(60)
def test_a_hung_trial_is_stopped_with_its_process_group_at_the_end_of_the_budget(tmp_path):
    from stepscope.children import group_members

    (tmp_path / "train.py").write_text(HANGING_SCRIPT)
    started = time.monotonic()
    result = verify.verify(["--", "train.py"], [TWO_WORKERS], tmp_path / "verify", steps=5, budget_s=4.0,
                           trial_s=1.0, cwd=str(tmp_path))
    took = time.monotonic() - started
    assert took < 4.0 + 3.0 + 2.0, took  # the budget, the grace period, a margin
    assert result.failures[0]["error"] == "timed out after 4.0 s (stopped with its process group)"
    # the hung setting's next trial is planned at its measured length, which no longer fits: not started
    # (the other setting's trials run when the hung one's length still fits in what is left)
    (note,) = result.notes
    assert note.endswith("of 4 trials not run: at their measured length they did not fit in what was left of the "
                         "budget of 4 s (raise --verify-budget)"), note
    assert [(item["setting"], item["round"]) for item in result.schedule].count((BASELINE, 2)) == 0
    time.sleep(0.2)
    for line in (tmp_path / "pids.txt").read_text().splitlines():
        pid, group, helper = map(int, line.split())
        assert pid == group and group_members(group) == [] and not running(helper)


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


# a trial that takes ~3 s more than stepscope's own start-up and ignores SIGTERM: stopping it at the
# end of the budget would cost the whole grace period (SIGKILL after 3 s)
SLOW_TO_STOP_SCRIPT = """import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(3)
"""


@pytest.mark.timeout(120)
def test_verify_plans_with_measured_trial_times_and_never_exceeds_its_budget_by_more_than_one_trial(tmp_path):
    """The diagnosed run's estimate (0.5 s a trial) is far below a real trial (stepscope's start-up,
    the script, the record and its measuring): trials are planned at their measured length from the
    second on, none starts that cannot end within the budget, so --verify ends within the budget plus
    one planned trial — the old plan started a trial with a quarter of its estimate left and stopped
    it at the end of the budget, 3 s of grace later."""
    (tmp_path / "train.py").write_text(SLOW_TO_STOP_SCRIPT)
    budget = 14.0
    started = time.monotonic()
    result = verify.verify(["--", "train.py"], [TWO_WORKERS], tmp_path / "verify", steps=5, budget_s=budget,
                           trial_s=0.5, cwd=str(tmp_path))
    took = time.monotonic() - started
    planned = [item["planned_s"] for item in result.schedule]
    walls = [item["wall_s"] for item in result.schedule]
    assert len(result.schedule) >= 2, result.schedule
    assert planned[0] == 0.5 and planned[1] >= walls[0]  # the second trial is planned at the first's length
    assert took <= budget + max(planned), (took, result.schedule)
    for item in result.schedule[1:]:  # every trial planned with a measurement started only where it fit
        assert item["start_s"] + item["planned_s"] <= budget, result.schedule
    again = verify.load(verify.save(result, tmp_path).parent)
    assert again is not None and again.schedule == result.schedule


def test_a_later_round_keeps_the_baseline_and_the_candidates_that_fit_with_it():
    names = [BASELINE, "a", "b", "c"]
    walls = {BASELINE: [10.0], "a": [12.0], "b": [30.0], "c": [5.0]}
    # 10 + 12 fit in 25 s, + 30 does not: the round is the baseline and "a" (not "c" after "b")
    assert verify.round_names(names, walls, 1.0, 25.0) == [BASELINE, "a"]
    assert verify.round_names(names, walls, 1.0, 60.0) == [BASELINE, "a", "b", "c"]
    assert verify.round_names(names, walls, 1.0, 21.0) == []  # the baseline alone compares nothing
    # a setting not measured yet is planned at the longest trial measured
    assert verify.planned_length("d", walls, 1.0) == 30.0 and verify.planned_length("d", {}, 7.0) == 7.0
    assert verify.trial_limit(10.0, 12.0, 100.0) == 14.0  # half the planned length less the 3 s grace
    assert verify.trial_limit(4.0, 12.0, 100.0) == 12.0 and verify.trial_limit(10.0, 12.0, 5.0) == 5.0
    # a trial planned at a measured length may run 3x it + 10 s; the first, planned at the diagnosed
    # run's estimate (no interpreter start, no report, another load), 3x + 30 s
    assert verify.trial_deadline(2.0) == 16.0 and verify.trial_deadline(2.0, measured=False) == 36.0


@pytest.mark.parametrize(("runs", "failed", "said"), [
    ((1, 1, 1), (0, 0, 0), "(1 per setting,"),  # one trial each: never "3 per setting"
    ((3, 3, 3), (0, 1, 0), "(2–3 per setting,"),  # a failed trial is no measurement
    ((3, 3), (0, 0), "(3 per setting,"),
])
def test_the_line_counts_the_trials_measured_per_setting(runs, failed, said):
    from stepscope.report.run_view import verification_view
    from stepscope.report.render.lines import verification_line

    rows = [{"runs": count, "failed": lost, "verdict": "within noise"} for count, lost in zip(runs, failed)]
    line = verification_line(verification_view({"trials": rows, "elapsed_s": 30, "steps": 40, "best": None}))
    assert said in line and line.startswith(f"Verified: {sum(runs) - sum(failed)} trials of 40 steps"), line
