"""Planted bottleneck: torch.compile recompiling for every sequence length, then giving up.

A token model is compiled with ``dynamic=False`` and fed batches whose sequence length changes
every step (a text loader without bucketing): each new length fails a shape guard and compiles
the forward again, until the frame hits ``torch._dynamo.config.recompile_limit`` (8) and runs
eager for every new length — while the script still looks compiled. Backend ``aot_eager`` (the
backend does not matter here, and it compiles fast).
"""

from __future__ import annotations

import random

import torch
from torch import nn

from stepscope.zoo._common import parse_args, report

VOCAB = 1000


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.head = nn.Linear(32, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens).mean(dim=1))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=30, batch_size=8)
    torch.manual_seed(args.seed)
    lengths = random.Random(args.seed)
    model = torch.compile(TokenModel(), dynamic=False, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses: list[float] = []
    for _ in range(args.steps):
        tokens = torch.randint(0, VOCAB, (args.batch_size, lengths.randint(16, 160)))  # the planted variety
        optimizer.zero_grad()
        loss = model(tokens).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    report(losses)


if __name__ == "__main__":
    main()
