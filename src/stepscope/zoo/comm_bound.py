"""Planted bottleneck: communication-bound DDP (a wide model, a tiny batch, 2 gloo processes).

Two ranks train a wide MLP under DistributedDataParallel with a batch of one sample per rank: the
forward and backward of one sample take a millisecond or two, while every step all-reduces ~13 MB of
gradients over gloo (TCP on this machine), so most of the step waits in the all-reduce after
backward. Run it under torchrun (``stepscope demo comm-bound`` does). One sample, not two: with two,
a slower 2-core machine measured 30-35 % of the step in the all-reduce, at the 30 % line; one
sample reads 37-44 % there.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from stepscope.zoo._common import in_memory_loader, mlp, parse_args, report, train

FEATURES = 512
HIDDEN = 1536


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=30, batch_size=1)
    dist.init_process_group("gloo")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    loader = in_memory_loader(args, FEATURES)
    model = DistributedDataParallel(mlp(FEATURES, HIDDEN))
    losses = train(model, loader, args.steps, lr=0.001)
    if dist.get_rank() == 0:
        report(losses)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
