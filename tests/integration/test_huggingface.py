"""Hugging Face Trainer and Accelerate, real libraries, tiny models built from configs (no downloads)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from support import run_cli, run_python, write_script
from stepscope.record.store import load_record

#: The scripts import them, not this module (importing Accelerate here would cost every collection ~2 s).
MISSING = [name for name in ("transformers", "accelerate") if importlib.util.find_spec(name) is None]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed")]

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

TRAINER = """
    import sys, torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    callbacks = []
    if "--callback" in sys.argv:
        from stepscope.integrations.huggingface import StepscopeCallback
        callbacks.append(StepscopeCallback("cb-out", summary=False))
    args = TrainingArguments(output_dir="hf-out", per_device_train_batch_size=4, max_steps=12, use_cpu=True,
                             report_to=[], logging_strategy="no", save_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Data(), callbacks=callbacks).train()
"""

ACCELERATE = """
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(160, 16), torch.randn(160, 1)), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    print("rank", accelerator.process_index, type(model).__name__)
"""


def _phases_seen(record) -> None:
    steps = record.steps
    assert steps.forward_ns.sum() > 0 and steps.backward_ns.sum() > 0 and steps.optimizer_ns.sum() > 0
    assert record.loaders and record.loaders[0].batch_size in (4, 8)


def test_unmodified_trainer_script(tmp_path):
    write_script(tmp_path, "train.py", TRAINER)
    result = run_cli(["run", "--no-monitor", "--stacks-hz", "0", "-o", "out", "train.py"], tmp_path, env=OFFLINE)
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_record(tmp_path / "out")
    assert record.meta.step_source == "optimizer" and len(record.steps) == 12
    _phases_seen(record)


def test_trainer_callback_captures_without_stepscope_run(tmp_path):
    write_script(tmp_path, "train.py", TRAINER)
    result = run_python(["train.py", "--callback"], tmp_path, env=OFFLINE)
    assert result.returncode == 0, result.stderr[-3000:]
    record = load_record(tmp_path / "cb-out")
    assert len(record.steps) >= 11  # on_step_end marks each optimizer step
    _phases_seen(record)
    assert (tmp_path / "cb-out" / "report.json").is_file()


def test_accelerate_launch_two_cpu_processes(tmp_path):
    write_script(tmp_path, "loop.py", ACCELERATE)
    # accelerate launch runs multi-process jobs through torchrun (its multi_gpu launcher); the
    # script's Accelerator(cpu=True) keeps them on the CPU with gloo
    result = run_python(["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                         "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                         "-m", "stepscope", "run", "--stacks-hz", "0", "-o", "out", "loop.py"], tmp_path, env=OFFLINE, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DistributedDataParallel" in result.stdout
    for rank in (0, 1):
        record = load_record(tmp_path / "out", rank)
        assert record.meta.world_size == 2 and len(record.steps) == 10
        _phases_seen(record)
        assert record.steps.communication_ns.sum() > 0  # DDP's all-reduce, through Accelerate's DDP
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [row["rank"] for row in report["job"]["ranks"]] == [0, 1]
