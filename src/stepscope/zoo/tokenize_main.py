"""Planted bottleneck: pure-Python tokenising in ``__getitem__``, num_workers=0, on a model that
keeps its intra-op threads busy.

Each sample is a text of ~1,500 words lower-cased, split with a regular expression and hashed
character by character in Python (~1 ms per sample, ~17 ms per batch of 16), in the main process;
the model (an EmbeddingBag and a Linear layer) needs ~3 ms on 2 intra-op threads.
On 2 cores, workers alone barely help: the model's threads and two busy workers fight over the
cores. The change that does help is workers *and* one intra-op thread in the main process — what
``stepscope run --verify`` measures.
"""

from __future__ import annotations

import random
import re
import string

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from stepscope.zoo._common import parse_args, report

VOCAB = 5000
WORDS_PER_TEXT = 1500
_WORD = re.compile(r"\w+")


def vocabulary(seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(3000)]


#: Distinct texts generated up front (samples cycle through them; each is tokenised anew).
TEXTS = 64


class TextDataset(Dataset):
    def __init__(self, length: int, seed: int):
        rng = random.Random(seed + 1)
        words = vocabulary(seed)
        self.length = length
        self.texts = [" ".join(rng.choice(words) for _ in range(WORDS_PER_TEXT)).upper() for _ in range(TEXTS)]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        tokens = [hash_word(word) for word in _WORD.findall(self.texts[index % TEXTS].lower())]
        ids = torch.tensor(tokens[:256] + [0] * (256 - min(len(tokens), 256)))
        return ids, torch.tensor(float(len(tokens) % 2))


def hash_word(word: str) -> int:
    value = 0
    for char in word:  # the planted pure-Python work
        value = (value * 31 + ord(char)) % VOCAB
    return value


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=150, batch_size=16)
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)  # the planted part: the model keeps two intra-op threads
    workers = 0 if args.num_workers is None else args.num_workers
    loader = DataLoader(TextDataset(args.steps * args.batch_size, args.seed), batch_size=args.batch_size,
                        shuffle=True, num_workers=workers)
    model = nn.Sequential(nn.EmbeddingBag(VOCAB, 32), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    losses: list[float] = []
    for ids, targets in loader:
        optimizer.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(ids).squeeze(1), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    report(losses)


if __name__ == "__main__":
    main()
