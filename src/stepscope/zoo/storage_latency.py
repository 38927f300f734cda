"""Planted bottleneck: input pipeline blocked on storage latency (the CPU is idle).

Each ``__getitem__`` fetches its sample from a slow "remote store": the call blocks for a few
milliseconds per sample (the latency of an object store or a network filesystem) and then does
almost no work. ``num_workers=0``, so the training process sleeps through every fetch while its
cores stay idle; adding cores would not help, overlapping the waits would.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch.utils.data import DataLoader

from stepscope.zoo._common import SeededDataset, parse_args, report, train

FEATURES = 64
#: Per-sample latency of the simulated remote store.
LATENCY_S = 0.004


class RemoteDataset(SeededDataset):
    """Samples behind a store that answers each request after ``LATENCY_S``."""

    def __getitem__(self, index: int):
        time.sleep(LATENCY_S)  # the request's round trip; the process is blocked, not computing
        rng = np.random.default_rng(self.sample_seed(index))
        features = torch.from_numpy(rng.standard_normal(FEATURES).astype(np.float32))
        return features, features[:8].mean(dim=0, keepdim=True)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=40, batch_size=8)
    torch.manual_seed(args.seed)
    workers = 0 if args.num_workers is None else args.num_workers
    loader = DataLoader(RemoteDataset(args.steps * args.batch_size, args.seed), batch_size=args.batch_size,
                        shuffle=True, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    report(train(model, loader, args.steps, lr=0.01))


if __name__ == "__main__":
    main()
