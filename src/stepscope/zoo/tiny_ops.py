"""Planted bottleneck: launch / framework overhead (hundreds of tiny operators per step).

The model is a deep stack of 16-wide layers applied to a batch of 8: each operator does a few
thousand FLOPs, far less than the fixed cost of dispatching it (Python, the dispatcher, autograd
bookkeeping). Forward, backward and optimizer run thousands of such operators per step.
"""

from __future__ import annotations

import torch

from stepscope.zoo._common import in_memory_loader, parse_args, report, train

WIDTH = 16
DEPTH = 150


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=40, batch_size=8)
    torch.manual_seed(args.seed)
    loader = in_memory_loader(args, WIDTH)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1))
    report(train(model, loader, args.steps, lr=0.001))


if __name__ == "__main__":
    main()
