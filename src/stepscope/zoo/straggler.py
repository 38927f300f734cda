"""Planted bottleneck: a straggler — rank 1's data loading is slow, rank 0 waits for it in DDP.

Two ranks train a small MLP under DistributedDataParallel; rank 1's dataset waits ~5 ms per sample
(a slow shard behind a remote store, num_workers=0), rank 0's answers at once. Rank 0 then spends
most of each step in DDP's gradient all-reduce waiting for rank 1: without per-rank communication
timing it looks like a slow backward. Run it under torchrun (``stepscope demo straggler`` does).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from stepscope.zoo._common import SeededDataset, mlp, parse_args, report, train

FEATURES = 64
SLOW_RANK = 1
FETCH_S = 0.005


class ShardDataset(SeededDataset):
    def __init__(self, length: int, seed: int, delay_s: float):
        super().__init__(length, seed)
        self.delay_s = delay_s

    def __getitem__(self, index: int):
        if self.delay_s:
            time.sleep(self.delay_s)  # the slow shard's round trip
        generator = torch.Generator().manual_seed(self.sample_seed(index))
        x = torch.randn(FEATURES, generator=generator)
        return x, x[:1] * 0.5


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=30, batch_size=8)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    dataset = ShardDataset(args.steps * args.batch_size, args.seed + rank, FETCH_S if rank == SLOW_RANK else 0.0)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers or 0)
    model = DistributedDataParallel(mlp(FEATURES, 256))
    losses = train(model, loader, args.steps, lr=0.01)
    if rank == 0:
        report(losses)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
