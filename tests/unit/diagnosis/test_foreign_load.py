from __future__ import annotations

from diagnosis_records import ctx_of, make_record
from stepscope.analysis.evidence import WorkerLoad
from stepscope.diagnosis.engine import run_rules
from stepscope.diagnosis.rules.foreign_load import others_on_the_machine


def _signals(machine: float, tree: float) -> dict:
    return dict(cpu_count=2, cpu_util_mean=machine, workers=(WorkerLoad(1, "main", tree),),
                foreign_processes=((4242, "burner", 0.95), (77, "cron", 0.1)))


def test_names_the_processes_and_their_share():
    finding = others_on_the_machine(ctx_of(make_record(), _signals(machine=0.98, tree=1.0)))
    assert finding is not None and finding.family == "foreign_load"
    assert "pid 4242 burner 95%" in finding.title
    assert not finding.impact_measured and finding.impact_basis.startswith("estimate")


def test_quiet_machine_is_not_reported():
    assert others_on_the_machine(ctx_of(make_record(), _signals(machine=0.55, tree=1.0))) is None


def test_crowded_machine_lowers_cpu_based_confidence():
    shares = {"data_wait": 0.6, "forward": 0.2, "backward": 0.12, "optimizer": 0.05}
    record = make_record(shares=shares, num_workers=0)
    quiet = run_rules(ctx_of(record, dict(_signals(machine=0.5, tree=1.0), main_cpu_util=1.0)))
    crowded = run_rules(ctx_of(record, dict(_signals(machine=0.99, tree=1.0), main_cpu_util=1.0)))
    confidence = {run: {item.family: item.confidence for item in diagnosis.findings}
                  for run, diagnosis in (("quiet", quiet), ("crowded", crowded))}
    assert "foreign_load" in confidence["crowded"] and "foreign_load" not in confidence["quiet"]
    assert confidence["crowded"]["input_pipeline"] < confidence["quiet"]["input_pipeline"]
