"""Planted bottleneck: a periodic stall (a synchronous checkpoint every 5 steps).

A compute-bound MLP (large enough batches for a good MFU, so the stall is the only problem) trains
from in-memory tensors fetched a batch at a time, and every ``--every`` steps the loop saves the
model and optimizer state with ``torch.save`` to a file and flushes it to disk — on the training
step's critical path, outside forward, backward and the optimizer.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from stepscope.zoo._common import in_memory_loader, mlp

FEATURES = 512
HIDDEN = 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    loader = in_memory_loader(args, FEATURES, whole_batches=True)
    model = mlp(FEATURES, HIDDEN)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    losses: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "checkpoint.pt")
        for step, (batch, target) in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(batch), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if (step + 1) % args.every == 0:
                with open(path, "wb") as handle:  # the planted stall
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, handle)
                    handle.flush()
                    os.fsync(handle.fileno())
            if len(losses) >= args.steps:
                break
    print(f"steps={len(losses)} first_loss={losses[0]:.6f} last_loss={losses[-1]:.6f}")


if __name__ == "__main__":
    main()
