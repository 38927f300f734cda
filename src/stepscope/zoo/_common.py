"""Helpers shared by zoo scripts (plain PyTorch; nothing here knows about stepscope)."""

from __future__ import annotations

import argparse

from torch.utils.data import Dataset


class SeededDataset(Dataset):
    """``length`` samples, each generated deterministically from ``seed`` and its index."""

    def __init__(self, length: int, seed: int):
        self.length = length
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def sample_seed(self, index: int) -> int:
        return self.seed * 1_000_003 + index


def parse_args(description: str, steps: int, batch_size: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps to run")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=None, help="override the planted setting")
    return parser.parse_args()


def in_memory_loader(args: argparse.Namespace, features: int, *, whole_batches: bool = False):
    """Random inputs held in memory (target: half the first feature), as a DataLoader.

    ``whole_batches`` indexes the dataset a batch at a time (a ``BatchSampler`` as the sampler,
    ``batch_size=None``): one gather per batch instead of collating samples one by one.
    """
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    inputs = torch.randn(args.steps * args.batch_size, features)
    dataset = TensorDataset(inputs, inputs[:, :1] * 0.5)
    workers = getattr(args, "num_workers", None) or 0
    if whole_batches:
        batches = BatchSampler(RandomSampler(dataset), batch_size=args.batch_size, drop_last=False)
        return DataLoader(dataset, sampler=batches, batch_size=None, num_workers=workers)
    return DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=workers)


def mlp(features: int, hidden: int):
    """Two hidden layers of ``hidden`` units, one output."""
    import torch

    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))


def train(model, loader, steps: int, lr: float = 0.05) -> list[float]:
    """A plain training loop; returns the losses so runs can be compared bit for bit."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.MSELoss()
    losses: list[float] = []
    while len(losses) < steps:
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) >= steps:
                break
    return losses


def report(losses: list[float]) -> None:
    print(f"steps={len(losses)} first_loss={losses[0]:.6f} last_loss={losses[-1]:.6f}")
