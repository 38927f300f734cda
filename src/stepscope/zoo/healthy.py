"""Planted bottleneck: none (compute-bound and healthy).

Batches come from an in-memory ``TensorDataset`` indexed a whole batch at a time (a
``BatchSampler`` as the sampler, ``batch_size=None``: one gather instead of collating samples), so
fetching one costs microseconds; the step is dominated by the matmuls of a wide MLP.
"""

from __future__ import annotations

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from stepscope.zoo._common import parse_args, report, train

FEATURES = 512
HIDDEN = 2048


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=40, batch_size=128)
    torch.manual_seed(args.seed)
    inputs = torch.randn(args.steps * args.batch_size, FEATURES)
    targets = inputs[:, :1] * 0.5
    dataset = TensorDataset(inputs, targets)
    batches = BatchSampler(RandomSampler(dataset), batch_size=args.batch_size, drop_last=False)
    loader = DataLoader(dataset, sampler=batches, batch_size=None,
                        num_workers=0 if args.num_workers is None else args.num_workers)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 1),
    )
    report(train(model, loader, args.steps, lr=0.01))


if __name__ == "__main__":
    main()
