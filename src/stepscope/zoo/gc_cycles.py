"""Planted bottleneck: garbage-collector pauses on a growing graph of small cyclic objects.

Every step appends a few thousand small objects that point at each other (parent ↔ child cycles)
to a cache that is never pruned, and drops as many again as unreachable cycles. The cyclic
collector runs often (young generations fill with every step's objects) and each full collection
walks the whole, ever larger, cache: pauses take a material share of the step, and the largest
ones grow as the run goes on.
"""

from __future__ import annotations

import torch

from stepscope.zoo._common import in_memory_loader, mlp, parse_args

FEATURES = 64
NODES_PER_STEP = 1500


class Node:
    def __init__(self, parent: Node | None, value: int):
        self.parent = parent
        self.children: list[Node] = []
        self.value = value
        if parent is not None:
            parent.children.append(self)  # a reference cycle: parent <-> child


def grow(cache: list[Node], step: int) -> None:
    root = Node(None, step)
    for index in range(NODES_PER_STEP):
        Node(root, index)  # kept: the cache grows by a whole tree per step
    cache.append(root)
    garbage = Node(None, -step)
    for index in range(NODES_PER_STEP):
        Node(garbage, index)  # dropped at return: unreachable cycles for the collector


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=60, batch_size=32)
    torch.manual_seed(args.seed)
    loader = in_memory_loader(args, FEATURES)
    model = mlp(FEATURES, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    cache: list[Node] = []
    losses = []
    for step, (inputs, targets) in enumerate(loader):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        grow(cache, step)
        losses.append(loss.item())
    print(f"steps={len(losses)} first_loss={losses[0]:.6f} last_loss={losses[-1]:.6f} cached={len(cache)}")


if __name__ == "__main__":
    main()
