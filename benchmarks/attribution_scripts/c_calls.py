"""A training loop whose time outside the model goes into calls to C: JSON, zlib, re, NumPy.

Each step serialises a metrics record with ``json.dumps``, compresses it with ``zlib``
(``archive_metrics()``: the largest share), scans a log line with a regular expression and sorts a
NumPy array — all C code under one Python line each, the case where a signal-based sampler must
charge the C call to the line that made it.
"""

from __future__ import annotations

import json
import sys
import re
import zlib

import numpy as np
import torch

PATTERN = re.compile(r"(\w+)=(\d+\.\d+)")


def archive_metrics(record: dict) -> bytes:
    return zlib.compress(json.dumps(record).encode() * 8, 9)


def scan_log(line: str) -> int:
    return len(PATTERN.findall(line))


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    line = " ".join(f"metric{i}={i * 0.5:.3f}" for i in range(400))
    for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 300):
        x = torch.randn(64, 64)
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        record = {"step": step, "loss": float(loss), "values": rng.standard_normal(400).tolist()}
        archive_metrics(record)
        scan_log(line)
        np.sort(rng.standard_normal(20_000))
    print("done", float(loss))


if __name__ == "__main__":
    main()
