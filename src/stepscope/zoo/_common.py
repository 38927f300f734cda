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
