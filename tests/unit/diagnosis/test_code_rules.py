"""Garbage-collector pauses and time outside the model, with the code that owns it."""

from __future__ import annotations

from dataclasses import replace

from diagnosis_records import ctx_of, make_record
from stepscope.analysis.run.code_locations import CodeAttribution, CodeLocation, PhaseCode
from stepscope.analysis.run.gc_pauses import GcGeneration, GcPause, GcPauseSummary
from stepscope.diagnosis.engine import run_rules
from stepscope.diagnosis.rules.garbage_collection import collector_pauses
from stepscope.diagnosis.rules.input_pipeline import loader_cpu_bound
from stepscope.diagnosis.rules.outside_model import other_dominates
from stepscope.record.run import ComputeFacts, DeviceCopy

OTHER = {"data_wait": 0.02, "forward": 0.1, "backward": 0.08, "optimizer": 0.02}  # other 78 %


def gc_summary(share: float, young: int = 400, full: int = 3) -> GcPauseSummary:
    return GcPauseSummary(
        measured=True, steps=39, count=young + full, total_s=share * 0.39, share_of_step_time=share,
        pauses_per_step=(young + full) / 39,
        by_generation=(GcGeneration(0, young, share * 0.39 * 0.2, 0.001, 10),
                       GcGeneration(2, full, share * 0.39 * 0.8, 0.25, 5)),
        by_phase_s={"other": share * 0.39}, largest=GcPause(0, 0.25, 2, 5, 0, 8, "other"),
        collected=15, uncollectable=0)


def code(phase: str, label_file: str, line: int, function: str, role: str = "main") -> CodeAttribution:
    location = CodeLocation(label_file, line, function, False, 90, 0.9, 0.7, 0.3)
    part = PhaseCode(phase, role, 100, 0.78, (location,))
    return CodeAttribution(100.0, "thread", 39, 100, () if role == "worker" else (part,),
                           part if role == "worker" else None)


def test_collector_pauses_fire_with_their_measured_cost_and_values():
    ev = replace(ctx_of(make_record(shares=OTHER)), gc=gc_summary(0.4))
    finding = collector_pauses(ev)
    assert finding.family == "garbage_collection" and finding.impact == 0.4 and finding.impact_measured
    actions = " ".join(item.action for item in finding.prescriptions)
    assert "gc.freeze()" in actions and "gc.set_threshold(50000" in actions
    assert "250.0 ms" in finding.title and finding.claims == ("other",)


def test_few_pauses_are_not_reported():
    assert collector_pauses(replace(ctx_of(make_record()), gc=gc_summary(0.002))) is None
    assert collector_pauses(ctx_of(make_record())) is None  # not measured: no claim


def test_other_dominates_names_the_code():
    ev = replace(ctx_of(make_record(shares=OTHER)), code=code("other", "/src/train.py", 22, "step_metrics"))
    finding = other_dominates(ev)
    assert finding.family == "outside_model"
    assert "train.py:22 step_metrics()" in finding.title
    assert finding.prescriptions[0].action.startswith("Move train.py:22 step_metrics()")


def _with_copy(ev, **fields):
    copy = DeviceCopy(**{"file": "/src/train.py", "line": 22, "function": "<module>", "source": "cpu",
                         "target": "cuda", "count": 2, "bytes": 8 << 20, "pinned": False, "non_blocking": False,
                         "wall_ns": 10**9, **fields})
    compute = ComputeFacts(step_index=4, flops=10, ops=10, copies=(copy,))
    return replace(ev, facts=replace(ev.facts, compute=compute))


def test_an_input_copy_from_pageable_memory_is_named_and_pinned_not_moved_out_of_the_step():
    ev = replace(ctx_of(make_record(shares=OTHER)), code=code("other", "/src/train.py", 22, "<module>"))
    finding = other_dominates(_with_copy(ev))
    assert "copying 8.00 MiB a step from pageable host memory to cuda" in finding.title
    first = finding.prescriptions[0]
    assert "pin_memory=True" in first.action and "non_blocking=True" in first.action
    assert first.setting == "pin_memory" and first.suggested is True  # the run's DataLoader
    assert not any("out of the training step" in item.action or "Log scalars" in item.action
                   for item in finding.prescriptions)
    assert ("device_copy_bytes", 8 << 20) in [(item.metric, item.value) for item in finding.evidence]
    no_loader = replace(_with_copy(ev), main_loader=None)
    assert "tensor.pin_memory()" in other_dominates(no_loader).prescriptions[0].action
    pinned = other_dominates(_with_copy(ev, pinned=True))
    assert "pinned host memory" in pinned.title and pinned.prescriptions[0].action.startswith("tensor.to(device, non_blocking=True)")


def test_a_copy_elsewhere_or_cheap_beside_its_line_leaves_the_finding_as_it_was():
    ev = replace(ctx_of(make_record(shares=OTHER)), code=code("other", "/src/train.py", 22, "<module>"))
    step_ns = ev.steady.step_time_mean_s * 1e9
    cheap = _with_copy(ev, wall_ns=int(0.3 * 0.7 * step_ns))  # the line (70 % of the step) spends 30 % copying
    for moved in (_with_copy(ev, line=21), _with_copy(ev, source="cuda", target="cpu"), cheap):
        finding = other_dominates(moved)
        assert finding.prescriptions[0].action.startswith("Move train.py:22 <module>()")


def test_other_without_stack_samples_says_how_to_get_them():
    finding = other_dominates(ctx_of(make_record(shares=OTHER)))
    assert finding is not None and "--stacks-hz" in finding.title


def test_a_model_bound_step_has_no_outside_model_finding():
    assert other_dominates(ctx_of(make_record())) is None


def test_gc_and_other_do_not_count_the_same_time_twice():
    ev = replace(ctx_of(make_record(shares=OTHER)), gc=gc_summary(0.6),
                 code=code("other", "/src/train.py", 22, "build_graph"))
    findings = run_rules(ev).findings
    claimed = sum(item.impact for item in findings if item.family in ("garbage_collection", "outside_model"))
    assert findings[0].family == "garbage_collection" and findings[0].impact == 0.6
    assert "outside_model" not in {item.family for item in findings}  # 18 % left: below its level
    assert claimed <= 0.78 + 1e-6  # together at most the "other" share


def test_input_finding_names_the_workers_code():
    shares = {"data_wait": 0.6, "forward": 0.2, "backward": 0.12, "optimizer": 0.05}
    record = make_record(shares=shares, num_workers=2)
    ev = replace(ctx_of(record, dict(cpu_count=4, worker_cpu_util_mean=0.97, cpu_util_mean=0.5)),
                 code=code("data_wait", "/src/train.py", 41, "tokenize", role="worker"))
    finding = loader_cpu_bound(ev)
    assert "in worker processes: train.py:41 tokenize() 90%" in finding.summary
