"""Planted bottleneck: compile time dominates a short job.

The same healthy compiled MLP as ``compile-healthy``, but a job of 20 steps — a smoke test, an
evaluation pass, a short fine-tune: compiling takes most of its time and never pays back.
"""

from __future__ import annotations

import torch

from stepscope.zoo._common import in_memory_loader, mlp, parse_args, report, train

FEATURES = 256


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=20, batch_size=128)
    torch.manual_seed(args.seed)
    loader = in_memory_loader(args, FEATURES, whole_batches=True)
    model = torch.compile(mlp(FEATURES, 512), backend="aot_eager")
    report(train(model, loader, args.steps, lr=0.01))


if __name__ == "__main__":
    main()
