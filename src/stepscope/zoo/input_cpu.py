"""Planted bottleneck: input pipeline, CPU-bound.

Each ``__getitem__`` runs a NumPy "augmentation" (sorting and smoothing a few tens of thousands
of values: milliseconds of CPU) and the DataLoader uses ``num_workers=0``, so the main process
does it while the model waits. The model itself is a small MLP that needs about a millisecond.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from stepscope.zoo._common import SeededDataset, parse_args, report, train

FEATURES = 64


class AugmentedDataset(SeededDataset):
    def __getitem__(self, index: int):
        rng = np.random.default_rng(self.sample_seed(index))
        raw = rng.standard_normal(30_000)
        for _ in range(3):  # the expensive, single-threaded part
            raw = np.sort(raw)[::-1] * 0.999 + np.convolve(raw, np.ones(5) / 5, mode="same") * 0.001
        features = torch.from_numpy(raw[:FEATURES].astype(np.float32))
        return features, features[:8].mean(dim=0, keepdim=True)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=40, batch_size=8)
    torch.manual_seed(args.seed)
    workers = 0 if args.num_workers is None else args.num_workers
    loader = DataLoader(AugmentedDataset(args.steps * args.batch_size, args.seed),
                        batch_size=args.batch_size, shuffle=True, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    report(train(model, loader, args.steps, lr=0.01))


if __name__ == "__main__":
    main()
