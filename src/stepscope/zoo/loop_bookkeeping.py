"""Planted bottleneck: pure-Python bookkeeping in the training loop, outside the model.

After every optimizer step the loop builds a dict of per-parameter metrics by converting each
parameter to a Python list and summing its squares in a generator (``step_metrics()``: ~10 ms
of pure Python for ~83k values), while the model's forward, backward and SGD step take about a
millisecond. The step's time is in the "other" phase, on that one line.
"""

from __future__ import annotations

import torch

from stepscope.zoo._common import in_memory_loader, mlp, parse_args

FEATURES = 64
HIDDEN = 256


def step_metrics(model: torch.nn.Module, loss: float) -> dict[str, float]:
    """Per-parameter sums of squares, in pure Python: the planted hot line."""
    metrics = {"loss": loss}
    for name, param in model.named_parameters():
        metrics[name] = sum(value * value for value in param.detach().flatten().tolist())  # HOT
    return metrics


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=80, batch_size=32)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # the model's share stays small and steady on a busy machine
    loader = in_memory_loader(args, FEATURES)
    model = mlp(FEATURES, HIDDEN)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    history: list[dict[str, float]] = []
    for inputs, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        history.append(step_metrics(model, loss.item()))
    print(f"steps={len(history)} first_loss={history[0]['loss']:.6f} last_loss={history[-1]['loss']:.6f}")


if __name__ == "__main__":
    main()
