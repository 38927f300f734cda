"""Re-record the small CPU traces in this folder (needs torch; run from this folder).

    python record.py

Writes ``cpu_train.pt.trace.json.gz`` (tiny MLP training loop with a DataLoader, 4 profiled
steps, shapes, memory and Python stacks) and ``cpu_plain.pt.trace.json`` (no schedule, no
ProfilerStep, uncompressed).
"""

from __future__ import annotations

import gzip
import os
import shutil

import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset


def train_trace(out: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,)))
    loader = DataLoader(data, batch_size=32)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=4, repeat=1),
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
    ) as prof:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    tmp = out + ".tmp.json"
    prof.export_chrome_trace(tmp)
    with open(tmp, "rb") as src, gzip.open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(tmp)


def plain_trace(out: str) -> None:
    x = torch.randn(128, 128)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            x = torch.tanh(x @ x.T / 128)
    prof.export_chrome_trace(out)


if __name__ == "__main__":
    train_trace("cpu_train.pt.trace.json.gz")
    plain_trace("cpu_plain.pt.trace.json")
