"""Planted bottleneck: compute-bound at very low efficiency (tiny batches on wide layers).

A wide MLP trains with a batch of one sample: every matmul is a matrix–vector product that
streams the whole weight matrix from memory for very little arithmetic, so the cores are busy but
reach a small fraction of their matmul peak (low MFU). Data come from memory; there are few,
large operators per step (no launch overhead). One sample, not two: with two, a 2-core machine whose
second thread adds a quarter to the matmul peak read 8.5-9.6 % MFU, within the uncertainty of the
10 % line (a borderline note, not a finding); one sample reads 5.9 % there.
"""

from __future__ import annotations

import torch

from stepscope.zoo._common import in_memory_loader, mlp, parse_args, report, train

FEATURES = 1024
HIDDEN = 2048


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=40, batch_size=1)
    torch.manual_seed(args.seed)
    loader = in_memory_loader(args, FEATURES)
    model = mlp(FEATURES, HIDDEN)
    report(train(model, loader, args.steps, lr=0.001))


if __name__ == "__main__":
    main()
