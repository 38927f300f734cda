"""Real scripts of every loop shape: manual updates, inference, child processes, launchers, Hugging
Face batches. Each must give the right step count, the right samples/s, and no finding the run
cannot support. The scripts live in ``loop_shapes/``, modelled on public examples."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from support import run_cli
from stepscope.record.store import load_record

SCRIPTS = Path(__file__).resolve().parent / "loop_shapes"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run(tmp_path: Path, script: str, *args: str, monitor: bool = False, env: dict | None = None):
    shutil.copy(SCRIPTS / script, tmp_path / script)
    options = [] if monitor else ["--no-monitor"]
    result = run_cli(["run", *options, "-o", "out", script, *args], tmp_path, env={**OFFLINE, **(env or {})})
    assert result.returncode == 0, result.stderr[-3000:]
    return result, load_record(tmp_path / "out")


def report_json(tmp_path: Path) -> dict:
    import json

    return json.loads((tmp_path / "out" / "report.json").read_text())


def flat(summary: str) -> str:
    """The summary without its box and line wrapping (words joined by single spaces)."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", summary))


def measured_findings(report: dict) -> list[str]:
    return [item["rule_id"] for item in report["findings"] if item.get("impact_measured") and item["impact"] > 0]


def test_manual_sgd_without_optimizer_or_dataloader_counts_one_step_per_backward(tmp_path):
    """pytorch/examples word_language_model: p.data.add_(p.grad, alpha=-lr) over batches it slices."""
    result, record = run(tmp_path, "word_language_model.py")
    assert "steps=21" in result.stdout
    assert record.meta.step_source == "backward"
    assert len(record.steps) == 21
    assert (record.steps.backward_ns > 0).all() and (record.steps.optimizer_ns == 0).all()
    assert not record.facts.inference
    summary = flat(result.stderr)
    assert "steady steps, one per backward()" in summary
    assert "data wait –" in summary and "optimizer –" in summary
    assert "samples/s" not in summary  # no DataLoader: samples are unknown, not made up
    report = report_json(tmp_path)
    assert report["summary"]["measured_phases"] == ["forward", "backward", "other"]
    assert not any(rule.startswith(("input_pipeline", "storage_io")) for rule in measured_findings(report))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inference_loop_counts_one_step_per_model_forward(tmp_path, mode):
    result, record = run(tmp_path, "inference.py", mode)
    assert "batches=30" in result.stdout
    assert record.meta.step_source == "forward"
    assert len(record.steps) == 30
    assert record.facts.inference
    assert record.facts.model_forwards == record.facts.model_forwards_no_grad == 30
    assert (record.steps.forward_ns > 0).all() and (record.steps.backward_ns == 0).all()
    summary = flat(result.stderr)
    assert "steady steps, one per model forward" in summary
    assert "(inference, " in summary and "steady steps" in summary
    assert "backward –" in summary


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_hogwild_training_in_child_processes_is_said_not_diagnosed(tmp_path, start_method):
    """pytorch/examples mnist_hogwild: torch.multiprocessing processes train; the parent evaluates.
    (spawn re-imports torch in each child: ~10 s on a quiet 2-core machine, more on a busy one)"""
    result, record = run(tmp_path, "hogwild.py", start_method)
    assert "exitcodes=[0, 0]" in result.stdout
    facts = record.facts
    assert len(facts.child_pids) == 2
    assert facts.training_in_children, (facts.children_cpu_s, facts.main_cpu_s)
    assert any("training ran in 2 child process" in item for item in record.warnings)
    assert "training ran in 2 child process" in flat(result.stderr)
    report = report_json(tmp_path)
    assert measured_findings(report) == []
    assert report["summary"]["inference"] is False
    assert not any(item["family"] == "healthy" for item in report["findings"])


@pytest.mark.parametrize("argv, shown", [
    (["accelerate", "launch", "--num_processes", "2", "train.py", "--lr", "1"],
     "accelerate launch --num_processes 2 -m stepscope run train.py --lr 1"),
    (["torchrun", "--nproc_per_node=2", "train.py"], "torchrun --nproc_per_node=2 -m stepscope run train.py"),
    (["-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"],
     "torchrun --nproc_per_node 2 -m stepscope run train.py"),
    (["deepspeed", "train.py"], "deepspeed --module stepscope run train.py"),
])
def test_a_launcher_as_the_script_is_refused_with_the_right_command(tmp_path, argv, shown):
    result = run_cli(["run", "--no-monitor", "-o", "out", *argv], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepscope: error: ")
    assert shown in lines[0]
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_accelerate_prepared_loader_reports_its_batch_size_and_samples(tmp_path):
    pytest.importorskip("accelerate")
    result, record = run(tmp_path, "accelerate_train.py")
    assert "steps=20" in result.stdout
    assert record.meta.step_source == "optimizer"
    assert len(record.steps) == 20
    assert record.loaders[0].batch_size == 32
    report = report_json(tmp_path)
    assert report["summary"]["samples_per_step"] == 32
    steady = report["summary"]["steady_state"]
    # the prepared loader fetches one batch ahead: samples/s counts every fetched batch once
    assert steady["samples_per_s"] == pytest.approx(steady["steps_per_s"] * 32, rel=0.2)


def test_hf_trainer_with_language_modeling_collator_counts_samples(tmp_path):
    """A BatchEncoding (a Mapping, not a dict) from DataCollatorForLanguageModeling."""
    pytest.importorskip("transformers")
    result, record = run(tmp_path, "hf_trainer.py", str(tmp_path / "hf-out"))
    assert "done" in result.stdout
    assert record.meta.step_source == "optimizer"
    assert len(record.steps) == 24  # 192 examples / batch 8
    assert record.loaders[0].batch_size == 8
    assert (record.steps.samples[record.steps.batches > 0] > 0).all()
    report = report_json(tmp_path)
    assert report["summary"]["samples_per_step"] == 8
    steady = report["summary"]["steady_state"]
    assert steady["samples_per_s"] == pytest.approx(steady["steps_per_s"] * 8, rel=0.2)
    assert "samples/s · batch 8" in flat(result.stderr)
