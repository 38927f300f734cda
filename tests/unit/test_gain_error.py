"""benchmarks/gain_error.py: every prescription that states a gain is paired with the planted factor its
change removes, and the error table is the one the pairs give (checked by hand on small cases)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gain_error  # noqa: E402


def _gain(estimate: float, low: float | None = None, high: float | None = None) -> dict:
    return {"estimate": estimate, "low": estimate if low is None else low, "high": estimate if high is None else high}


ROW = {"name": "w007", "truth": {"gains": {"neighbour": 0.40, "worker_restarts": 0.60}}}
REPORT = {"findings": [
    {"family": "epoch_boundary", "rule_id": "epoch_boundary.worker_startup", "impact": 0.5,
     "prescriptions": [{"action": "DataLoader(persistent_workers=True)", "setting": "persistent_workers",
                        "expected_gain": _gain(0.5, 0.3, 0.7)}]},
    {"family": "foreign_load", "rule_id": "foreign_load.other_processes", "impact": 0.25, "impact_before_overlap": 0.45,
     "prescriptions": [{"action": "Stop or move the other processes", "expected_gain": _gain(0.45)},
                       {"action": "withdrawn one", "expected_gain": _gain(0.9), "withdrawn": True}]},
    # a finding whose change removes no planted factor of this workload: counted apart
    {"family": "launch_overhead", "rule_id": "launch_overhead.tiny_ops", "impact": 0.1,
     "prescriptions": [{"action": "model = torch.compile(model)", "expected_gain": _gain(0.1)}]},
    # no gain stated: nothing to pair
    {"family": "memory_pressure", "rule_id": "memory_pressure.growing_memory", "impact": 0.2,
     "prescriptions": [{"action": "drop what is kept", "expected_gain": None}]},
]}


def test_each_stated_gain_is_paired_with_the_factor_its_change_removes():
    pairs, unpaired = gain_error.pairs_of(ROW, REPORT, "seed")
    assert unpaired == 1
    assert [(pair.seed, pair.workload, pair.model, pair.factor, pair.estimate, pair.measured, pair.top)
            for pair in pairs] == [("seed", "w007", "restarts", "worker_restarts", 0.5, 0.60, True),
                                   ("seed", "w007", "foreign", "neighbour", 0.45, 0.40, False)]
    restarts, foreign = pairs
    assert (restarts.low, restarts.high) == (0.3, 0.7) and (foreign.low, foreign.high) == (None, None)
    assert foreign.impact == 0.25 and foreign.impact_before_overlap == 0.45
    assert restarts.error == pytest.approx(-0.1) and foreign.error == pytest.approx(0.05)


def test_a_gain_two_findings_state_for_one_change_is_one_estimate():
    twice = {"family": "input_pipeline", "rule_id": "input_pipeline.loader_cpu_bound",
             "prescriptions": [{"action": "DataLoader(num_workers=2)", "setting": "num_workers",
                                "expected_gain": _gain(0.3, 0.1, 0.4)},
                               {"action": "DataLoader(persistent_workers=True)", "setting": "persistent_workers",
                                "expected_gain": _gain(0.5, 0.3, 0.7)}]}
    pairs, unpaired = gain_error.pairs_of(ROW, {"findings": [*REPORT["findings"], twice]}, "seed")
    assert [pair.rule_id for pair in pairs if pair.model == "restarts"] == ["epoch_boundary.worker_startup"]
    # the worker plan's change overlaps the samples' cost, it does not remove a factor: not paired
    assert unpaired == 2


def _pair(model: str, estimate: float, measured: float, low: float | None = None, high: float | None = None,
          seed: str = "s"):
    return gain_error.Pair(seed, "w", model, "r", "f", estimate, measured, low, high, None, None, True)


def test_the_table_gives_the_errors_percentiles_and_the_ranges_coverage():
    pair = _pair

    pairs = [pair("gil", 0.3, 0.1), pair("gil", 0.2, 0.3), pair("gil", 0.1, 0.1), pair("gil", 0.5, 0.2),
             pair("gil", 0.4, 0.4), pair("foreign", 0.2, 0.25, 0.1, 0.3), pair("foreign", 0.2, 0.5, 0.1, 0.3)]
    rows = {row["model"]: row for row in gain_error.table(pairs)}
    gil = rows["gil"]  # errors +0.2, -0.1, 0, +0.3, 0: sorted -0.1, 0, 0, 0.2, 0.3
    assert gil["pairs"] == 5 and gil["mean"] == pytest.approx(0.08) and gil["mean_abs"] == pytest.approx(0.12)
    assert gil["overshoot_p90"] == pytest.approx(0.26) and gil["undershoot_p10"] == pytest.approx(-0.06)
    assert gil["ranged"] == 0
    assert (rows["foreign"]["ranged"], rows["foreign"]["inside"]) == (2, 1)


def test_stored_reports_give_the_table_and_a_bad_file_one_line(tmp_path: Path):
    run = tmp_path / "w007" / "stepscope-run"
    run.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps(REPORT))
    evaluation = tmp_path / "blind.json"
    evaluation.write_text(json.dumps({"seed": 5, "workloads": [{**ROW, "directory": str(tmp_path / "w007")}]}))
    out = tmp_path / "pairs.json"
    script = str(ROOT / "benchmarks" / "gain_error.py")
    result = subprocess.run([sys.executable, script, str(evaluation), "--stored", "--out", str(out)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "2 prescriptions paired" in result.stdout and "1 not paired" in result.stdout
    assert "| restarts | 1 | -0.100 | 0.100 | -0.100 | -0.100 | (0.00, 0.10) | 1/1 | one seed only |" in result.stdout
    assert "| foreign | 1 | +0.050 | 0.050 | +0.050 | +0.050 | (0.05, 0.00) | no range | one seed only |" in result.stdout
    assert [item["factor"] for item in json.loads(out.read_text())] == ["worker_restarts", "neighbour"]
    (tmp_path / "bad.json").write_text("{not json")
    bad = subprocess.run([sys.executable, script, str(tmp_path / "bad.json"), "--stored"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "cannot read" in bad.stderr


def test_the_fitted_range_keeps_its_estimate_and_is_judged_on_the_seeds_left_out():
    assert gain_error.fitted([-0.1, 0.0, 0.0, 0.2, 0.3]) == (0.26, 0.06)
    assert gain_error.fitted([-0.3, -0.2, -0.1]) == (0.0, 0.28)  # never overshot: the estimate is the low end
    # a's errors (-0.1, +0.1) give (0.08, 0.08): of b's, +0.05 is inside, +0.2 is not; b's (+0.05, +0.2)
    # give (0.19, 0): of a's, +0.1 is inside, -0.1 is not
    pairs = [_pair("gil", 0.3, 0.4, seed="a"), _pair("gil", 0.3, 0.2, seed="a"),
             _pair("gil", 0.3, 0.25, seed="b"), _pair("gil", 0.3, 0.1, seed="b")]
    assert gain_error.held_out(pairs) == {"gil": (2, 4)}
    assert gain_error.held_out([_pair("gil", 0.3, 0.4, seed="a")]) == {"gil": (0, 0)}
