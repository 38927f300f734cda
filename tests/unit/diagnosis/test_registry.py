"""The registry is the one list of families: the engine, report.json's family list and the
documentation's tables come from it, and a new family is one module plus one registry line."""

from __future__ import annotations

import ast
from pathlib import Path

from unit.diagnosis import fixture_family
from unit.diagnosis.diagnosis_records import make_record

from stepscope.analysis.bundle import RunEvidence, build_evidence
from stepscope.diagnosis import catalogue, rules
from stepscope.diagnosis.engine import diagnose_job, run_rules
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.rules import FAMILIES, REGISTRY

ROOT = Path(__file__).resolve().parents[3]
RULES_DIR = ROOT / "src" / "stepscope" / "diagnosis" / "rules"


def _between(text: str, begin: str, end: str) -> str:
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def test_the_documentation_table_is_the_registry():
    text = (ROOT / "docs" / "diagnosis.md").read_text(encoding="utf-8")
    assert _between(text, catalogue.BEGIN, catalogue.END) == catalogue.family_table(), \
        "docs/diagnosis.md is out of date: python -m stepscope.diagnosis.catalogue prints the table"


def test_report_json_lists_the_registry_families():
    text = (ROOT / "docs" / "report-json.md").read_text(encoding="utf-8")
    assert f"Families (`findings[].family`, stable identifiers): {catalogue.family_list()}." in text


def test_report_json_documents_every_evidence_field():
    """Every key of ``report.json``'s ``evidence`` and ``trace`` sections is named in its documentation."""
    text = (ROOT / "docs" / "report-json.md").read_text(encoding="utf-8")
    from stepscope.analysis.evidence import TraceEvidence

    missing = [key for key in (*RunEvidence().to_dict(), *TraceEvidence().to_dict()) if f"`{key}`" not in text]
    assert not missing, f"docs/report-json.md does not describe: {missing}"


def test_every_rule_module_is_a_registered_family():
    modules = {path.stem for path in RULES_DIR.glob("*.py") if not path.stem.startswith("_")}
    registered = {entry.rules[0].__module__.rsplit(".", 1)[1] if entry.rules else "healthy" for entry in REGISTRY}
    assert modules == registered
    assert len(set(FAMILIES)) == len(FAMILIES) and FAMILIES[-1] == "healthy"
    for path in RULES_DIR.glob("*.py"):
        if not path.stem.startswith("_"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            assert any(isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "FAMILY"
                                                            for target in node.targets) for node in tree.body), path


def _other_heavy_record():
    return make_record(steps=40, step_s=0.01, shares={"forward": 0.3})  # the rest (70 %) is "other"


def test_a_new_family_is_one_module_and_one_registry_line():
    """The fixture family (tests/unit/diagnosis/fixture_family.py) joins the registry with one line:
    the engine runs its rule, applies its precedence (it supersedes ``outside_model``), ranks it, and
    the documentation table lists it."""
    registry = (*REGISTRY[:-1], fixture_family.FAMILY, REGISTRY[-1])
    evidence = build_evidence(_other_heavy_record())
    without = run_rules(evidence)
    assert "outside_model" in {item.family for item in without.findings}
    found = run_rules(evidence, registry=registry)
    assert found.findings[0].rule_id == "fixture_family.other_is_high"
    assert ("outside_model.other_dominates", "fixture_family.other_is_high") in \
        {(item.rule_id, by) for item, by in found.superseded}
    job = diagnose_job([(0, evidence), (1, evidence)], registry=registry)
    assert job.findings[0].ranks == (0, 1) and job.findings[0].family == "fixture_family"
    assert "| `fixture_family` | The fixture's diagnosis |" in catalogue.family_table(registry)


def test_a_finding_of_an_unregistered_family_is_a_failed_rule():
    def stray(ev):
        return fixture_family.other_is_high(ev)

    registry = (*REGISTRY[:-1], FamilyEntry("stray", (stray,), "", ""), REGISTRY[-1])
    diagnosis = run_rules(build_evidence(_other_heavy_record()), registry=registry)
    assert any("not in the registry" in item for item in diagnosis.failed_rules)
    assert not diagnosis.complete


def test_rules_module_is_the_registry():
    assert rules.RULES == tuple(rule for entry in REGISTRY for rule in entry.rules)
