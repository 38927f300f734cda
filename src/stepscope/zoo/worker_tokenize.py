"""Planted bottleneck: a slow pure-Python function in the Dataset's ``__getitem__``, in 2 workers.

Each sample "tokenizes" a generated text of 12,000 characters with a Python comprehension
(``tokenize()``, a few ms of pure Python), in two DataLoader workers. The model needs about a
millisecond, so the step waits for data — and the time is spent in the workers, on the one line of
``tokenize()``: the line code attribution must name.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from stepscope.zoo._common import SeededDataset, parse_args, report, train

FEATURES = 64
VOCAB = 4096
TEXT_CHARS = 12_000
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz    ", dtype=np.uint8)


def tokenize(text: str) -> list[int]:
    """Hash every character with its position: the planted pure-Python hot line."""
    return [(ord(char) * 2654435761 + index * 40503) % VOCAB for index, char in enumerate(text)]  # HOT


class TextDataset(SeededDataset):
    def __getitem__(self, index: int):
        rng = np.random.default_rng(self.sample_seed(index))
        text = LETTERS[rng.integers(0, len(LETTERS), TEXT_CHARS)].tobytes().decode()
        counts = np.bincount(tokenize(text), minlength=VOCAB)[:FEATURES].astype(np.float32)
        features = torch.from_numpy(counts / 10.0)
        return features, features[:8].mean(dim=0, keepdim=True)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=60, batch_size=8)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # the two workers get the cores: no oversubscription planted here
    workers = 2 if args.num_workers is None else args.num_workers
    loader = DataLoader(TextDataset(args.steps * args.batch_size, args.seed), batch_size=args.batch_size,
                        shuffle=True, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    report(train(model, loader, args.steps, lr=0.01))


if __name__ == "__main__":
    main()
