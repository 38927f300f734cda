"""A generated training workload for the worker-plan calibration: fixed pure-Python work per
sample in ``__getitem__`` (``--load-iters``), a model of ``--hidden`` units on ``--threads``
intra-op threads, ``num_workers=0`` (trials change it with ``stepscope run --set``).

The per-sample work is a fixed count of iterations, not a duration, so a starved loader takes
longer, as real loading does.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, Dataset


class Work(Dataset):
    def __init__(self, length: int, iterations: int):
        self.length, self.iterations = length, iterations

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        value = index
        for step in range(self.iterations):  # the loading work: pure Python, one core
            value = (value * 31 + step) % 1_000_003
        x = torch.full((64,), float(value % 7))
        return x, x[:1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load-iters", type=int, default=20_000)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    loader = DataLoader(Work(args.steps * args.batch_size, args.load_iters // args.batch_size),
                        batch_size=args.batch_size, num_workers=0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for inputs, targets in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()


if __name__ == "__main__":
    main()
