"""Healthy: a compiled MLP, one graph, compiled once, trained long enough to amortise it (200 steps).

Fixed shapes, no data-dependent Python: dynamo captures the forward once (backend ``eager``: its
graph capture and guards without code generation, so it compiles in a fraction of a second) and
every later step runs the captured graph. The compile time is a small share of the run: a LOW
note at most.
"""

from __future__ import annotations

import torch

from stepscope.zoo._common import in_memory_loader, mlp, parse_args, report, train

FEATURES = 256


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=200, batch_size=128)
    torch.manual_seed(args.seed)
    loader = in_memory_loader(args, FEATURES, whole_batches=True)
    model = torch.compile(mlp(FEATURES, 1024), backend="eager")  # dynamo's graph capture, no code generation
    report(train(model, loader, args.steps, lr=0.01))


if __name__ == "__main__":
    main()
