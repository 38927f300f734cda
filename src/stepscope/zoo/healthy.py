"""Planted bottleneck: none (compute-bound and healthy).

Batches come from an in-memory ``TensorDataset`` indexed a whole batch at a time (a
``BatchSampler`` as the sampler, ``batch_size=None``: one gather instead of collating samples), so
fetching one costs microseconds; the step is dominated by the matmuls of a wide MLP.
"""

from __future__ import annotations

import torch

from stepscope.zoo._common import in_memory_loader, mlp, parse_args, report, train

FEATURES = 512
HIDDEN = 2048


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=40, batch_size=128)
    torch.manual_seed(args.seed)
    loader = in_memory_loader(args, FEATURES, whole_batches=True)
    model = mlp(FEATURES, HIDDEN)
    report(train(model, loader, args.steps, lr=0.01))


if __name__ == "__main__":
    main()
