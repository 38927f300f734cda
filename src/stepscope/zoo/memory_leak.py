"""Planted bottleneck: memory pressure (a leak of retained tensors).

A compute-bound MLP trains normally, but the loop keeps every step's output and a copy of each
input-sized buffer "for later metrics" in a list that is never cleared: resident memory grows by
about 4 MiB per step, steadily, until the machine would run out. A leak is a trend over time: the
run is long enough (~1.5 s of steps here) for the 10 Hz sampler to draw it from a dozen points.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from stepscope.zoo._common import parse_args, report

FEATURES = 512
HIDDEN = 1024
#: Floats retained per step on top of the outputs (4 MiB).
RETAINED = 2**20


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=100, batch_size=128)
    torch.manual_seed(args.seed)
    inputs = torch.randn(args.steps * args.batch_size, FEATURES)
    loader = DataLoader(TensorDataset(inputs, inputs[:, :1] * 0.5), batch_size=args.batch_size, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss()
    history = []  # the leak: never cleared
    losses: list[float] = []
    for batch, target in loader:
        optimizer.zero_grad(set_to_none=True)
        output = model(batch)
        loss = loss_fn(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        history.append((output.detach(), torch.ones(RETAINED)))  # written, so resident: the leak
        if len(losses) >= args.steps:
            break
    report(losses)


if __name__ == "__main__":
    main()
