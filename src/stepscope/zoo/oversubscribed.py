"""Planted bottleneck: CPU oversubscription (workers × threads far above the cores).

Four DataLoader workers each raise their torch intra-op threads to four (a ``worker_init_fn``)
and run a multi-threaded matrix "augmentation" per sample, while the training process keeps its
own intra-op threads: on a 2-core machine about twenty threads fight for two cores. The step
waits for data — but the cure is fewer threads, not more workers.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from stepscope.zoo._common import SeededDataset, parse_args, report, train

FEATURES = 64
WORKER_THREADS = 4
MATRIX = 192


class MatrixAugmented(SeededDataset):
    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(self.sample_seed(index))
        matrix = torch.randn(MATRIX, MATRIX, generator=generator)
        for _ in range(6):  # multi-threaded in each worker
            matrix = torch.tanh(matrix @ matrix.T / MATRIX)
        features = matrix[0, :FEATURES].clone()
        return features, features[:8].mean(dim=0, keepdim=True)


def use_threads(_worker_id: int) -> None:
    torch.set_num_threads(WORKER_THREADS)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=80, batch_size=8)  # ~1 s of steps: ~18 samples at 10 Hz
    torch.manual_seed(args.seed)
    workers = 4 if args.num_workers is None else args.num_workers
    loader = DataLoader(MatrixAugmented(args.steps * args.batch_size, args.seed), batch_size=args.batch_size,
                        shuffle=True, num_workers=workers, worker_init_fn=use_threads)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    report(train(model, loader, args.steps, lr=0.01))


if __name__ == "__main__":
    main()
