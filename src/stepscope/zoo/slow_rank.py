"""Planted bottleneck: one slow rank whose extra time is outside the model.

Two ranks train a small MLP under DistributedDataParallel on in-memory batches; after every
optimizer step rank 1 also runs a per-rank chore that blocks for ~20 ms (``rank_chore()``: a
stand-in for synchronous logging to a remote tracker, a per-rank evaluation or a metrics upload).
Rank 0 has nothing to do there and waits for rank 1 in the next step's gradient all-reduce: its
time is "communication", but the cause is rank 1's own work, which no bucket size or compression
changes. Run it under torchrun (``stepscope demo slow-rank`` does).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from stepscope.zoo._common import in_memory_loader, mlp, parse_args, report

FEATURES = 64
SLOW_RANK = 1
CHORE_S = 0.020


def rank_chore(rank: int) -> None:
    if rank == SLOW_RANK:
        time.sleep(CHORE_S)  # the planted per-rank work: a blocking upload, say


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=40, batch_size=16)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    loader = in_memory_loader(args, FEATURES)
    model = DistributedDataParallel(mlp(FEATURES, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses: list[float] = []
    for inputs, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        rank_chore(rank)
        losses.append(loss.item())
    if rank == 0:
        report(losses)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
