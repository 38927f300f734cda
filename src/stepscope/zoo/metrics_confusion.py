"""Planted bottleneck: a per-step metrics function in pure Python, outside the model.

After every optimizer step the loop updates a 50×50 confusion matrix and the predictions per
class with Python loops over the batch's predictions and the classes (``update_confusion()``:
~25,600 iterations, 1.3–1.8× as long as forward, backward and the SGD step together: with one pass,
as long as them, the tiny model's own overhead ranked first in some runs). The time is in the
"other" phase, inside ``update_confusion()``; the call site in ``main()`` only converts two small
tensors to lists.
"""

from __future__ import annotations

import torch
from torch import nn

from stepscope.zoo._common import parse_args, report

CLASSES = 50
FEATURES = 32


def update_confusion(confusion: list[list[int]], predictions: list[int], labels: list[int]) -> None:
    for predicted, label in zip(predictions, labels):
        for klass in range(CLASSES):  # the planted pure-Python work: the matrix's row ...
            if klass == label:
                confusion[label][predicted] += 1
        for klass in range(CLASSES):  # ... and the predictions per class (its last row: precision)
            if klass == predicted:
                confusion[CLASSES][klass] += 1


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=400, batch_size=256)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    confusion = [[0] * CLASSES for _ in range(CLASSES + 1)]
    inputs = torch.randn(args.steps * args.batch_size, FEATURES)
    labels = torch.randint(0, CLASSES, (args.steps * args.batch_size,))
    losses: list[float] = []
    for step in range(args.steps):
        batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
        x, y = inputs[batch], labels[batch]
        optimizer.zero_grad()
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        update_confusion(confusion, logits.argmax(1).tolist(), y.tolist())
        losses.append(loss.item())
    report(losses)


if __name__ == "__main__":
    main()
