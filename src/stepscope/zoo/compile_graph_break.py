"""Planted bottleneck: a graph break in a compiled forward — a Python branch on ``tensor.item()``.

``forward`` asks for the mean activation as a Python number and branches on it: dynamo cannot
trace ``.item()``, so it splits the frame into two graphs, runs the branch eagerly (waiting for
the value), and compiles the code after the break again for the values it specialises on.
"""

from __future__ import annotations

import torch
from torch import nn

from stepscope.zoo._common import parse_args, report


class BranchyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if h.mean().item() > 0.2:  # the planted data-dependent branch: a graph break
            h = h * 2
        return self.b(h)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=60, batch_size=32)
    torch.manual_seed(args.seed)
    model = torch.compile(BranchyModel(), backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses: list[float] = []
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, 64)
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    report(losses)


if __name__ == "__main__":
    main()
