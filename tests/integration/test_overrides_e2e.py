"""`stepscope run --set … --max-steps N` on unmodified scripts: the settings reach the script."""

from __future__ import annotations

import pytest
from support import run_cli, write_script

from stepscope.record.store import load_record

pytestmark = pytest.mark.slow

TRAIN = """
    import os
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Pids(Dataset):
        def __len__(self):
            return 4000

        def __getitem__(self, index):
            return torch.tensor([float(os.getpid())]), torch.zeros(1)

    print("threads-at-start", torch.get_num_threads())
    torch.set_num_threads(2)  # the script's own choice: the override keeps 1
    print("threads-after-set", torch.get_num_threads())
    loader = DataLoader(Pids(), batch_size=4, num_workers=0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    pids = set()
    try:
        for step, (inputs, targets) in enumerate(loader):
            pids.update(int(value) for value in inputs.flatten().tolist())
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs * 0), targets).backward()
            optimizer.step()
            print("step", step, flush=True)
    finally:
        print("loader-pids", len(pids - {os.getpid()}), "main-loaded", os.getpid() in pids)
        print("finally ran")
"""


def test_workers_threads_and_max_steps_reach_the_script(tmp_path):
    write_script(tmp_path, "train.py", TRAIN)
    result = run_cli(["run", "--no-monitor", "--stacks-hz", "0", "-o", "out",
                      "--set", "dataloader.num_workers=2", "--set", "torch.num_threads=1",
                      "--set", "dataloader.persistent_workers=true", "--max-steps", "12", "train.py"],
                     tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "threads-at-start 1" in out and "threads-after-set 1" in out
    assert "loader-pids 2 main-loaded False" in out  # two worker processes loaded every batch
    assert "finally ran" in out and "step 11\n" in out and "step 12\n" not in out
    summary = " ".join(result.stderr.replace("│", " ").split())  # the panel's lines, unwrapped
    assert "Overridden dataloader.num_workers=2 (1 loader) · torch.num_threads=1 [1 note(s) in the record]" in summary
    assert "stopped after 12 steps (--max-steps)" in summary
    record = load_record(tmp_path / "out", with_samples=False)
    assert len(record.steps) == 12 and record.meta.exit_code == 0
    loader, = record.loaders
    assert loader.num_workers == 2 and len(set(loader.worker_pids)) == 2 and loader.persistent_workers
    assert record.meta.intra_op_threads == 1
    overrides = record.facts.overrides
    assert overrides.max_steps == 12 and overrides.stopped_at_max_steps
    settings = {item.key: item for item in overrides.settings}
    assert settings["dataloader.num_workers"].value == 2 and settings["dataloader.num_workers"].applied == 1
    assert settings["torch.num_threads"].skipped == ("the script's torch.set_num_threads(2) replaced by 1",)


INFERENCE = """
    import torch
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    data = list(range(1000))
    loader = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 4, drop_last=False))
    for index, batch in enumerate(loader):
        print("batch", index, len(batch), flush=True)
"""


def test_batch_size_through_a_batch_sampler_and_max_steps_without_optimizer(tmp_path):
    write_script(tmp_path, "infer.py", INFERENCE)
    result = run_cli(["run", "--no-monitor", "--stacks-hz", "0", "--no-summary", "-o", "out",
                      "--set", "dataloader.batch_size=10", "--max-steps", "5", "infer.py"], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"batch {index} 10" for index in range(5)]
    record = load_record(tmp_path / "out", with_samples=False)
    assert len(record.steps) == 5 and record.facts.overrides.stopped_at_max_steps
    assert record.loaders[0].batch_size is None or record.steps.samples.tolist() == [10] * 5
