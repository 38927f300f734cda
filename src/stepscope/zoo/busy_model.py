"""Planted bottleneck: none — a model that keeps every core busy, beside a light loader.

The trap this scenario guards: the step waits a few percent of its time for data that the main
process prepares (``num_workers=0``: a small per-sample NumPy transform), while the model's wide
matmuls already use every core through torch's intra-op threads. A rule that only looks at the
data wait prescribes DataLoader workers and fewer intra-op threads — and on such a machine both
make the run slower (workers take cores the model uses). The right verdict is compute-bound, the
input wait at most a minor finding, and no worker or thread prescription.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from stepscope.zoo._common import SeededDataset, mlp, parse_args, report, train

FEATURES = 512
HIDDEN = 4096


class LightDataset(SeededDataset):
    """A few microseconds of NumPy per sample on rows generated once: a light, real per-sample cost."""

    def __init__(self, length: int, seed: int):
        super().__init__(length, seed)
        self.rows = np.random.default_rng(seed).standard_normal((256, FEATURES)).astype(np.float32)

    def __getitem__(self, index: int):
        raw = self.rows[index % len(self.rows)]
        features = torch.from_numpy(np.tanh(raw) * 0.5 + raw * 0.5)
        return features, features[:1] * 0.5


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=30, batch_size=128)
    torch.manual_seed(args.seed)
    workers = 0 if args.num_workers is None else args.num_workers
    loader = DataLoader(LightDataset(args.steps * args.batch_size, args.seed), batch_size=args.batch_size,
                        shuffle=True, num_workers=workers)
    report(train(mlp(FEATURES, HIDDEN), loader, args.steps, lr=0.01))


if __name__ == "__main__":
    main()
